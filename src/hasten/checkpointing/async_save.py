"""``save_state(..., async_save=True)``: the checkpoint is written while training continues.

What runs before ``save_state`` returns (on the calling thread, with every collective step on the default
process group, exactly as a synchronous save): agreeing on the folder, claiming the staging folder, the save
hooks, and the snapshot, whose tensors are *copied* to CPU memory (``staged_copy``): all of them but the
parameters and optimizer state, which the background thread copies first, before the prepared optimizers' next
step (which waits for it: ``_Staging``), so the training loop goes on at once.

What runs afterwards, in one background thread per process (``PendingSave``): writing this process's files
into the staging folder (flushed to disk, checksummed), then the completion. The background threads never
touch the default process group (the training loop's collectives run there, and two threads issuing
collectives on one group would interleave in a different order on each process and hang): they agree on a
dedicated gloo group created once, collectively, by the first asynchronous save (``completion_group``).
Once every process's files are on disk the main process writes the completion marker, last, renames the
staging folder into place and applies ``total_limit``. A process that dies before that leaves the staging
folder, which is never loaded: the previous checkpoint stays the newest.

At most one save is pending per process. The next ``save_state``, ``load_state``, ``wait_for_everyone`` and
``Accelerator.wait_for_checkpoint`` wait for it first, and raise ``CheckpointError`` if it failed; a pending
save is also finished when the interpreter exits normally.
"""
from __future__ import annotations

import atexit
import copy
import dataclasses
import logging
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from ..state import PartialState
from .checksums import noted_under
from .errors import CheckpointError
from .weights import _alias_key

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["detached_copy", "staged_copy", "copy_now", "optimizer_storage", "changed_in_forward",
           "release_snapshot_memory", "completion_group", "PendingSave", "WriteNow",
           "WriteInBackground", "start", "wait_for_pending", "pending"]

logger = logging.getLogger(__name__)

_group = None  # the gloo group the background threads agree on (one per process, created once)
_group_lock = threading.Lock()
_pending: Optional["PendingSave"] = None


# ----------------------------------------------------------------------------- the snapshot's copy
_buffers: list = []  # CPU tensors of the previous snapshot, reused by the next one (see detached_copy)


def release_snapshot_memory() -> None:
    """Free the CPU copy that asynchronous saves keep for the next one (waits for a pending save first)."""
    wait_for_pending()
    _buffers.clear()


def _buffer(index: int, tensor: torch.Tensor, reuse: bool) -> torch.Tensor:
    if reuse and index < len(_buffers):
        found = _buffers[index]
        if found.shape == tensor.shape and found.dtype == tensor.dtype and found.is_contiguous():
            return found
    pin = tensor.device.type == "cuda"
    fresh = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
    if reuse:
        if index < len(_buffers):
            _buffers[index] = fresh
        else:
            _buffers.append(fresh)
    return fresh


def detached_copy(obj: Any, reuse: bool = False) -> Any:
    """A copy of ``obj`` sharing no memory with the live objects (``staged_copy`` with nothing left for later)."""
    return staged_copy(obj, reuse)[0]


