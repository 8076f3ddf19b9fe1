"""save_state / load_state of a ~1 GB model with its AdamW state (~3 GB on disk): plain torch vs hasten vs Accelerate.

    python bench/bench_checkpointing.py        # or through bench/run_all.py

* torch: ``torch.save`` of the model's and the optimizer's state dicts, then ``torch.load`` + ``load_state_dict``
  (no flush to disk: a crash right after returning can lose the files).
* hasten: ``Accelerator.save_state`` / ``load_state`` into a new folder (every file flushed to disk, completion
  marker, atomic rename; plus RNG states).
* accelerate: the reference library's ``save_state`` / ``load_state`` (no flush either).

Target: hasten <= 1.1x torch and <= the reference. Every save goes to a new folder (old ones are removed
outside the timing), so no variant benefits from overwriting files, and the page cache's pending writes are
flushed (``os.sync``, untimed) before each save, so no variant pays for the writes another one left behind.
Files go to ``BENCH_CHECKPOINT_DIR`` (default: a temporary folder; point it at the disk you train on).

    python bench/bench_checkpointing.py --checksums   # only the checksum cost (~100M parameters, < 2 min)

The checksum cost: hasten's save_state / load_state of a ~100M-parameter model with AdamW (1.2 GB of files),
with the per-file checksums of the completion marker (default) and without (``HASTEN_CHECKPOINT_CHECKSUMS=0``),
alternated. Target: checksums add < 5% to save and to load.

    python bench/bench_checkpointing.py --async       # save_state(async_save=True) stall (~100M parameters)
    python bench/bench_checkpointing.py --paired      # ~100M parameters: hasten vs torch vs the reference, 30 rounds

The training stall of an asynchronous save: the time from calling ``save_state`` until it returns, with
``async_save=True`` (snapshot copied to CPU memory, files written in the background) vs a synchronous save of
the same ~100M-parameter model with AdamW, alternated; ``async+step`` is ``save_state`` followed at once by
``optimizer.step()`` (which waits for the copy of the parameters and moments the save leaves to its background
thread: the worst case, with no forward and backward to overlap it); ``async-complete`` is the time until the
asynchronous save is complete on disk (``wait_for_checkpoint``), with nothing else running. Target (issue 40):
stall <= 0.05x sync.

``--paired`` also times ``torch+fsync`` (the same ``torch.save`` files, each flushed: on disk when it returns, as
hasten's are) and ``floor``: as many bytes, made beforehand, written in 4 files side by side flushed every 64 MB
(``bench_disk_floor.py``), the disk's own time for a durable save with no serialisation at all.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from harness import compare, is_installed  # noqa: E402

LAYERS, WIDTH = 16, 4096  # 16 x 4096 x 4096 fp32 weights: 1.07 GB; AdamW adds 2.1 GB of moments
SMALL_LAYERS = 6  # 6 x 4096 x 4096: ~100M parameters, 0.4 GB; with AdamW 1.2 GB of files


def build(layers=LAYERS):
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()  # creates the moments
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


class Folders:
    """A fresh folder for every save; the previous one is deleted before the next timing starts."""

    def __init__(self, root: Path, name: str):
        self.root, self.name, self.count = root, name, 0

    def fresh(self) -> Path:
        shutil.rmtree(self.root / f"{self.name}_{self.count}", ignore_errors=True)
        os.sync()  # untimed: no variant pays for writing back what the previous one left in the page cache
        self.count += 1
        return self.root / f"{self.name}_{self.count}"

    @property
    def last(self) -> Path:
        return self.root / f"{self.name}_{self.count}"


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main():
    import torch

    from hasten import Accelerator
    from hasten.state import AcceleratorState

    root = Path(os.environ.get("BENCH_CHECKPOINT_DIR") or tempfile.mkdtemp(prefix="hasten-bench-ckpt-"))
    root.mkdir(parents=True, exist_ok=True)
    model, optimizer = build()
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    print(f"model {size:.2f} GB, optimizer state {2 * size:.2f} GB, files in {root}", flush=True)

    AcceleratorState._reset_state(True)
    ours = Accelerator(cpu=True)
    our_model, our_optimizer = ours.prepare(model, optimizer)
    folders = {name: Folders(root, name) for name in ("torch", "hasten", "accelerate")}

    def torch_save():
        folder = folders["torch"].fresh()
        folder.mkdir()

        def save():
            torch.save(model.state_dict(), folder / "model.pt")
            torch.save(optimizer.state_dict(), folder / "optimizer.pt")
        return timed(save)

    def torch_load():
        folder = folders["torch"].last

        def load():
            model.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
            optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
        return timed(load)

    def hasten_save():
        folder = folders["hasten"].fresh()
        return timed(lambda: ours.save_state(folder))

    def hasten_load():
        folder = folders["hasten"].last
        return timed(lambda: ours.load_state(folder))

    reference = reference_save = reference_load = None
    if is_installed("accelerate"):
        import accelerate

        reference = accelerate.Accelerator(cpu=True)
        reference.prepare(model, optimizer)

        def reference_save():
            folder = folders["accelerate"].fresh()
            return timed(lambda: reference.save_state(str(folder)))

        def reference_load():
            folder = folders["accelerate"].last
            return timed(lambda: reference.load_state(str(folder)))

    try:
        rows = compare(f"save_state {3 * size:.1f} GB", {"torch": torch_save, "hasten": hasten_save,
                                                         "accelerate": reference_save}, repeats=3)
        rows += compare(f"load_state {3 * size:.1f} GB", {"torch": torch_load, "hasten": hasten_load,
                                                          "accelerate": reference_load}, repeats=3)
    finally:
        if not os.environ.get("BENCH_CHECKPOINT_DIR"):
            shutil.rmtree(root, ignore_errors=True)
    return rows + checksum_cost()


def small_setup(prefix: str, names: tuple):
    """The ~100M-parameter model with AdamW prepared by hasten, a root folder for the files and one ``Folders`` per
    variant name: ``(root, model, optimizer, size in GB of files, accelerator, folders)``."""
    from hasten import Accelerator
    from hasten.state import AcceleratorState

    root = Path(os.environ.get("BENCH_CHECKPOINT_DIR") or tempfile.mkdtemp(prefix=f"hasten-bench-{prefix}-"))
    root.mkdir(parents=True, exist_ok=True)
    model, optimizer = build(SMALL_LAYERS)
    size = 3 * sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    AcceleratorState._reset_state(True)
    ours = Accelerator(cpu=True)
    ours.prepare(model, optimizer)
    return root, model, optimizer, size, ours, {name: Folders(root, name) for name in names}


def checksum_cost():
    """save_state / load_state with and without the marker's checksums, alternated (paired)."""
    from hasten.checkpointing import checksums

    root, model, optimizer, size, ours, folders = small_setup("crc", ("off", "on"))
    print(f"checksums: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, {size:.2f} GB of files, "
          f"algorithm {checksums.default_algorithm()}", flush=True)

    def with_checksums(enabled: bool, function):
        previous = os.environ.get(checksums.ENV_VARIABLE)
        os.environ[checksums.ENV_VARIABLE] = "1" if enabled else "0"
        try:
            return function()
        finally:
            if previous is None:
                os.environ.pop(checksums.ENV_VARIABLE)
            else:
                os.environ[checksums.ENV_VARIABLE] = previous

    def save(name, enabled):
        def run():
            folder = folders[name].fresh()
            return with_checksums(enabled, lambda: timed(lambda: ours.save_state(folder)))
        return run

    def load(name, enabled):
        return lambda: with_checksums(enabled, lambda: timed(lambda: ours.load_state(folders[name].last)))

    try:
        rows = compare(f"save_state {size:.1f} GB, checksums", {"no-checksum": save("off", False),
                                                               "checksum": save("on", True)},
                       repeats=5, baseline="no-checksum")
        rows += compare(f"load_state {size:.1f} GB, checksums", {"no-checksum": load("off", False),
                                                               "checksum": load("on", True)},
                        repeats=5, baseline="no-checksum")
    finally:
        if not os.environ.get("BENCH_CHECKPOINT_DIR"):
            shutil.rmtree(root, ignore_errors=True)
    return rows


