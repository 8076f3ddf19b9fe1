"""`hasten launch` when things fail from outside the program: a rank SIGKILLed (as by the OOM killer), the
launcher itself SIGKILLed, and who can reach the rendezvous store of a one-machine job.

Jobs run tests/commands/launch_faults.py; one multi-process job at a time (tests/helpers.py's lock).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from helpers import ROOT, one_multiprocess_job_at_a_time, clean_env, run_real_launch

from hasten.commands import failure_summary as summary
from hasten.commands.launch_plan import store_on_loopback

HERE = Path(__file__).resolve().parent  # the scripts these tests launch live beside them

SCRIPT = "launch_faults.py"


def _root_cause_block(stderr: str) -> str:
    assert "Root Cause (first observed failure):" in stderr, stderr[-4000:]
    return stderr.split("Root Cause (first observed failure):", 1)[1].split("=" * 20, 1)[0]


def test_a_rank_killed_by_sigkill_is_the_root_cause_every_time(tmp_path):
    # it used to be rank 0 (stopped by the launcher with SIGTERM) on every run: check a few runs, not one
    for attempt in range(3):
        out = tmp_path / str(attempt)
        out.mkdir()
        result = run_real_launch(SCRIPT, "kill_rank1", str(out), num_processes=2, check=False, timeout=120)
        assert result.returncode != 0
        root = _root_cause_block(result.stderr)
        assert "rank      : 1 (local_rank: 1)" in root, root
        assert "SIGKILL" in root and "exitcode  : -9" in root, root
        assert "rank 1" in result.stderr.split("=" * 20)[-1] and "out-of-memory (OOM) killer" in result.stderr
        assert "dmesg" in result.stderr
        assert "finished a collective without rank 1" not in result.stdout


def _launch_in_background(out):
    command = [sys.executable, "-m", "hasten", "launch", "-n", "2", str(HERE / SCRIPT), "hang", str(out)]
    return subprocess.Popen(command, env=clean_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def _wait_for(predicate, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers follow a dead launcher only on Linux")
def test_killing_the_launcher_ends_its_workers_and_the_store_is_on_loopback(tmp_path):
    with one_multiprocess_job_at_a_time():
        launcher = _launch_in_background(tmp_path)
        workers = []
        try:
            assert _wait_for(lambda: all((tmp_path / f"pid-{r}").exists() for r in (0, 1)), 90), \
                launcher.stderr.read() if launcher.poll() is not None else "the workers never started"
            workers = [int((tmp_path / f"pid-{r}").read_text()) for r in (0, 1)]
            # the rendezvous store's server runs in the launcher: it listens on the loopback address only
            listening = [c.laddr for c in psutil.Process(launcher.pid).net_connections("inet")
                         if c.status == psutil.CONN_LISTEN]
            assert listening, "the launcher has no listening socket (where is the rendezvous store?)"
            assert all(address.ip in ("127.0.0.1", "::1") for address in listening), listening
            launcher.send_signal(signal.SIGKILL)
            launcher.wait(10)
            assert _wait_for(lambda: not any(_alive(pid) for pid in workers), 10), \
                f"workers still alive after the launcher was killed: {[p for p in workers if _alive(p)]}"
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait(10)
            for pid in workers:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
            launcher.stderr.close()


def _failure(exitcode, timestamp, precise=None, pid=100):
    data = {"message": {"extraInfo": {summary.PRECISE_TIME_KEY: repr(precise)}}} if precise is not None else {}
    return SimpleNamespace(exitcode=exitcode, timestamp=timestamp, error_file_data=data, pid=pid)


def test_root_cause_rules():
    killed, echo = _failure(-9, 100), _failure(1, 100, precise=100.2)  # the peer's "connection closed", same second
    assert summary.root_cause({0: echo, 1: killed}) == (1, killed)
    stopped = _failure(-15, 99, precise=99.9)  # stopped by the agent, with an early secondary error
    assert summary.root_cause({0: stopped, 1: killed}) == (1, killed)
    # the agent's SIGKILL of a rank that ignored its SIGTERM comes 30 s later: not the root cause
    raised, escalated = _failure(1, 100, precise=100.5), _failure(-9, 131)
    assert summary.root_cause({0: escalated, 1: raised}) == (1, raised)
    # two Python errors of the same second: the earlier one, by the sub-second time
    first, second = _failure(1, 100, precise=100.7), _failure(1, 100, precise=100.1)
    assert summary.root_cause({0: first, 1: second}) == (1, second)
    assert summary.root_cause({2: stopped}) == (2, stopped)


def test_signal_hints():
    oom = summary.signal_hint(1, _failure(-9, 0))
    assert "rank 1" in oom and "SIGKILL" in oom and "out-of-memory" in oom and "dmesg" in oom
    assert "SIGSEGV" in summary.signal_hint(0, _failure(-11, 0))
    assert summary.signal_hint(0, _failure(1, 0)) is None


def test_store_on_loopback_only_for_a_static_single_machine_job():
    values = {"rdzv_backend": "static", "num_machines": 1, "min_machines": 1, "machine_rank": 0,
              "main_process_ip": None}
    assert store_on_loopback(values, None)
    assert store_on_loopback({**values, "main_process_ip": "localhost"}, None)
    assert not store_on_loopback({**values, "main_process_ip": "10.0.0.5"}, None)
    assert not store_on_loopback({**values, "num_machines": 2}, None)
    assert not store_on_loopback({**values, "rdzv_backend": "c10d"}, None)
    assert not store_on_loopback(values, "localhost:0")  # --max_restarts: torch's c10d store


def _worker_view():
    """In a notebook_launcher worker: the launcher's listening addresses and this worker's parent-death signal."""
    import ctypes

    listening = sorted({c.laddr.ip for c in psutil.Process(os.getppid()).net_connections("inet")
                        if c.status == psutil.CONN_LISTEN})
    death_signal = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(death_signal), 0, 0, 0)  # PR_GET_PDEATHSIG
    return listening, death_signal.value


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux only")
def test_debug_launcher_workers_follow_the_launcher_and_the_store_is_on_loopback():
    from hasten import debug_launcher

    with one_multiprocess_job_at_a_time():
        results = debug_launcher(_worker_view, num_processes=2)
    for listening, death_signal in results.values():
        assert listening and set(listening) <= {"127.0.0.1", "::1"}, listening
        assert death_signal == signal.SIGTERM