def staged_copy(obj: Any, reuse: bool = False, later: frozenset = frozenset()) -> tuple[Any, list]:
    """A copy of a nested state (dicts, lists, tuples, tensors, plain values) sharing no memory with the live
    objects: every tensor copied to CPU memory (two names of one tensor stay one tensor, so tied weights are
    still stored once). Tensors on an accelerator are copied into pinned memory, with one synchronisation at
    the end.

    ``reuse``: copy into the CPU tensors of the previous call with ``reuse`` (same order, shapes and dtypes)
    instead of new ones. Allocating (and the kernel zeroing) fresh memory costs several times more than the
    copy itself, so an asynchronous save keeps its copy for the next one (one CPU copy of the state stays
    allocated; ``release_snapshot_memory`` frees it). Only valid once the previous copy's save is complete.

    ``later``: storage addresses (``untyped_storage().data_ptr()``) of tensors whose copy may wait — parameters
    and optimizer state, which only the optimizer's next step changes: their buffers are allocated and placed in
    the result now, and ``(buffer, tensor)`` pairs returned for ``copy_now`` to fill before that step. Returns
    ``(copy, pairs left to copy)``."""
    memo: dict = {}
    devices: set = set()
    count = [0]
    left: list = []

    def copy_tensor(tensor: torch.Tensor) -> torch.Tensor:
        key = _alias_key(tensor)
        if key is not None and key in memo:
            return memo[key]
        tensor = tensor.detach()
        result = _buffer(count[0], tensor, reuse)
        count[0] += 1
        if later and _storage_address(tensor) in later:
            left.append((result, tensor))
        else:
            result.copy_(tensor, non_blocking=tensor.device.type == "cuda")
            if tensor.device.type != "cpu":
                devices.add(tensor.device)
        if key is not None:
            memo[key] = result
        return result

    def copy_shard(tensor) -> Any:
        """A DTensor: its local shard copied, wrapped again with the same mesh and placements."""
        from torch.distributed.tensor import DTensor

        local = copy_tensor(tensor.to_local())
        return DTensor.from_local(local, tensor.device_mesh, tensor.placements, run_check=False,
                                  shape=tensor.shape, stride=tensor.stride())

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return copy_shard(value) if hasattr(value, "device_mesh") else copy_tensor(value)
        if isinstance(value, dict):
            copied = {key: walk(item) for key, item in value.items()}
            if type(value) is dict:
                return copied
            try:
                return type(value)(copied)
            except TypeError:
                return copied
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(walk(item) for item in value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.replace(value, **{field.name: walk(getattr(value, field.name))
                                                 for field in dataclasses.fields(value) if field.init})
        return copy.deepcopy(value)

    result = walk(obj)
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return result, left


def _storage_address(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return -1  # a tensor without ordinary storage: copied at once


def copy_now(pairs: list) -> None:
    """Fill the buffers ``staged_copy`` left for later (``(buffer, live tensor)`` pairs)."""
    devices = set()
    for buffer, tensor in pairs:
        buffer.copy_(tensor, non_blocking=tensor.device.type == "cuda")
        if tensor.device.type == "cuda":
            devices.add(tensor.device)
    for device in devices:
        torch.cuda.synchronize(device)


def changed_in_forward(models: list) -> frozenset:
    """Storage addresses of parameters a forward pass changes in place: an ``nn.Embedding`` / ``nn.EmbeddingBag``
    with ``max_norm`` renormalises the rows it looks up. Their copy cannot wait for the optimizer's next step."""
    found = set()
    for model in models:
        for module in model.modules():
            if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.max_norm is not None:
                weight = module.weight
                found.add(_storage_address(weight.to_local() if hasattr(weight, "to_local") else weight))
    return frozenset(found)


def optimizer_storage(optimizers: list) -> frozenset:
    """Storage addresses of the parameters and optimizer state of ``optimizers`` (prepared or plain)."""
    found = set()
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)
        for group in getattr(inner, "param_groups", []):
            for parameter in group["params"]:
                local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
                found.add(_storage_address(local))
                for value in inner.state.get(parameter, {}).values():
                    if isinstance(value, torch.Tensor):
                        value = value.to_local() if hasattr(value, "to_local") else value
                        found.add(_storage_address(value))
    found.discard(-1)
    return frozenset(found)


# ----------------------------------------------------------------------------- copying before the next step
class _Staging:
    """The copy an asynchronous save leaves for its background thread (``copy_now``), and the one-time wait of the
    optimizers' next step for it: until it is done, ``optimizer.step()`` (through a step pre-hook registered once
    per optimizer) blocks; the hook costs one attribute test when nothing is pending."""

    def __init__(self) -> None:
        self.done: Optional[threading.Event] = None
        self.error: Optional[BaseException] = None
        self._hooked: "weakref.WeakSet" = weakref.WeakSet()

    def begin(self, optimizers: list) -> threading.Event:
        for optimizer in optimizers:
            inner = getattr(optimizer, "optimizer", optimizer)
            if hasattr(inner, "register_step_pre_hook") and inner not in self._hooked:
                inner.register_step_pre_hook(self._before_step)
                self._hooked.add(inner)
        self.done = threading.Event()
        return self.done

    def wait(self) -> None:
        done = self.done
        if done is not None:
            done.wait()

    def _before_step(self, *_: Any) -> None:
        self.wait()


_staging = _Staging()

# ----------------------------------------------------------------------------- agreeing in the background
def completion_group() -> Optional[ProcessGroup]:
    """Collective on the first call (every process, from the calling thread): the gloo group that background
    threads agree on; None when this is a single process."""
    global _group
    state = PartialState()
    if not state.use_distributed:
        return None
    with _group_lock:
        if _group is None:
            import torch.distributed as dist

            _group = dist.new_group(backend="gloo")
        return _group


def _agree(group, error: Optional[BaseException], during: str) -> Optional[BaseException]:
    """Exchange outcomes over ``group``: this process's error, or an error naming the process that failed."""
    if group is None:
        return error
    import torch.distributed as dist

    outcome = None if error is None else (type(error).__name__, str(error))
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, outcome, group=group)
    if error is not None:
        return error
    for index, found in enumerate(everyone):
        if found is not None:
            return CheckpointError(f"{during} failed on process {index} (so it stops here too): "
                                   f"{found[0]}: {found[1]}")
    return None


