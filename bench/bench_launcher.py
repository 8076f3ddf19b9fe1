"""Start-up cost of the launcher: `hasten launch -n 2` vs `torchrun --nproc_per_node 2` (and
`accelerate launch --multi_gpu --num_processes 2` when Accelerate is installed) on a trivial script that
initialises the process group, meets at a barrier and exits. Target: hasten / torchrun <= 1.15x.

    python bench/bench_launcher.py [--repeats N]

(Accelerate needs `--multi_gpu` to start 2 processes at all on a CPU-only machine: without it,
`accelerate launch --num_processes 2` runs the script once, as a single process.)
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import compare, is_installed  # noqa: E402

TRIVIAL_SCRIPT = """\
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""

_LOCK = Path(os.environ.get("HASTEN_TEST_LOCK", "/tmp/hasten-multiprocess-tests.lock"))
_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _clean_env(home: str) -> dict:
    """No launcher variables, no config file of this machine (hasten's nor Accelerate's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HASTEN_") and k not in _LAUNCH_VARIABLES}
    env.update(HASTEN_CONFIG_HOME=os.path.join(home, "hasten"), HF_HOME=os.path.join(home, "hf"))
    return env


def _runner(command: list, env: dict):
    def launch():
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")

    return launch


@contextlib.contextmanager
def _machine_to_ourselves():
    """Hold the multi-process lock the tests use: no other multi-process job runs while we measure."""
    with open(_LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(repeats: int = 5) -> list:
    with tempfile.TemporaryDirectory(prefix="hasten-bench-launch-") as home, _machine_to_ourselves():
        script = os.path.join(home, "trivial.py")
        Path(script).write_text(TRIVIAL_SCRIPT)
        env = _clean_env(home)
        python = sys.executable
        variants = {
            "torchrun": _runner([python, "-m", "torch.distributed.run", "--nproc_per_node", "2", script], env),
            "hasten": _runner([python, "-m", "hasten", "launch", "-n", "2", script], env),
            "accelerate": (_runner([python, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                                    "2", script], env) if is_installed("accelerate") else None),
        }
        return compare("launcher start-up: 2 processes, init_process_group + barrier + exit", variants,
                       repeats=repeats, warmup=1, baseline="torchrun")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    main(parser.parse_args().repeats)
