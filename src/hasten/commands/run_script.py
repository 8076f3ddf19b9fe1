"""Run the user's script (or ``-m`` module) as ``__main__`` inside a worker started by ``hasten launch``.

    python -m hasten.commands.run_script path script.py [args...]
    python -m hasten.commands.run_script module package.module [args...]

The script runs exactly as ``python script.py`` / ``python -m package.module`` would run it (same
``sys.argv``, ``sys.path[0]``, ``__name__``). Two additions:

- an uncaught exception is recorded with torch's ``record`` (``torch.distributed.elastic.multiprocessing.errors``),
  so torchrun's failure summary names the failing rank *with its traceback*;
- the worker ends without the interpreter's final teardown. With gloo and DDP that teardown aborts the process
  now and then ("terminate called without an active exception", SIGABRT — seen with plain PyTorch too), which
  would turn a finished job into a failed one. Everything a normal exit does that users rely on still happens
  first: non-daemon threads are joined, ``atexit`` handlers run (logging is flushed, the process group is
  destroyed), the script's globals are released (open files get flushed and closed) and stdio is flushed;
- on Linux the worker asks the kernel for SIGTERM when the launcher dies (``prctl(PR_SET_PDEATHSIG)``), so a
  launcher killed with SIGKILL (which cannot stop its workers) leaves no worker behind. Other systems have no
  such request: there, stop the workers yourself (``pkill -f hasten.commands.run_script``).

An uncaught exception also records ``time.time()`` in the error file, so the launcher can tell which of two
failures of the same second came first (see ``failure_summary``).
"""
from __future__ import annotations

import atexit
import faulthandler
import gc
import os
import runpy
import sys
import threading
import time
import traceback
import types
import zipfile

_SKIPPED_FILES = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}


def _is_launch_frame(tb) -> bool:
    filename = tb.tb_frame.f_code.co_filename
    return filename.startswith("<frozen runpy") or os.path.abspath(filename) in _SKIPPED_FILES


def _user_frames(tb):
    """The traceback without this runner's and runpy's frames (what ``python script.py`` would show)."""
    while tb is not None and _is_launch_frame(tb):
        tb = tb.tb_next
    return tb


def _record_for_torchrun(error: BaseException) -> None:
    """Write the exception being handled to torchrun's per-worker error file (``TORCHELASTIC_ERROR_FILE``).

    This is what torch's ``@record`` does for an exception; torchrun's failure summary then shows the
    traceback. Called only inside the ``except`` block that caught ``error``.
    """
    when = time.time()
    try:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(error)
    except Exception:  # torch unusable or the file unwritable: the printed traceback is all there is
        return
    _add_precise_time(os.environ.get("TORCHELASTIC_ERROR_FILE"), when)


def _add_precise_time(path, when: float) -> None:
    """Add the failure's sub-second time to the error file torch wrote (its own has whole seconds)."""
    import json

    from hasten.commands.failure_summary import PRECISE_TIME_KEY

    try:
        with open(path) as handle:
            data = json.load(handle)
        data["message"]["extraInfo"][PRECISE_TIME_KEY] = repr(when)
        with open(path + ".tmp", "w") as handle:
            json.dump(data, handle)
        os.replace(path + ".tmp", path)
    except (TypeError, KeyError, ValueError, OSError):  # no file, or not the layout torch writes: keep it as is
        pass


def end_with_the_launcher() -> None:
    """Linux: SIGTERM for this worker when the launcher dies (see ``parent_watch``)."""
    from hasten.commands.parent_watch import LAUNCHER_PID_ENV, end_with_parent
    from hasten.core.env_aliases import get_setting

    expected = str(get_setting(LAUNCHER_PID_ENV, ""))
    end_with_parent(int(expected) if expected.isdigit() else None)


_NAMESPACES: list = []  # the script's globals, released before the worker exits


def run(mode: str, target: str, arguments: list) -> None:
    """Run ``target`` (a file path when ``mode == "path"``, a module name when ``mode == "module"``)."""
    if mode == "module":
        sys.argv = [target, *arguments]  # runpy replaces argv[0] with the module's file
        _NAMESPACES.append(runpy.run_module(target, run_name="__main__", alter_sys=True))
    elif mode == "path":
        sys.argv = [target, *arguments]
        if os.path.isdir(target) or zipfile.is_zipfile(target):
            del sys.path[0]  # runpy puts the folder / archive first, as `python folder` does
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py` does
        _NAMESPACES.append(runpy.run_path(target, run_name="__main__"))
    else:
        raise SystemExit(f"{__name__}: unknown mode {mode!r}; expected 'path' or 'module'.")


def main(argv: list) -> int:
    if len(argv) < 2:
        raise SystemExit(f"usage: python -m {__spec__.name if __spec__ else 'runner'} path|module TARGET [ARGS...]")
    end_with_the_launcher()
    faulthandler.enable(all_threads=True)  # a crash (segfault, abort) still prints every thread's stack
    try:
        run(argv[0], argv[1], argv[2:])
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        error.__traceback__ = _user_frames(error.__traceback__) or error.__traceback__
        traceback.print_exception(type(error), error, error.__traceback__)
        sys.stderr.flush()
        _record_for_torchrun(error)
        return 1
    return 0


def _exit_code(status) -> int:
    """What ``sys.exit(status)`` would make the process return (printing a message status as Python does)."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF if status >= 0 else status % 256
    print(status, file=sys.stderr)
    return 1


def finish(code: int) -> None:
    """End the worker like a normal exit, minus the interpreter teardown that can abort gloo/DDP processes."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for namespace in _NAMESPACES:
        if namespace is not globals():
            namespace.clear()
    for obj in gc.get_objects():  # runpy's module for the script, if a library still holds it
        # type(), not isinstance(): some objects (torch's deprecated reduce_op) warn on any attribute access
        if type(obj) is types.ModuleType and obj.__name__ == "__main__" and obj.__dict__ is not globals():
            obj.__dict__.clear()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


if __name__ == "__main__":
    try:
        status = main(sys.argv[1:])
    except SystemExit as stop:
        status = stop.code
    finish(_exit_code(status))