# ----------------------------------------------------------------------------- the pending save
class PendingSave:
    """One save whose files are written by a background thread (see the module docstring): ``write()``, then,
    once every process of ``group`` (None: this one alone) wrote its files, ``complete()``; ``abandon(error)`` when
    writing failed anywhere."""

    def __init__(self, folder: Path, write: Callable[[], None], complete: Callable[[], None],
                 abandon: Callable[[BaseException], None], group: Optional[ProcessGroup]):
        self.folder = folder
        self._write, self._complete, self._abandon, self._group = write, complete, abandon, group
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="hasten-async-save", daemon=True)

    def _run(self) -> None:
        try:
            error = None
            try:
                self._write()
            except BaseException as failure:  # noqa: BLE001 - agreed on, then reported by wait()
                error = failure
            error = _agree(self._group, error, "writing the checkpoint")
            if error is not None:
                self._abandon(error)
                self.error = error
                return
            try:
                self._complete()
            except BaseException as failure:  # noqa: BLE001
                error = failure
            self.error = _agree(self._group, error, "completing the checkpoint")
        except BaseException as failure:  # noqa: BLE001 - e.g. the group went away: never completes
            self.error = self.error or failure

    def start(self) -> None:
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()


# ----------------------------------------------------------------------------- now, or in the background
class WriteNow:
    """A synchronous save's writing: the snapshot as taken, the save hooks and the files written on the calling
    thread, then the checkpoint completed, each step agreed on by every process (``SaveTransaction``)."""

    group = None  # the writers' collectives use the run's default group

    def copy(self, snapshot: Any, optimizers: list = (), hooks: bool = False, models: list = ()) -> Any:
        return snapshot

    def run(self, transaction: Any, run_hooks: Callable[[Path], None], write: Callable[[Path], None],
            complete: Callable[[], None], failed: Callable[[BaseException], None]) -> None:
        """Write, then ``complete()`` on every process (the writer of the shared files completes the checkpoint
        in it). A failure raises here, to the caller, which reports it (``failed`` is not needed)."""
        def hooks_then_write(staging: Path) -> None:
            run_hooks(staging)
            write(staging)

        transaction.write(hooks_then_write)
        transaction.complete(complete)

    def finish_alone(self, folder: Path, finish: Callable[[], None],
                     abandon: Callable[[BaseException], None]) -> None:
        """A step of this process only (adding its files to a checkpoint the main process wrote): now."""
        finish()