def async_stall():
    """How long save_state blocks the training loop: synchronous vs async_save=True, alternated (paired)."""
    root, model, optimizer, size, ours, folders = small_setup("async", ("sync", "async", "complete"))
    print(f"async: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, {size:.2f} GB of files",
          flush=True)

    def sync():
        folder = folders["sync"].fresh()
        return timed(lambda: ours.save_state(folder))

    def background():
        folder = folders["async"].fresh()
        stall = timed(lambda: ours.save_state(folder, async_save=True))
        ours.wait_for_checkpoint()  # untimed: the next variant starts from an idle disk
        return stall

    def complete():
        folder = folders["complete"].fresh()
        return timed(lambda: (ours.save_state(folder, async_save=True), ours.wait_for_checkpoint()))

    def step_right_after():  # the worst case: the optimizer steps at once, nothing to overlap the copy with
        folder = folders["async"].fresh()
        stall = timed(lambda: (ours.save_state(folder, async_save=True), optimizer.step()))
        ours.wait_for_checkpoint()
        return stall

    try:
        rows = compare(f"save_state {size:.1f} GB, training stall", {"sync": sync, "async": background,
                                                                     "async+step": step_right_after,
                                                                     "async-complete": complete},
                       repeats=5, baseline="sync")
    finally:
        if not os.environ.get("BENCH_CHECKPOINT_DIR"):
            shutil.rmtree(root, ignore_errors=True)
    return rows


