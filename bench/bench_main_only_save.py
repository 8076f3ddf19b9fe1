"""What a ``save_state`` called on the main process only costs on 2 processes (diffusers' pattern), against a
plain ``torch.save`` of the same state and against the reference library.

    python bench/bench_main_only_save.py            # or: python bench/run_all.py --only main_only_save

Two 2-process jobs (``worker_launch``): in hasten's, the main process alternates, pair by pair (``BENCH_PAIRS``,
default 30), three ways of saving the same DDP model + AdamW state while process 1 never calls ``save_state``:

- ``hasten``: ``save_state`` as it is (the main process writes alone and waits for nobody; participation.py);
- ``before``: the previous behaviour, still what ``save_on_each_node=True`` does: the main process first waits
  ``HASTEN_SAVE_STATE_JOIN_TIMEOUT`` seconds (default 10) for the others, then writes alone;
- ``torch.save``: the model's and the optimizer's state dicts written with ``torch.save`` into a fresh folder,
  flushed to disk.

In the reference's job, its main process alternates its own ``save_state`` with the same ``torch.save``. Each row's
ratio is the median over pairs of (variant / ``torch.save`` of the same pair).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

WIDTH, LAYERS = 1024, 8  # ~8.4M parameters: ~100 MB of files with AdamW's two moments


def _model_and_optimizer():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, WIDTH)).sum().backward()
    optimizer.step()  # the moments exist
    return model, optimizer


def _plain_save(model, optimizer, folder: Path) -> None:
    import torch

    folder.mkdir(parents=True)
    for name, state in (("model.bin", model.state_dict()), ("optimizer.bin", optimizer.state_dict())):
        with open(folder / name, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())


def _timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def worker(library: str, out: Path) -> None:
    """One 2-process job: the main process alternates the variants, process 1 waits at the end."""
    if library == "reference":
        from accelerate import Accelerator
    else:
        from hasten import Accelerator
    accelerator = Accelerator(cpu=True)
    model, optimizer = _model_and_optimizer()
    model, optimizer = accelerator.prepare(model, optimizer)
    pairs = int(os.environ.get("BENCH_PAIRS", 30))
    root = Path(tempfile.mkdtemp(prefix=f"hasten-bench-main-only-{library}-"))
    times: dict[str, list] = {}
    if accelerator.is_main_process:
        variants = {"torch.save": lambda folder: _plain_save(model, optimizer, folder),
                    library: lambda folder: accelerator.save_state(folder)}
        if library == "hasten":
            def before(folder):
                accelerator.project_configuration.save_on_each_node = True  # the join wait it still has
                try:
                    accelerator.save_state(folder)
                finally:
                    accelerator.project_configuration.save_on_each_node = False
            variants["before"] = before
        for index in range(pairs + 1):  # the first round warms up, untimed
            for name, save in variants.items():
                folder = root / f"{name.replace('.', '_')}-{index}"
                seconds = _timed(lambda: save(folder))
                shutil.rmtree(folder, ignore_errors=True)
                if index:
                    times.setdefault(name, []).append(seconds)
        out.write_text(json.dumps(times))
    accelerator.wait_for_everyone()  # process 1 called no save_state meanwhile
    shutil.rmtree(root, ignore_errors=True)


def _rows(times: dict, job: str) -> list:
    baseline = times["torch.save"]
    rows = []
    for name, seconds in times.items():
        if name == "torch.save":
            continue
        ratios = [mine / plain for mine, plain in zip(seconds, baseline)]
        rows.append({"benchmark": f"main-only save_state, 2 processes ({job}'s job)", "variant": name,
                     "median_s": statistics.median(seconds), "min_s": min(seconds), "repeats": len(seconds),
                     "ratio": statistics.median(ratios),
                     "note": f"per-pair median of {name} / torch.save ({statistics.median(baseline):.3f} s)"})
    return rows


def main() -> list:
    from worker_launch import launch_worker

    rows = []
    for library in ("hasten", "reference"):
        if library == "reference":
            try:
                import accelerate  # noqa: F401
            except ImportError:
                print("the reference library is not installed: its job is skipped", flush=True)
                continue
        rows += _rows(launch_worker(__file__, library), library)
    for row in rows:
        print(f"{row['benchmark']:48s} {row['variant']:10s} median {row['median_s']:.3f} s  "
              f"x{row['ratio']:.2f} torch.save", flush=True)
    return rows


if __name__ == "__main__":
    if "--worker" in sys.argv:
        position = sys.argv.index("--worker")
        worker(sys.argv[position + 1], Path(sys.argv[position + 2]))
    else:
        main()
