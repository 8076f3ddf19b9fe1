"""Run a ``hasten launch`` job of a test from a pre-warmed process (``warm_zygote.py``) instead of a fresh launcher.

``helpers.run_launch`` calls ``warm_launch`` first. It plans the job with hasten's own launch code (the parser, the
config file, ``build_plan``: the same workers' environment ``hasten launch`` would give), then has a zygote that
already imported torch and hasten fork the workers. It returns None, and the caller starts the real
``hasten launch``, for every job it cannot stand in for exactly:

- the plan is refused (the real launcher then prints its own error),
- anything but a plain one-machine static job: several machines, restarts, an elastic or c10d rendezvous, ``--tee``
  / ``--log_dir`` / ``--role``, ``--no_python``, DeepSpeed's or mpirun's runner,
- ``HASTEN_TEST_REAL_LAUNCH=1`` in the environment (every job through the real launcher: the check that the warm
  start changes no result), or a zygote that could not start safely (a thread alive after its imports).

Zygotes are kept for the session, one per (modules to preload, the job's environment before the launch's own
settings), and end with it: whatever an import reads from the environment, the workers' imports read the same. At
most ``MAX_ZYGOTES`` live at once (the least recently used ends first).
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

ZYGOTE = Path(__file__).resolve().parent / "warm_zygote.py"
BASE_PRELOAD = ("torch", "torch.distributed", "hasten", "hasten.accelerator", "hasten.commands.run_script")
MAX_ZYGOTES = 4
_NUMBERS = itertools.count()
_ZYGOTES: dict = {}  # key -> zygote, the least recently used first
_REFUSED: dict = {}  # zygote key -> why it could not start


class _Zygote:
    """One warm process and its request / reply pipes."""

    def __init__(self, preload: tuple, env: dict, log: Path):
        self.log = log
        with open(log, "w") as handle:
            self.process = subprocess.Popen([sys.executable, str(ZYGOTE), str(os.getpid()), *preload],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=handle,
                                            text=True, env=env)
        self.ready = self._reply(timeout=300)

    def _reply(self, timeout: float) -> dict:
        readable, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if readable else ""
        if not line:
            tail = self.log.read_text()[-4000:] if self.log.exists() else ""
            self.close()
            raise RuntimeError(f"the warm zygote gave no answer in {timeout:.0f} s (it ended: "
                               f"{self.process.poll()}); its log:\n{tail}")
        return json.loads(line)

    def run(self, job: dict) -> dict:
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        return self._reply(timeout=job["timeout"] + 60)

    def close(self) -> None:
        """End the zygote: its input closed, it exits as a program does (coverage, if on, saves); killed if it
        does not within 10 s."""
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.log.unlink(missing_ok=True)


def _close_all() -> None:
    for zygote in _ZYGOTES.values():
        zygote.close()


atexit.register(_close_all)


def _zygote(preload: tuple, env: dict) -> Optional[_Zygote]:
    """The zygote for ``preload`` started with ``env`` (the job's environment before the launch adds its settings,
    plus ``HASTEN_AS_ACCELERATE`` when the launch sets it: what the workers' imports may read)."""
    start_env = {**env, "OMP_NUM_THREADS": "1"}  # no BLAS thread pool before the forks; each worker sets its own
    # pytest names the running test in PYTEST_CURRENT_TEST: no import reads it, the workers get the job's own
    key = (preload, tuple(sorted((name, value) for name, value in start_env.items()
                                 if not name.startswith("PYTEST_"))))
    if key in _REFUSED:
        return None
    zygote = _ZYGOTES.pop(key, None)
    if zygote is not None and zygote.process.poll() is None:
        _ZYGOTES[key] = zygote  # the most recently used last
        return zygote
    while len(_ZYGOTES) >= MAX_ZYGOTES:  # the least recently used ends: each holds its imports in memory
        _ZYGOTES.pop(next(iter(_ZYGOTES))).close()
    log = Path(tempfile.gettempdir()) / f"hasten-warm-zygote-{os.getpid()}-{next(_NUMBERS)}.log"
    zygote = _Zygote((*BASE_PRELOAD, *preload), start_env, log)
    if not zygote.ready.get("ready"):
        _REFUSED[key] = zygote.ready.get("why", "")
        print(f"warm_launch: launching for real: {_REFUSED[key]}", file=sys.stderr)
        zygote.close()
        return None
    _ZYGOTES[key] = zygote
    return zygote


class _Environment:
    """``os.environ`` replaced by ``env`` for the time of the plan (the launcher reads its own environment)."""

    def __init__(self, env: dict):
        self.env = env

    def __enter__(self):
        self.saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)

    def __exit__(self, *exc):
        os.environ.clear()
        os.environ.update(self.saved)


