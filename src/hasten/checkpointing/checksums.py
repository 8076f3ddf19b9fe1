"""A fast checksum of every checkpoint file, recorded in the completion marker and checked on load.

Sizes alone miss a file whose bytes changed in place (a bad disk sector, a copy that went wrong, an edit):
``torch.load`` and safetensors load such a file silently. The marker therefore also records a CRC of each
file, computed while the file is written (or, for a file written by another library, read back from the page
cache once it is closed), and ``load_state`` recomputes it before anything is loaded.

The work overlaps with the rest of the save or load: each file written through ``writers.DurableFile`` is
checksummed from its bytes as they are written (``RunningChecksum``: nothing is read back; several files are
written at once, ``parallel_writes.py``); a file written otherwise is checksummed in a background thread once
it is closed (``note_written``), read through a memory map (no copy); on load, the checksums are recomputed in
background threads while the files are parsed, and compared before anything is applied. Both CRC functions
release the GIL.

The CRC is CRC-32C through the ``crc32c`` package when it is installed (hardware instructions, ~14 GB/s),
else CRC-32 from the standard library's ``zlib`` (~4 GB/s). The marker names the algorithm with each value;
a checkpoint whose algorithm is not available where it is loaded is loaded with its sizes checked only, and
a warning. ``HASTEN_CHECKPOINT_CHECKSUMS=0`` turns checksums off (neither computed nor checked), e.g. for
checkpoints so large that reading them back costs too much; see docs/checkpointing.md.
"""
from __future__ import annotations

import logging
import mmap
import os
import queue
import threading
import zlib
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

__all__ = ["checksums_enabled", "default_algorithm", "file_checksum", "check_file", "ENV_VARIABLE",
           "note_written", "note_computed", "noted_under", "RunningChecksum", "checksums_of", "check_files_later"]

logger = logging.getLogger(__name__)

ENV_VARIABLE = "HASTEN_CHECKPOINT_CHECKSUMS"
_CHUNK = 8 << 20


def _algorithms() -> dict[str, Callable[[bytes, int], int]]:
    found = {"crc32": lambda data, value: zlib.crc32(data, value)}
    try:
        import crc32c  # optional: pip install crc32c

        found["crc32c"] = lambda data, value: crc32c.crc32c(data, value)
    except ImportError:
        pass
    return found


_ALGORITHMS = _algorithms()
_warned: set = set()


