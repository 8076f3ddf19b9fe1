"""Stress test: the gradient-synchronisation scenarios, many times, on 2 processes of a deliberately loaded CPU.

Every collective hasten issues must be entered by all processes whatever the timing. A collective that
depends on something local to one process (how fast it is, its log level, where its data loader ends ...)
shows up here as a hang, which the timeout turns into a failure; hasten/test_utils/scripts/test_sync.py then prints
every process's stack (faulthandler), which names the collective each one is waiting in. See
docs/debugging.md, "Hunting a rare hang".
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from helpers import ROOT, one_multiprocess_job_at_a_time, clean_env

from hasten.test_utils import path_in_hasten_package


ROUNDS = 8  # each round: 17 Accelerators, 18 DDP models, 8 dispatching loaders; about 1 s on a loaded 2-core CPU
HANG_TIMEOUT = 100  # a run takes 15-25 s here; one still running after this is stuck in a collective
DUMP_AFTER = 20  # test_sync.py dumps every thread's stack when one round takes longer than this


def _descendants(pid: int) -> list:
    """Every process below ``pid`` (Linux /proc). torchrun starts its workers in sessions of their own, so
    killing the launcher's process group does not reach them."""
    children: dict = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(job: subprocess.Popen) -> None:
    for pid in _descendants(job.pid):  # found before the launcher dies, while they are still its descendants
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _run_loaded(command: list) -> subprocess.CompletedProcess:
    """Run ``command`` (in its own process group) while a busy loop competes for the CPU; kill everything on a
    timeout and fail with the output, which then holds the stacks of the stuck processes."""
    env = clean_env(HASTEN_STRESS_DUMP_AFTER=DUMP_AFTER)
    with one_multiprocess_job_at_a_time():
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                   cwd=ROOT, start_new_session=True)
            try:
                out, err = job.communicate(timeout=HANG_TIMEOUT)
            except subprocess.TimeoutExpired:
                _kill_tree(job)  # the launcher and every worker it started
                out, err = job.communicate(timeout=30)
                raise AssertionError(
                    f"{' '.join(command)} hung (still running after {HANG_TIMEOUT} s): a collective was not entered "
                    f"by every process.\n--- stdout\n{out[-4000:]}\n--- stderr\n{err[-12000:]}"
                ) from None
            finally:
                if job.poll() is None:
                    _kill_tree(job)
        finally:
            busy.kill()
            busy.wait()
    result = subprocess.CompletedProcess(command, job.returncode, out, err)
    assert result.returncode == 0, f"{' '.join(command)} exited with {result.returncode}\n--- stdout\n" \
                                   f"{out[-4000:]}\n--- stderr\n{err[-12000:]}"
    return result


def test_sync_scenarios_under_hasten_launch_on_a_loaded_cpu():
    script = str(path_in_hasten_package("test_utils", "scripts", "test_sync.py"))
    result = _run_loaded([sys.executable, "-m", "hasten", "launch", "-n", "2", script, str(ROUNDS)])
    assert f"test_sync OK: {ROUNDS} rounds on 2 processes" in result.stdout


def test_sync_scenarios_under_debug_launcher_on_a_loaded_cpu():
    """As a test suite calls it: one process first, then an Accelerator made in the launching process itself (a
    test before), then the two-process run, whose workers must start from their own state."""
    driver = textwrap.dedent(f"""
        import sys
        from hasten import Accelerator, debug_launcher
        from hasten.test_utils import test_sync

        def alone():
            accelerator = Accelerator()
            assert accelerator.num_processes == 1, accelerator.num_processes
            print("debug_launcher: 1 process OK", flush=True)

        debug_launcher(alone, num_processes=1)
        Accelerator(cpu=True)
        debug_launcher(test_sync.main, args=({ROUNDS},), num_processes=2)
    """)
    result = _run_loaded([sys.executable, "-c", driver])
    assert "debug_launcher: 1 process OK" in result.stdout, result.stdout[-2000:]
    assert f"test_sync OK: {ROUNDS} rounds on 2 processes" in result.stdout