def _plan(launch_argv: list, env: dict, cwd):
    """hasten launch's plan for ``launch_argv`` with ``env`` as the environment, or None if it is refused."""
    from hasten.commands.launch import launch_command_parser, load_launch_config
    from hasten.commands.launch_plan import build_plan

    saved_cwd = os.getcwd()
    try:
        with _Environment(env):
            os.chdir(cwd)
            args = launch_command_parser().parse_args(launch_argv)
            path, config = load_launch_config(args.config_file)
            return build_plan(args, config, path)
    except (Exception, SystemExit):
        return None
    finally:
        os.chdir(saved_cwd)


def _plain_job(plan):
    """``(nproc, master address, port, mode, target, args)`` of a job a zygote can run, else None."""
    from torch.distributed import run as torchrun

    from hasten.commands.launch_plan import RUNNER_MODULE

    if plan.deepspeed_runner is not None or plan.mpi_runner is not None:
        return None
    parsed = torchrun.parse_args(plan.torchrun_args)
    if (str(parsed.nnodes) != "1" or parsed.max_restarts != 0 or parsed.rdzv_backend != "static"
            or parsed.no_python or str(parsed.tee) != "0" or str(parsed.redirects) != "0" or parsed.log_dir
            or parsed.role != "default" or parsed.local_ranks_filter
            or parsed.training_script != RUNNER_MODULE or not parsed.module):
        return None
    mode, target, *arguments = parsed.training_script_args
    return int(parsed.nproc_per_node), parsed.master_addr, parsed.master_port, mode, target, arguments


def _disabled() -> bool:
    return os.environ.get("HASTEN_TEST_REAL_LAUNCH", "") not in ("", "0")


def warm_launch(launch_argv: list, env: dict, cwd, timeout: float,
                preload: tuple = ()) -> Optional[subprocess.CompletedProcess]:
    """The finished job ``hasten launch LAUNCH_ARGV`` would give, run from a zygote; None where only the real
    launcher can run it (see the module's docstring)."""
    if _disabled():
        return None
    plan = _plan(launch_argv, env, cwd)
    if plan is None:
        return None
    job = _plain_job(plan)
    if job is None:
        return None
    nproc, address, port, mode, target, arguments = job
    return _run(["hasten", "launch", "(warm)", *launch_argv], nproc, address, port, mode, target, arguments,
                env, plan.env, cwd, timeout, preload, plan.notes)


def warm_torchrun(script, script_args: list, nproc: int, env: dict, cwd, timeout: float,
                  preload: tuple = ()) -> Optional[subprocess.CompletedProcess]:
    """The finished job ``torchrun --nproc_per_node NPROC SCRIPT SCRIPT_ARGS`` would give (its workers' variables,
    ``OMP_NUM_THREADS=1`` when unset for several processes, as torchrun sets it), run from a zygote; None under
    ``HASTEN_TEST_REAL_LAUNCH=1`` or when no zygote can start. For the reference library's runs a test compares
    against."""
    if _disabled():
        return None
    from hasten.core.network import find_free_port

    added = {"OMP_NUM_THREADS": "1"} if nproc > 1 and "OMP_NUM_THREADS" not in env else {}
    return _run(["torchrun", "(warm)", "--nproc_per_node", str(nproc), str(script), *script_args], nproc,
                "127.0.0.1", find_free_port(), "path", str(script), list(script_args), env, added, cwd, timeout,
                preload, [])


def _run(command: list, nproc: int, address: str, port: int, mode: str, target: str, arguments: list, env: dict,
         added: dict, cwd, timeout: float, preload: tuple, notes: list) -> Optional[subprocess.CompletedProcess]:
    """Run ``nproc`` workers of ``target`` with ``env`` plus the launcher's ``added`` variables from the zygote
    for ``preload`` and ``env``; the finished process, as ``subprocess.run`` returns it."""
    worker_env = {**env, **added}
    start_env = {key: value for key, value in env.items() if key != "HASTEN_AS_ACCELERATE"}
    if "HASTEN_AS_ACCELERATE" in worker_env:
        start_env["HASTEN_AS_ACCELERATE"] = worker_env["HASTEN_AS_ACCELERATE"]
    zygote = _zygote(tuple(preload), start_env)
    if zygote is None:
        return None
    with tempfile.TemporaryDirectory(prefix="hasten-warm-") as folder:
        stdout, stderr = Path(folder, "stdout"), Path(folder, "stderr")
        stdout.touch()
        stderr.write_text("".join(note + "\n" for note in notes))
        reply = zygote.run({"nproc": nproc, "env": worker_env, "cwd": str(cwd), "mode": mode, "target": target,
                            "args": [str(argument) for argument in arguments], "folder": folder,
                            "stdout": str(stdout), "stderr": str(stderr), "master_addr": address,
                            "master_port": port, "timeout": timeout})
        out, err = stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
    if reply["timed_out"]:
        raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err)
    code = 0
    if reply["failed_first"] is not None:
        first = reply["returncodes"][reply["failed_first"]]
        code = first if 0 < first < 256 else 1
    return subprocess.CompletedProcess(command, code, stdout=out, stderr=err)
