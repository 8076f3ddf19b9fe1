"""Run the user's script (or ``-m`` module) as ``__main__`` inside a worker started by ``hasten launch``.

    python -m hasten.commands._run_script path script.py [args...]
    python -m hasten.commands._run_script module package.module [args...]

The script runs exactly as ``python script.py`` / ``python -m package.module`` would run it (same
``sys.argv``, ``sys.path[0]``, ``__name__``). The only addition: an uncaught exception is recorded with
torch's ``record`` (``torch.distributed.elastic.multiprocessing.errors``), so torchrun's failure summary
names the failing rank *with its traceback*. ``record`` is applied only after an exception, so a run
that succeeds imports nothing more than the script itself does.
"""
from __future__ import annotations

import faulthandler
import os
import runpy
import sys
import traceback
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
    try:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(error)
    except Exception:  # torch unusable or the file unwritable: the printed traceback is all there is
        pass


def run(mode: str, target: str, arguments: list) -> None:
    """Run ``target`` (a file path when ``mode == "path"``, a module name when ``mode == "module"``)."""
    if mode == "module":
        sys.argv = [target, *arguments]  # runpy replaces argv[0] with the module's file
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif mode == "path":
        sys.argv = [target, *arguments]
        if os.path.isdir(target) or zipfile.is_zipfile(target):
            del sys.path[0]  # runpy puts the folder / archive first, as `python folder` does
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py` does
        runpy.run_path(target, run_name="__main__")
    else:
        raise SystemExit(f"{__name__}: unknown mode {mode!r}; expected 'path' or 'module'.")


def main(argv: list) -> int:
    if len(argv) < 2:
        raise SystemExit(f"usage: python -m {__spec__.name if __spec__ else 'runner'} path|module TARGET [ARGS...]")
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