def paired(pairs: int = 30):
    """Full-state save / load, hasten vs plain torch vs the reference, ``pairs`` rounds: in each round every variant
    saves into a new folder, then every variant loads its own, the order rotating round by round; reported: the
    medians and the median of the per-round ratios to plain torch (issue 40)."""
    import statistics

    import torch

    import threading

    from bench_disk_floor import CHUNK_MB, write_flushed

    root, model, optimizer, size, ours, folders = small_setup("paired", ("torch", "torch+fsync", "hasten",
                                                                         "accelerate", "floor"))
    print(f"paired: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters + AdamW, {size:.2f} GB of "
          f"files, {pairs} rounds", flush=True)

    def torch_save():
        folder = folders["torch"].fresh()
        folder.mkdir()
        return timed(lambda: (torch.save(model.state_dict(), folder / "model.pt"),
                              torch.save(optimizer.state_dict(), folder / "optimizer.pt")))

    def torch_load():
        folder = folders["torch"].last
        return timed(lambda: (model.load_state_dict(torch.load(folder / "model.pt", weights_only=True)),
                              optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))))

    def torch_durable_save():  # the same files as torch_save, on disk when it returns (what hasten guarantees)
        folder = folders["torch+fsync"].fresh()
        folder.mkdir()

        def save():
            for name, state in (("model.pt", model.state_dict()), ("optimizer.pt", optimizer.state_dict())):
                with open(folder / name, "wb") as handle:
                    torch.save(state, handle)
                    handle.flush()
                    os.fsync(handle.fileno())
        return timed(save)

    def torch_durable_load():
        folder = folders["torch+fsync"].last
        return timed(lambda: (model.load_state_dict(torch.load(folder / "model.pt", weights_only=True)),
                              optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))))

    # the disk's floor: as many bytes, made beforehand, in 4 files side by side flushed every 64 MB (bench_disk_floor)
    share_mb = max(CHUNK_MB, round(size * 1e9 / 2 ** 20 / 4 / CHUNK_MB) * CHUNK_MB)
    chunk, read_back = os.urandom(1 << 20) * CHUNK_MB, bytearray(share_mb << 20)

    def floor_save():
        folder = folders["floor"].fresh()
        folder.mkdir()

        def save():
            writers = [threading.Thread(target=write_flushed, args=(folder / f"part_{index}", share_mb, chunk, 64))
                       for index in range(4)]
            for writer in writers:
                writer.start()
            for writer in writers:
                writer.join()
        return timed(save)

    def floor_load():
        def load():
            for index in range(4):
                with open(folders["floor"].last / f"part_{index}", "rb") as handle:
                    handle.readinto(read_back)
        return timed(load)

    variants = {"torch": (torch_save, torch_load), "torch+fsync": (torch_durable_save, torch_durable_load),
                "floor": (floor_save, floor_load),
                "hasten": (lambda: timed(lambda: ours.save_state(folders["hasten"].fresh())),
                           lambda: timed(lambda: ours.load_state(folders["hasten"].last)))}
    if is_installed("accelerate"):
        import accelerate

        reference = accelerate.Accelerator(cpu=True)
        reference.prepare(model, optimizer)
        variants["accelerate"] = (lambda: timed(lambda: reference.save_state(str(folders["accelerate"].fresh()))),
                                  lambda: timed(lambda: reference.load_state(str(folders["accelerate"].last))))
    names = list(variants)
    times = {(name, what): [] for name in names for what in ("save", "load")}
    try:
        for name in names:  # warm-up
            variants[name][0](), variants[name][1]()
        for round_ in range(pairs):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for step, what in enumerate(("save", "load")):
                for name in order:
                    times[(name, what)].append(variants[name][step]())
    finally:
        if not os.environ.get("BENCH_CHECKPOINT_DIR"):
            shutil.rmtree(root, ignore_errors=True)
    rows = []
    for what in ("save", "load"):
        for name in names:
            mine = times[(name, what)]
            ratio = statistics.median(a / b for a, b in zip(mine, times[("torch", what)]))
            rows.append({"benchmark": f"{what}_state {size:.1f} GB, paired", "variant": name,
                         "median_s": statistics.median(mine), "ratio": ratio, "rounds": pairs})
            print(f"{what:<5} {name:<12} median {statistics.median(mine):.3f} s  median per-round ratio to torch "
                  f"{ratio:.2f}x", flush=True)
    return rows


if __name__ == "__main__":
    if "--paired" in sys.argv:
        paired(int(os.environ.get("BENCH_PAIRS", 30)))
    elif "--checksums" in sys.argv:
        checksum_cost()
    elif "--async" in sys.argv:
        async_stall()
    else:
        main()
