"""Writing a checkpoint's files side by side, each in its own thread.

A full-state checkpoint is a few large files (the model's weights, the optimizer's state) and a few small ones.
Written one after the other, the disk waits while the next file is pickled and the CPU waits while the previous one
is flushed; writing them at once overlaps the two (copying into the page cache, the flush each ``DurableFile`` asks
for, the checksum started when a file closes, and pickling all release the GIL for most of their time). On this
project's 2-core machine a 100M-parameter model with AdamW saves in about the time plain ``torch.save`` takes
without flushing anything (bench/RESULTS.md, issue 40).

``write_files`` returns only once every write has finished, so nothing writes into a staging folder after the save
gave up on it, and raises the first failure (in the order the writes were given).
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Sequence

from .writers import without_zip_checksums

__all__ = ["write_files", "writers", "ENV_VARIABLE"]

#: the most files written at once; 1 writes them one after the other
ENV_VARIABLE = "HASTEN_CHECKPOINT_WRITERS"
_DEFAULT_WRITERS = 4


def writers() -> int:
    """How many files are written at once: ``HASTEN_CHECKPOINT_WRITERS``, else 4."""
    value = os.environ.get(ENV_VARIABLE, "").strip()
    if not value:
        return _DEFAULT_WRITERS
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{ENV_VARIABLE} must be a whole number of at least 1, got {value!r}.")
    return int(value)


def write_files(writes: Sequence[Callable[[], None]]) -> None:
    """Run every ``write`` (each writes one file) on up to ``writers()`` threads; wait for all of them."""
    count = min(writers(), len(writes))
    if count <= 1:
        for write in writes:
            write()
        return
    pending = list(enumerate(writes))
    lock = threading.Lock()
    errors: dict[int, BaseException] = {}

    def work() -> None:
        while True:
            with lock:
                if not pending:
                    return
                index, write = pending.pop(0)
            try:
                write()
            except BaseException as error:  # noqa: BLE001 - raised by the caller's thread below
                errors[index] = error

    # torch.save's CRC switch is one process-wide setting: set once around all writers, not by each in turn
    with without_zip_checksums():
        threads = [threading.Thread(target=work, name=f"hasten-writer-{index}", daemon=True)
                   for index in range(count)]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:  # interrupted while waiting: the writes still end before the save gives up
            for thread in threads:
                thread.join()
            raise
    if errors:
        raise errors[min(errors)]
