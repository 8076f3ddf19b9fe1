"""What the multi-process benchmarks share (bench_fsdp, bench_deepspeed, bench_model_parallel): each variant runs
in its own 2-process ``hasten launch`` of the benchmark file (so a rank's peak RSS is that variant's), one launch at
a time under the lock the multi-process tests take, and hands its result back as a JSON file."""
from __future__ import annotations

import fcntl
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
LOCK = Path(os.environ.get("HASTEN_TEST_LOCK", "/tmp/hasten-multiprocess-tests.lock"))

__all__ = ["ROOT", "LOCK", "peak_rss_mb", "launch_worker", "report"]


def peak_rss_mb() -> float:
    """This process's peak resident memory, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def launch_worker(script: str, worker: str, extra_env: Optional[dict] = None, label: Optional[str] = None,
                  processes: int = 2, args: tuple = ()) -> dict:
    """Run ``script --worker WORKER OUT *args`` on ``processes`` processes (``OMP_NUM_THREADS=1``, this checkout's
    hasten) and return the JSON its main rank wrote to OUT. ``label`` names the variant in the file name and in a
    failure."""
    label = label or worker
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    env.update(extra_env or {})
    out = Path(tempfile.gettempdir()) / f"hasten-bench-{Path(script).stem}-{os.getpid()}-{label}.json"
    command = [sys.executable, "-m", "hasten", "launch", "-n", str(processes), script, "--worker", worker, str(out),
               *args]
    with open(LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        code = subprocess.call(command, env=env)
    if code != 0:
        raise SystemExit(f"benchmark worker failed for {label} (exit {code})")
    result = json.loads(out.read_text())
    out.unlink()
    return result


def report(rows: list, argv: list, widths: tuple = (45, 28)) -> list:
    """Print one line per row (measure, value, ratio) and, with ``--json PATH`` in ``argv``, write the rows there."""
    for row in rows:
        print(f"{row['benchmark']:<{widths[0]}} {row['value']:<{widths[1]}} {row['ratio']:.2f}x", flush=True)
    if "--json" in argv:
        Path(argv[argv.index("--json") + 1]).write_text(json.dumps(rows, indent=1))
    return rows
