"""Elastic FSDP end to end: two `hasten launch --num_machines 1:2 -n 4` agents (2 processes each) on this machine (c10d rendezvous,
loopback) train one job of 4 processes with sharded checkpoints; one agent is killed mid-run; the survivor restarts
its processes, the job continues on 2 processes from the newest checkpoint (resharded 4 -> 2) and finishes.
The script is tests/strategies/fsdp/elastic_fsdp_train.py; docs/checkpointing.md shows the same commands."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import ROOT, one_multiprocess_job_at_a_time, clean_env

HERE = Path(__file__).resolve().parent  # the scripts these tests launch live beside them
sys.path.insert(0, str(HERE))
from elastic_fsdp_train import reference_losses  # noqa: E402

SCRIPT = HERE / "elastic_fsdp_train.py"


def _agent(port: int, work, env):
    command = [sys.executable, "-m", "hasten", "launch", "--num_machines", "1:2", "-n", "4", "--max_restarts", "2",
               "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--monitor_interval", "0.5",
               # once one machine has joined, the rendezvous waits this long for more (torch's default is 30 s): the
               # two agents start together, and after the kill the survivor waits for nobody
               "--rdzv_conf", "last_call_timeout=10",
               str(SCRIPT), str(work)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)  # its own process group: killed with its processes


def _listening_pid(port: int):
    """The pid of the process listening on TCP ``port`` here (Linux /proc), or None."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            return int(pid)
    return None


def test_killing_one_machine_of_an_elastic_fsdp_job_continues_on_fewer_processes(tmp_path):
    from hasten.core.network import find_free_port

    env = {k: v for k, v in clean_env(HASTEN_CONFIG_HOME=str(tmp_path / "none")).items() if not k.startswith("SLURM_")}
    port = find_free_port()
    with one_multiprocess_job_at_a_time():
        first, second = _agent(port, tmp_path, env), _agent(port, tmp_path, env)
        deadline = time.monotonic() + 240
        agents = tmp_path / "agents"
        while time.monotonic() < deadline and len(list(agents.glob("*")) if agents.is_dir() else []) < 4:
            assert first.poll() is None and second.poll() is None, "an agent ended before the kill"
            time.sleep(0.2)
        parents = {int(path.read_text()) for path in agents.glob("*")}
        assert parents == {first.pid, second.pid}, (parents, first.pid, second.pid)
        # the agent that hosts the rendezvous store must survive: the other machine goes away
        host = _listening_pid(port)
        survivor, victim = (first, second) if host == first.pid else (second, first)
        assert host in (first.pid, second.pid), (host, first.pid, second.pid)
        os.killpg(victim.pid, signal.SIGKILL)  # the machine goes away: its agent and its processes
        out, err = survivor.communicate(timeout=300)
        victim.communicate(timeout=30)
    assert survivor.returncode == 0, f"--- stdout\n{out}\n--- stderr\n{err[-8000:]}"
    assert "ELASTIC TRAINING FINISHED world=2" in out, out
    rows = [line.split() for line in (tmp_path / "losses.txt").read_text().splitlines()]
    steps = [int(step) for step, _, _ in rows]
    worlds = {int(step): int(world) for step, _, world in rows}
    losses = {int(step): float(loss) for step, loss, _ in rows}
    assert steps == list(range(16)), steps  # every step once: the restart resumed after the newest checkpoint
    assert all(worlds[s] == 4 for s in range(8)) and all(worlds[s] == 2 for s in range(8, 16)), worlds
    # the curve continues the interrupted one: every step's loss is that of the same training never interrupted
    # (the global batch of a step is the same on 4 and on 2 processes; only the reduction order differs)
    expected = reference_losses()
    assert all(abs(losses[s] - expected[s]) <= 1e-4 * max(1.0, abs(expected[s])) for s in range(16)), (losses, expected)
