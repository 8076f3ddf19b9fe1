"""How fast this machine's disk takes a checkpoint's bytes durably: the floor under any save that flushes (issue 40).

    python bench/bench_disk_floor.py [--megabytes 1216] [--rounds 3] [--folder /tmp]

Writes ``megabytes`` of bytes made beforehand (no serialisation, no checksums: only the disk's part of a save) into
files in ``--folder`` and flushes them (``fsync``), in several ways, the page cache's dirty pages written back
(``os.sync``) before each: one file flushed at the end; one file flushed every 64 MB as it grows; four files side by
side, flushed at the end or every 64 MB (what ``checkpointing/parallel_writes.py`` does). Prints the median seconds
of each. A save that returns with its files on disk cannot be faster than the best of these, whatever it does with
the CPU; plain ``torch.save`` returns once its bytes are in the page cache.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

CHUNK_MB = 64
WAYS = (("1 file, flushed at the end", 1, None), ("1 file, flushed every 64 MB", 1, 64),
        ("4 files side by side, flushed at the end", 4, None), ("4 files side by side, flushed every 64 MB", 4, 64))


def write_flushed(path: Path, megabytes: int, chunk: bytes, every_mb: int | None) -> None:
    """``megabytes`` of ``chunk`` into ``path``, flushed every ``every_mb`` (None: once, at the end)."""
    with open(path, "wb") as handle:
        written = 0
        while written < megabytes:
            handle.write(chunk)
            written += CHUNK_MB
            if every_mb and written % every_mb == 0:
                os.fdatasync(handle.fileno())
        handle.flush()
        os.fsync(handle.fileno())


def timed_write(folder: Path, megabytes: int, files: int, every_mb: int | None, chunk: bytes) -> float:
    os.sync()
    start = time.perf_counter()
    writers = [threading.Thread(target=write_flushed, args=(folder / f"part_{index}", megabytes // files, chunk,
                                                            every_mb)) for index in range(files)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    elapsed = time.perf_counter() - start
    for index in range(files):
        (folder / f"part_{index}").unlink()
    return elapsed


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=int, default=1216, help="the checkpoint's size (default: 101M + AdamW)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--folder", default=None, help="where to write (default: the temporary folder)")
    args = parser.parse_args(argv)
    chunk = os.urandom(1 << 20) * CHUNK_MB
    rows = []
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        times = {name: [] for name, _, _ in WAYS}
        for _ in range(args.rounds):
            for name, files, every_mb in WAYS:
                times[name].append(timed_write(Path(folder), args.megabytes, files, every_mb, chunk))
    for name, _, _ in WAYS:
        median = statistics.median(times[name])
        print(f"{args.megabytes} MB, {name:<42} {median:.3f} s ({args.megabytes / 1024 / median:.2f} GB/s)",
              flush=True)
        rows.append({"benchmark": f"durable write of {args.megabytes} MB, {name}", "value": f"{median:.3f} s",
                     "ratio": 1.0})
    return rows


if __name__ == "__main__":
    main()
