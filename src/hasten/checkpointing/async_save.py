"""``save_state(..., async_save=True)``: the checkpoint is written while training continues.

What runs before ``save_state`` returns, on the calling thread, with no collective: the snapshot, whose tensors are
*copied* to CPU memory (``staged_copy``): all of them but the parameters and optimizer state, which only the
prepared optimizers' next step changes: those are copied once every process has taken its snapshot, by the
background thread, or by that step if it comes first (``_Staging``), so the training loop goes on at once without
waiting for any other process, and the copies do not take the CPU from the processes still taking their snapshots.

What runs afterwards, in one background thread per process (``PendingSave``, run by ``_Worker``), the same steps as a
synchronous save, each agreed on by every process: that every snapshot was taken, staging the folder, writing this
process's files into it (flushed to disk, checksummed), then the completion. The background threads never touch the
default process group (the training loop's collectives run there, and two threads issuing collectives on one group
would interleave in a different order on each process and hang): they agree on a dedicated gloo group created once,
collectively, by the first asynchronous save (``completion_group``). Once every process's files are on disk the main
process writes the completion marker, last, renames the staging folder into place and applies ``total_limit``. A
process that dies before that leaves the staging folder, which is never loaded: the previous checkpoint stays the
newest. A process whose snapshot fails raises at once; the others raise at their next save, load or
``wait_for_checkpoint``.

With save hooks (user code that writes into the staging folder, collectively, on the calling thread) the folder is
staged and the hooks run before ``save_state`` returns, agreed on over the default group as in a synchronous save.

At most one save is pending per process. The next ``save_state``, ``load_state``, ``wait_for_everyone`` and
``Accelerator.wait_for_checkpoint`` wait for it first, and raise ``CheckpointError`` if it failed; a pending
save is also finished when the interpreter exits normally.
"""
from __future__ import annotations

import atexit
import copy
import dataclasses
import logging
import queue
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from ..collectives.process_view import ProcessView
from ..state import PartialState
from .agreement import together
from .errors import CheckpointError
from .weights import PLAIN_TENSOR_TYPES, _alias_key

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["detached_copy", "staged_copy", "copy_now", "optimizer_storage", "changed_in_forward",
           "release_snapshot_memory", "completion_group", "completion_view", "PendingSave", "SaveSteps", "WriteNow",
           "WriteInBackground", "start", "wait_for_pending", "pending"]

logger = logging.getLogger(__name__)

_group = None  # the gloo group the background threads agree on (one per process, created once)
_group_lock = threading.Lock()
_pending: Optional["PendingSave"] = None


# ----------------------------------------------------------------------------- the snapshot's copy
_buffers: list = []  # CPU tensors of the previous snapshot, reused by the next one (see detached_copy)
_shards: dict = {}  # id(buffer) -> (buffer, mesh, placements, shape, stride, the DTensor wrapping it), reused too
_IMMUTABLE = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)
_PLAIN_TYPES = frozenset({int, float, bool, str, bytes, type(None)})


def release_snapshot_memory() -> None:
    """Free the CPU copy that asynchronous saves keep for the next one (waits for a pending save first)."""
    wait_for_pending()
    _buffers.clear()
    _shards.clear()


_dtensor_class: Any = None  # torch's DTensor, imported once (a snapshot meets it once per tensor)


def _dtensor() -> Any:
    """torch's DTensor class (an empty tuple, which no ``isinstance`` matches, where torch has none)."""
    global _dtensor_class
    if _dtensor_class is None:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:  # a torch built without distributed support
            DTensor = ()  # noqa: N806
        _dtensor_class = DTensor
    return _dtensor_class


def _is_dtensor(value: torch.Tensor) -> bool:
    """Whether ``value`` is a DTensor (or another tensor with a device mesh); a plain tensor answers at once."""
    if type(value) in PLAIN_TENSOR_TYPES:
        return False
    return isinstance(value, _dtensor()) or hasattr(value, "device_mesh")