def checksums_enabled() -> bool:
    return os.environ.get(ENV_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


def default_algorithm() -> str:
    return "crc32c" if "crc32c" in _ALGORITHMS else "crc32"


def file_checksum(path: Union[str, os.PathLike], algorithm: Optional[str] = None) -> str:
    """``"{algorithm}:{value:08x}"`` of the file's bytes, read through a memory map in chunks."""
    algorithm = algorithm or default_algorithm()
    update = _ALGORITHMS[algorithm]
    value = 0
    with open(path, "rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size:
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                view = memoryview(mapped)
                try:
                    for start in range(0, size, _CHUNK):
                        value = update(view[start:start + _CHUNK], value)
                finally:
                    view.release()
    return f"{algorithm}:{value & 0xFFFFFFFF:08x}"


# ----------------------------------------------------------------------------- in the background
_pool: Optional["_Workers"] = None
_pool_lock = threading.Lock()
_pending: dict = {}  # absolute path -> (identity of the file when it was closed, Future of its checksum)


class _Workers:
    """Two daemon threads running checksum jobs. Not a ThreadPoolExecutor: its threads are not daemons, and a
    launcher that joins every non-daemon thread before exiting would wait for them forever."""

    def __init__(self, count: int = 2):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        for index in range(count):
            threading.Thread(target=self._run, name=f"hasten-checksum-{index}", daemon=True).start()

    def _run(self) -> None:
        while True:
            future, function, args = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function(*args))
                except BaseException as error:  # noqa: BLE001 - handed to whoever waits on the future
                    future.set_exception(error)

    def submit(self, function, *args) -> Future:
        future: Future = Future()
        self._jobs.put((future, function, args))
        return future


def _executor() -> _Workers:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _Workers()
        return _pool


def _identity(path) -> tuple:
    status = os.stat(path)
    return status.st_ino, status.st_size, status.st_mtime_ns


class RunningChecksum:
    """The checksum of a file computed from its bytes as they are written (no reading back): ``update`` with each
    piece in order, then ``note_computed`` once the file is closed."""

    def __init__(self, algorithm: Optional[str] = None):
        self.algorithm = algorithm or default_algorithm()
        self._update = _ALGORITHMS[self.algorithm]
        self._value = 0

    def update(self, data) -> None:
        self._value = self._update(data, self._value)

    @property
    def value(self) -> str:
        return f"{self.algorithm}:{self._value & 0xFFFFFFFF:08x}"


def note_computed(path: Union[str, os.PathLike], checksum: RunningChecksum) -> None:
    """Record the checksum of a file that was just written and closed, computed while it was written."""
    path = os.path.abspath(os.fspath(path))
    future: Future = Future()
    future.set_result(checksum.value)
    with _pool_lock:
        _pending[path] = (_identity(path), future)


def note_written(path: Union[str, os.PathLike]) -> None:
    """Start checksumming a file that was just written and closed (``checksums_of`` collects the result)."""
    if not checksums_enabled():
        return
    path = os.path.abspath(os.fspath(path))
    future = _executor().submit(file_checksum, path)
    with _pool_lock:
        _pending[path] = (_identity(path), future)


def noted_under(folder: Path) -> dict[str, str]:
    """``relative path -> checksum`` of the files under ``folder`` this process wrote and noted (``note_written``,
    ``note_computed``; unchanged since), taken out of the record: what a process hands to the marker's writer."""
    prefix = os.path.abspath(os.fspath(folder)) + os.sep
    with _pool_lock:
        mine = {path: _pending.pop(path) for path in [path for path in _pending if path.startswith(prefix)]}
    return {path[len(prefix):].replace(os.sep, "/"): future.result() for path, (identity, future) in mine.items()
            if os.path.exists(path) and identity == _identity(path)}


def checksums_of(folder: Path, relatives: Iterable[str], known: Optional[dict] = None) -> dict[str, str]:
    """``relative path -> checksum`` of files under ``folder``: those in ``known`` (computed by the processes that
    wrote them), those started by ``note_written`` (if the file was not changed since), the others computed now,
    in parallel."""
    known = known or {}
    relatives = list(relatives)
    started = {}
    for relative in relatives:
        if relative in known:
            continue
        path = os.path.abspath(os.fspath(Path(folder) / relative))
        with _pool_lock:
            entry = _pending.pop(path, None)
        if entry is None or entry[0] != _identity(path):
            entry = (None, _executor().submit(file_checksum, path))
        started[relative] = entry[1]
    found = {relative: future.result() for relative, future in started.items()}
    return {relative: known[relative] if relative in known else found[relative] for relative in relatives}


def check_files_later(folder: Path, recorded: dict) -> Callable[[], Optional[tuple]]:
    """Start comparing every file with its recorded checksum in the background; returns ``wait()``, which
    gives None, or ``(relative path, checksum now, checksum recorded)`` of the first file that differs."""
    futures = {relative: _executor().submit(check_file, Path(folder) / relative, value)
               for relative, value in recorded.items()}

    def wait() -> Optional[tuple]:
        mismatch = None
        for relative, future in futures.items():
            found = future.result()
            if found is not None and mismatch is None:
                mismatch = (relative, found, recorded[relative])
        return mismatch

    return wait


def check_file(path: Path, recorded: str) -> Optional[str]:
    """None when ``path`` matches its ``recorded`` checksum (or it cannot be checked here), else the checksum
    the file has now."""
    algorithm = recorded.split(":", 1)[0]
    if algorithm not in _ALGORITHMS:
        if algorithm not in _warned:
            _warned.add(algorithm)
            logger.warning("The checkpoint's files carry %s checksums, which cannot be computed here (pip install "
                           "%s to check them); only their sizes are checked.", algorithm, algorithm)
        return None
    actual = file_checksum(path, algorithm)
    return None if actual == recorded else actual
