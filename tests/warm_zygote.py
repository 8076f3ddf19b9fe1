"""A pre-warmed worker starter for the test suite (run as a program by ``warm_launch``; never imported by hasten).

Every ``hasten launch`` in a test pays for a fresh Python, torch's import in the launcher, then again in every
worker (2.5 s each here, 6 s with DeepSpeed): most of a small launched check's time. This program imports torch,
hasten and the modules a caller names once, then, for each job it is sent, forks the workers from itself: each
fork sets the job's environment, rank variables and working folder, sends its output to the job's files and runs
the script through hasten's own worker runner (``hasten.commands.run_script``: the same ``main`` and ``finish`` a
launched worker runs). The launcher itself keeps its own end-to-end tests (tests/commands), which start real
``hasten launch`` jobs.

Protocol: one JSON object a line. On start it answers ``{"ready": true}`` (or ``{"ready": false, "why": ...}``
when the imports left a thread running: forking a threaded process is not safe, the caller then launches for
real). Then per request ``{"nproc", "env", "cwd", "mode", "target", "args", "folder", "stdout", "stderr",
"master_addr", "master_port", "timeout"}`` it
answers ``{"returncodes": [...], "failed_first": rank or None, "timed_out": ...}`` once every worker ended.

It ends itself when its caller dies (Linux parent-death signal) or closes its input.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time


# native threads that libraries start at import and that survive a fork by design (their own atfork handlers)
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})


def _unsafe_threads() -> list:
    """Threads other than this one that a fork would leave half-copied (Python's, and native ones not known safe)."""
    names = [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]
    try:
        tasks = [task for task in os.listdir("/proc/self/task") if int(task) != os.getpid()]
    except OSError:
        return names
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as handle:
                name = handle.read().strip()
        except OSError:
            continue
        if name not in FORK_SAFE_THREADS:
            names.append(f"{name} (native, {task})")
    return names


def _worker(job: dict, rank: int, channels: tuple) -> None:
    """In the forked child: become rank ``rank`` of ``job`` and run it to the end (never returns)."""
    for fd in channels:
        os.close(fd)
    os.environ.clear()
    os.environ.update(job["env"])
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
                       "WORLD_SIZE": str(job["nproc"]), "LOCAL_WORLD_SIZE": str(job["nproc"]),
                       "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(job["nproc"]), "ROLE_NAME": "default",
                       "MASTER_ADDR": job["master_addr"], "MASTER_PORT": str(job["master_port"]),
                       "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
                       "TORCHELASTIC_RUN_ID": "none", "HASTEN_LAUNCHER_PID": str(os.getppid()),
                       "TORCHELASTIC_ERROR_FILE": os.path.join(job["folder"], f"error-{rank}.json")})
    os.chdir(job["cwd"])
    sys.path[0] = job["cwd"]  # as `python -m hasten.commands.run_script` has it (a script's folder replaces it)
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(job["stdout"], os.O_WRONLY | os.O_APPEND)
    err = os.open(job["stderr"], os.O_WRONLY | os.O_APPEND)
    for source, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(source, target)
        os.close(source)
    # What a fresh interpreter would have: its own random streams, the job's PYTHONPATH, its thread count
    import random

    import numpy
    import torch

    random.seed()
    numpy.random.seed()
    torch.seed()  # torch too seeds its default generator from the system's entropy at start
    for entry in reversed([p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep) if p]):
        if entry not in sys.path:
            sys.path.insert(1, entry)
    if "OMP_NUM_THREADS" in job["env"]:
        torch.set_num_threads(int(job["env"]["OMP_NUM_THREADS"]))
    if job["env"].get("HASTEN_AS_ACCELERATE", "").strip().lower() not in ("", "0", "false"):
        from hasten.as_accelerate.startup import honour_on_import

        honour_on_import()
    _restart_coverage()
    from hasten.commands import run_script

    try:
        status = run_script.main([job["mode"], job["target"], *job["args"]])
    except SystemExit as stop:
        status = stop.code
    run_script.finish(run_script._exit_code(status))


def _restart_coverage() -> None:
    """Under coverage.py (``COVERAGE_PROCESS_START``), measure this worker as its own process, as a fresh one would
    be: the forked tracer stops, a new one starts and saves under this process's id."""
    if "coverage" not in sys.modules or not os.environ.get("COVERAGE_PROCESS_START"):
        return
    import coverage

    current = coverage.Coverage.current()
    if current is not None:
        current.stop()
    coverage.process_startup(force=True)


def _run_job(job: dict, channels: tuple) -> dict:
    """Fork the job's workers, wait for them; when one fails or the time is up, end the others (as torchrun does)."""
    sys.stdout.flush()
    sys.stderr.flush()
    children = {}
    for rank in range(job["nproc"]):
        pid = os.fork()
        if pid == 0:
            try:
                _worker(job, rank, channels)
            finally:
                os._exit(70)
        children[pid] = rank
    codes = {}
    failed_first = None
    deadline = time.monotonic() + job["timeout"]
    stopping_since = None
    timed_out = False
    while len(codes) < len(children):
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            if now > deadline and not timed_out:
                timed_out = True
                stopping_since = stopping_since or now
                _signal_all(children, codes, signal.SIGTERM)
            if stopping_since is not None and now - stopping_since > 10:
                _signal_all(children, codes, signal.SIGKILL)
            time.sleep(0.02)
            continue
        if pid in children:
            code = os.waitstatus_to_exitcode(status)
            codes[children[pid]] = code
            if code != 0 and failed_first is None:
                failed_first = children[pid]
            if code != 0 and stopping_since is None:
                stopping_since = time.monotonic()
                _signal_all(children, codes, signal.SIGTERM)
    return {"returncodes": [codes[rank] for rank in range(job["nproc"])], "failed_first": failed_first,
            "timed_out": timed_out}


def _signal_all(children: dict, codes: dict, number: int) -> None:
    for pid, rank in children.items():
        if rank not in codes:
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass


def main() -> None:
    from hasten.commands.parent_watch import end_with_parent

    end_with_parent(int(sys.argv[1]))
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    channels = (requests.fileno(), replies.fileno())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # whatever an import prints goes to the log, never into the replies
    os.close(null)
    for name in sys.argv[2:]:
        importlib.import_module(name)
    alive = _unsafe_threads()
    if alive:
        replies.write(json.dumps({"ready": False, "why": f"threads alive after the imports: {alive}"}) + "\n")
        replies.flush()
        return
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in requests:
        job = json.loads(line)
        replies.write(json.dumps(_run_job(job, channels)) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