def _wrapped(local: torch.Tensor, tensor: Any, reuse: bool) -> Any:
    """``local`` (the copy of DTensor ``tensor``'s shard) as a DTensor of ``tensor``'s mesh, placements and global
    shape; with ``reuse``, the one the previous snapshot built around the same buffer when nothing changed (building
    one costs more than copying a small shard)."""
    mesh, placements, shape, stride = tensor.device_mesh, tensor.placements, tensor.shape, tensor.stride()
    found = _shards.get(id(local)) if reuse else None
    if found is not None and found[0] is local and found[1] is mesh and found[2:5] == (placements, shape, stride):
        return found[5]
    result = _dtensor().from_local(local, mesh, placements, run_check=False, shape=shape, stride=stride)
    if reuse:
        _shards[id(local)] = (local, mesh, placements, shape, stride, result)
    return result


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

    def copy_tensor(tensor: torch.Tensor) -> torch.Tensor:  # under no_grad: no autograd record, no detach
        key = _alias_key(tensor)
        if key is not None and key in memo:
            return memo[key]
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

    def walk(value: Any) -> Any:
        if isinstance(value, _IMMUTABLE):
            return value
        if isinstance(value, torch.Tensor):
            if _is_dtensor(value):  # a DTensor: its local shard copied, wrapped again the same way
                return _wrapped(copy_tensor(_local(value)), value, reuse)
            return copy_tensor(value)
        if isinstance(value, dict):
            copied = {key: walk(item) for key, item in value.items()}
            if type(value) is dict:
                return copied
            try:
                return type(value)(copied)
            except TypeError:
                return copied
        if isinstance(value, (list, tuple)) and _plain(value):  # Python's random state: 625 ints, nothing to walk
            return list(value) if isinstance(value, list) else value
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(walk(item) for item in value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.replace(value, **{field.name: walk(getattr(value, field.name))
                                                 for field in dataclasses.fields(value) if field.init})
        return copy.deepcopy(value)

    with torch.no_grad():
        result = walk(obj)
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return result, left


def _plain(items: Any) -> bool:
    """Whether a list's or tuple's items are all plain values of the exact builtin types (nothing inside to copy)."""
    return set(map(type, items)) <= _PLAIN_TYPES


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this process (its ``_local_tensor``: what ``to_local()`` returns, without the autograd
    call that costs more than copying a small shard), or ``tensor`` itself."""
    local = getattr(tensor, "_local_tensor", None)
    if isinstance(local, torch.Tensor):
        return local
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _storage_address(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return -1  # a tensor without ordinary storage: copied at once


def copy_now(pairs: list) -> None:
    """Fill the buffers ``staged_copy`` left for later (``(buffer, live tensor)`` pairs)."""
    devices = set()
    with torch.no_grad():  # the live tensors may require grad: the copy records nothing
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
                found.add(_storage_address(_local(weight)))
    return frozenset(found)


def optimizer_storage(optimizers: list) -> frozenset:
    """Storage addresses of the parameters and optimizer state of ``optimizers`` (prepared or plain)."""
    found = set()
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)
        for group in getattr(inner, "param_groups", []):
            for parameter in group["params"]:
                local = _local(parameter)
                found.add(_storage_address(local))
                for value in inner.state.get(parameter, {}).values():
                    if isinstance(value, torch.Tensor):
                        value = _local(value)
                        found.add(_storage_address(value))
    found.discard(-1)
    return frozenset(found)


# ----------------------------------------------------------------------------- copying before the next step
class _Staging:
    """The copy an asynchronous save leaves for later (``copy_now``: the parameters and optimizer state), made once,
    by whichever thread asks first: the background thread once every process has taken its snapshot (so the copies
    do not take the CPU from the processes still taking theirs), or the optimizers' next step if it comes sooner
    (through a step pre-hook registered once per optimizer, which costs one attribute test when nothing is
    pending). The other thread waits until it is made."""

    def __init__(self) -> None:
        self.done: Optional[threading.Event] = None
        self.error: Optional[BaseException] = None
        self._pairs: list = []
        self._claim = threading.Lock()
        self._hooked: "weakref.WeakSet" = weakref.WeakSet()

    def begin(self, optimizers: list, pairs: list) -> None:
        """``pairs`` (``(buffer, live tensor)``) are to be copied before any of ``optimizers`` steps."""
        for optimizer in optimizers:
            inner = getattr(optimizer, "optimizer", optimizer)
            if hasattr(inner, "register_step_pre_hook") and inner not in self._hooked:
                inner.register_step_pre_hook(self._before_step)
                self._hooked.add(inner)
        self._pairs, self.error, self.done = pairs, None, threading.Event()

    def copy(self) -> None:
        """Copy the pairs unless the other thread did or is doing it; return once they are copied. Raises the
        copy's error (in either thread)."""
        done = self.done
        if done is None:
            return
        with self._claim:
            pairs, self._pairs = self._pairs, []
        if not pairs:
            done.wait()
            if self.error is not None:
                raise CheckpointError(f"Copying the state for the asynchronous save failed: {self.error}") \
                    from self.error
            return
        try:
            copy_now(pairs)
        except BaseException as error:
            self.error = error
            raise
        finally:
            done.set()

    def _before_step(self, *_: Any) -> None:
        done = self.done
        if done is None or done.is_set():
            return
        try:
            self.copy()
        except Exception:  # noqa: BLE001 - the save fails with it: raised at the next save, load or wait
            logger.debug("The asynchronous save's copy failed before the optimizer's step", exc_info=True)


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


def completion_view() -> Optional[ProcessView]:
    """Collective on the first call (see ``completion_group``): every process seen over that group, with CPU
    tensors (gloo) and each process's place on its machine; None when this is a single process."""
    group = completion_group()
    if group is None:
        return None
    import torch.distributed as dist

    state = PartialState()
    return ProcessView(group=group, num_processes=dist.get_world_size(group), process_index=dist.get_rank(group),
                       device=torch.device("cpu"), backend="gloo", local_process_index=state.local_process_index)


# ----------------------------------------------------------------------------- the pending save
class PendingSave:
    """One save that ``work()`` finishes in this process's background thread (``_Worker``); its error, if any, is
    kept for ``wait_for_pending`` to raise."""

    def __init__(self, folder: Path, work: Callable[[], None]):
        self.folder = folder
        self._work = work
        self.error: Optional[BaseException] = None
        self._finished = threading.Event()

    def _run(self) -> None:
        try:
            self._work()
        except BaseException as failure:  # noqa: BLE001 - raised by wait_for_pending, on the caller's thread
            self.error = failure
        finally:
            self._finished.set()

    def start(self) -> None:
        _worker.run(self._run)

    def done(self) -> bool:
        return self._finished.is_set()

    def join(self) -> None:
        self._finished.wait()


class _Worker:
    """This process's one background thread, which finishes the asynchronous saves one after the other; the first
    save starts it. (Starting a thread per save made ``save_state`` wait until the new thread was first scheduled:
    ~0.3 ms, more while every core is busy.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():  # the first save, or a forked child's
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._serve, args=(self._jobs,), name="hasten-async-save",
                                                daemon=True)
                self._thread.start()
            self._jobs.put(job)

    @staticmethod
    def _serve(jobs: "queue.SimpleQueue") -> None:
        while True:
            jobs.get()()  # a PendingSave's _run: it keeps its own error


_worker = _Worker()


# ----------------------------------------------------------------------------- now, or in the background
@dataclasses.dataclass(frozen=True)
class SaveSteps:
    """One save's steps, as ``saving.py`` builds them, for ``WriteNow.run`` / ``WriteInBackground.run``."""

    folder: Path  # the checkpoint's final folder
    processes: Optional[ProcessView]  # who takes part (None: every process, over the run's default group)
    prepare: Callable[[Optional[ProcessView]], Any]  # stages the folder, agreed on by those processes: the transaction
    run_hooks: Callable[[Path], None]  # the save hooks, into the staging folder
    write: Callable[[Any, Path], None]  # (transaction, staging folder): this process's files
    complete: Callable[[Any], None]  # (transaction): every process, once all wrote their files
    failed: Callable[[BaseException], None]  # told when a background save fails, after its folder is removed


class WriteNow:
    """A synchronous save's writing: the snapshot as taken, the folder staged, the save hooks and the files written
    on the calling thread, then the checkpoint completed, each step agreed on by every process
    (``SaveTransaction``)."""

    group = None  # the writers' collectives use the run's default group

    def take(self, during: str, function: Callable[[], Any], processes: Optional[ProcessView]) -> Any:
        """``function()`` (the snapshot), agreed on by ``processes`` at once (``agreement.together``)."""
        return together(during, function, processes=processes)

    def copy(self, snapshot: Any, optimizers: list = (), models: list = ()) -> Any:
        return snapshot

    def run(self, steps: SaveSteps) -> None:
        """Stage, write, then ``complete`` on every process (the writer of the shared files completes the
        checkpoint in it). A failure raises here, to the caller, which reports it (``failed`` is not needed)."""
        transaction = steps.prepare(steps.processes)

        def hooks_then_write(staging: Path) -> None:
            steps.run_hooks(staging)
            steps.write(transaction, staging)

        transaction.write(hooks_then_write)
        transaction.complete(lambda: steps.complete(transaction))

    def finish_alone(self, folder: Path, finish: Callable[[], None]) -> None:
        """A step of this process only (adding its files to a checkpoint the main process wrote): now."""
        finish()


class WriteInBackground:
    """An asynchronous save's writing, the same steps as ``WriteNow`` around the same format, with only the
    snapshot taken on the calling thread: copied to CPU memory (``staged_copy``; the parameters and optimizer state
    later, before the optimizers' next step: ``_Staging``), then everything else in a background thread
    (``PendingSave``): agreeing that every process took its snapshot, staging the folder, writing, completing,
    each step agreed on over a gloo group of its own (``completion_view``), so ``save_state`` returns without
    waiting for any other process. With save ``hooks`` (user code, run collectively on the calling thread, which
    writes into the staged folder) the folder is staged and the hooks run before ``save_state`` returns, and the
    snapshot is copied whole. ``every_process``: every process takes part (else this one alone: no group)."""

    def __init__(self, every_process: bool, hooks: bool = False):
        self.view = completion_view() if every_process else None  # collective, on the first async save
        self.group = self.view.group if self.view is not None else None
        self.hooks = hooks
        self._taking = "taking the snapshot"  # what ``take`` was told it does: the background agrees on it by name
        self._left: list = []
        self._optimizers: list = []

    def take(self, during: str, function: Callable[[], Any], processes: Optional[ProcessView]) -> Any:
        """``function()`` (the snapshot). With hooks, agreed on at once, as ``WriteNow`` does; else the background
        thread agrees on it (``run``), and a process whose snapshot failed agrees from here and raises at once
        (the others raise at their next save, load or ``wait_for_checkpoint``)."""
        self._taking = during
        if self.hooks:
            return together(during, function, processes=processes)
        try:
            return function()
        except Exception as error:  # noqa: BLE001 - the others hear of it in their background thread
            failure = error

        def fail() -> None:
            raise failure

        return together(during, fail, processes=self.view or processes)  # raises ``failure``, once all know

    def copy(self, snapshot: Any, optimizers: list = (), models: list = ()) -> Any:
        """The snapshot's copy, with the parameters' and ``optimizers``' state left to copy before the optimizers'
        next step (``staged_copy``, ``_Staging``); all of it now when save hooks will read it, and
        now the parameters of ``models`` that a forward changes (``changed_in_forward``)."""
        later = frozenset() if self.hooks else optimizer_storage(list(optimizers)) - changed_in_forward(list(models))
        copied, self._left = staged_copy(snapshot, reuse=True, later=later)
        self._optimizers = list(optimizers)
        return copied

    def run(self, steps: SaveSteps) -> None:
        """With hooks: stage and run them now (collectively, on this thread). The rest in the background, agreed
        on over ``completion_view`` (the given processes when this process saves alone)."""
        transaction = None
        if self.hooks:
            transaction = steps.prepare(steps.processes)
            transaction.write(steps.run_hooks, during="running the save hooks")
        left, self._left = self._left, []
        if left:
            _staging.begin(self._optimizers, left)
        view = self.view or steps.processes

        def finish() -> None:
            nonlocal transaction
            try:
                if transaction is None:
                    together(self._taking, lambda: None, processes=view)  # every process took its snapshot
                    if left:  # now the copy (unless the optimizers' next step came first and made it)
                        together("copying the parameters and optimizer state", _staging.copy, processes=view)
                    transaction = steps.prepare(view)
                else:
                    transaction.agree_over(view)
                transaction.write(lambda staging: steps.write(transaction, staging))
                transaction.complete(lambda: steps.complete(transaction))
            except BaseException as error:
                steps.failed(error)
                raise

        start(PendingSave(steps.folder, finish))

    def finish_alone(self, folder: Path, finish: Callable[[], None]) -> None:
        """A step of this process only, in the background (nothing to write: the files are staged already)."""
        start(PendingSave(folder, finish))


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