class WriteInBackground:
    """An asynchronous save's writing, the same steps as ``WriteNow`` around the same format: the snapshot copied
    to CPU memory (``staged_copy``: the parameters and optimizer state by the background thread, before the
    optimizers' next step), the save hooks on the calling thread, then writing and completing in a background
    thread (``PendingSave``) that agrees on a gloo group of its own (``completion_group``). ``every_process``:
    every process takes part (else this one alone: no group)."""

    def __init__(self, every_process: bool):
        self.group = completion_group() if every_process else None  # collective, on the first async save
        self._left: list = []
        self._optimizers: list = []

    def copy(self, snapshot: Any, optimizers: list = (), hooks: bool = False, models: list = ()) -> Any:
        """The snapshot's copy, with the parameters' and ``optimizers``' state left for the background thread to
        copy before the optimizers' next step (``staged_copy``); all of it now when save ``hooks`` will read it,
        and now the parameters of ``models`` that a forward changes (``changed_in_forward``)."""
        later = optimizer_storage(list(optimizers)) - changed_in_forward(list(models)) if not hooks else frozenset()
        copied, self._left = staged_copy(snapshot, reuse=True, later=later)
        self._optimizers = list(optimizers)
        return copied

    def _copy_left(self, done: threading.Event) -> None:
        try:
            copy_now(self._left)
        finally:
            self._left = []
            done.set()  # the optimizers' next step goes on (a failure is reported by the save)

    def run(self, transaction: Any, run_hooks: Callable[[Path], None], write: Callable[[Path], None],
            complete: Callable[[], None], failed: Callable[[BaseException], None]) -> None:
        """The hooks now (user code, collectively, on this thread); writing and ``complete()`` in the background.
        ``failed(error)``: told when the background save fails, after the staging folder is removed."""
        transaction.write(run_hooks, during="running the save hooks")

        def abandon(error: BaseException) -> None:
            transaction.abandon()
            failed(error)

        def complete_or_report() -> None:
            try:
                complete()
            except BaseException as error:
                failed(error)
                raise

        done = _staging.begin(self._optimizers) if self._left else None

        def copy_then_write() -> None:
            if done is not None:
                self._copy_left(done)
            write(transaction.staging)
            if not transaction.writes_shared_files:  # the marker's writer checksums these files itself here
                noted_under(transaction.staging)

        start(PendingSave(transaction.final, copy_then_write, complete_or_report, abandon, self.group))

    def finish_alone(self, folder: Path, finish: Callable[[], None],
                     abandon: Callable[[BaseException], None]) -> None:
        """A step of this process only, in the background (nothing to write: the files are staged already)."""
        start(PendingSave(folder, lambda: None, finish, abandon, None))


def start(save: PendingSave) -> None:
    global _pending
    wait_for_pending()
    _pending = save
    save.start()


def pending() -> Optional[PendingSave]:
    """The asynchronous save of this process still being written, or None."""
    return _pending if _pending is not None and not _pending.done() else None


_said_waiting = False


def wait_for_pending(before: Optional[str] = None) -> Optional[str]:
    """Wait until this process's asynchronous save (if any) is complete; returns its folder. Raises
    ``CheckpointError`` if it failed (then it is forgotten: the previous checkpoint is still the newest).
    ``before`` names what waits (``"the next save"``): when the previous save is still writing, that is logged,
    once per process, since it means saves come faster than the disk takes them."""
    global _pending, _said_waiting
    save = _pending
    if save is None:
        return None
    if before is not None and not save.done() and not _said_waiting:
        _said_waiting = True
        logger.warning("The asynchronous save to %s is still being written: %s waits for it to finish (said once; "
                       "saves are coming faster than this disk writes them).", save.folder, before)
    save.join()
    _pending = None
    if save.error is not None:
        raise CheckpointError(
            f"The asynchronous save_state to {save.folder} failed, so it was never completed (the previous "
            f"checkpoint is still the newest): {type(save.error).__name__}: {save.error}"
        ) from save.error
    return str(save.folder)


@atexit.register
def _finish_at_exit() -> None:
    try:
        wait_for_pending()
    except CheckpointError as error:
        logger.error("%s", error)
