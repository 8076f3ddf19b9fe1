"""``DataLoaderDispatcher``: the main process reads, every process receives its share.

Each step, process 0 reads the step's batches (one to split, or one per process), plans what each process
gets (``dispatch_plan``) and broadcasts it: a small header tensor (what follows, is it the last step, how many
real samples), the batch layout only when it changed since the previous step (strings and other non-tensor
fields travel with it), then the tensors, grouped by dtype. Every failure on process 0 (reading the data,
planning) is sent to the others as an error, so all processes raise together instead of waiting forever.
"""
from __future__ import annotations

import math
import pickle
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch.utils.data import Dataset, IterableDataset, IterDataPipe

from ..collectives.operations import (
    broadcast,
    broadcast_object_list,
    get_data_structure,
    initialize_tensors,
    send_to_device,
)
from ..core.aliases import Device
from ..state import PartialState
from .dispatch_plan import SLICE, batch_size_of, plan_step, process_bounds, slice_batch
from .loader_core import PreparedDataLoader
from .placement import as_device, on_device
from .validation import check_process_layout, check_split_batch_size

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["DataLoaderDispatcher"]

# Header codes (first entry of the header tensor).
_STOP, _SAME_LAYOUT, _NEW_LAYOUT, _ERROR = 0, 1, 2, 3


def _tensor_leaves(data, out: list) -> list:
    """The tensors of ``data`` in the order ``get_data_structure`` / ``initialize_tensors`` visit them."""
    if isinstance(data, torch.Tensor):
        out.append(data)
    elif isinstance(data, dict) or hasattr(data, "items") and hasattr(data, "keys"):
        for value in data.values():
            _tensor_leaves(value, out)
    elif isinstance(data, (list, tuple)):
        for item in data:
            _tensor_leaves(item, out)
    return out


class DispatchError(RuntimeError):
    """Process 0 failed to produce a batch; raised on every process."""


class DataLoaderDispatcher(PreparedDataLoader):
    """A loader iterated on process 0 only; each process receives its part of every step.

    Parameters:
        dataset: the dataset of the loader process 0 reads.
        split_batches: ``True``: every batch read is cut in ``num_processes`` slices; ``False``: ``num_processes``
            batches are read per step and process ``i`` gets the ``i``-th share.
        skip_batches: steps to skip at the start of the first pass only (to resume mid-epoch).
        use_stateful_dataloader: build on torchdata's ``StatefulDataLoader``.
        even_batches: at the end of the data, complete the last step with samples from the start so that every
            process gets the same amount (ignored with ``drop_last``).
        num_processes, process_index: the data-parallel layout (default: all processes, this one); processes
            outside it (e.g. tensor-parallel peers) receive the same data as their data-parallel rank.
        device: where batches are delivered (default ``PartialState().device``).
        slice_fn: ``slice_fn(batch, slice, process_index=, num_processes=)`` cutting a batch (default: rows of
            tensors and items of per-sample lists).
        **kwargs: the usual ``DataLoader`` arguments.
    """

    def __init__(self, dataset: Dataset, split_batches: bool = False, skip_batches: int = 0,
                 use_stateful_dataloader: bool = False, _drop_last: bool = False, _non_blocking: bool = False,
                 slice_fn: Optional[Callable[..., Any]] = None, torch_device_mesh: Optional[DeviceMesh] = None,
                 iteration: int = 0, even_batches: bool = True, num_processes: Optional[int] = None,
                 process_index: Optional[int] = None, device: Optional[Device] = None, **kwargs: Any):
        if slice_fn is not None and not callable(slice_fn):
            raise TypeError(f"slice_fn_for_dispatch must be callable, got {slice_fn!r}.")
        super().__init__(dataset, skip_batches=skip_batches, use_stateful_dataloader=use_stateful_dataloader,
                         iteration=iteration, **kwargs)
        self.num_processes = self.state.num_processes if num_processes is None else num_processes
        self.process_index = self.state.process_index if process_index is None else process_index
        check_process_layout(self.num_processes, self.process_index, "DataLoaderDispatcher")
        if self.state.num_processes % self.num_processes:
            raise ValueError(
                f"DataLoaderDispatcher sends batches between the {self.state.num_processes} running processes, so "
                f"num_processes={self.num_processes} must divide that number. To simulate other layouts in one "
                "process use dispatch_batches=False."
            )
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.slice_fn = slice_fn
        self.torch_device_mesh = torch_device_mesh
        self.device = self.state.device if device is None else torch.device(device)
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        if split_batches and self.num_processes > 1:
            check_split_batch_size(self._base_batch_size(), self.num_processes,
                                   "DataLoaderDispatcher(split_batches=True)")
        self._pending_first_samples = None
        self._layout = None  # the last layout sent / received

    @property
    def state(self) -> PartialState:
        """The process state (looked up, not stored: a pickled loader then uses the process it is loaded in)."""
        return PartialState()

    @property
    def _reads_data(self) -> bool:
        return self.state.process_index == 0

    # ------------------------------------------------------------------ sizes
    def _base_batch_size(self) -> Optional[int]:
        return self.batch_size if self.batch_size is not None else getattr(self.batch_sampler, "batch_size", None)

    @property
    def _batches_per_step(self) -> int:
        return 1 if self.split_batches else self.num_processes

    @property
    def total_batch_size(self) -> int:
        size = self._base_batch_size()
        return size if self.split_batches else size * self.num_processes

    def _full_length(self) -> int:
        batches = super()._full_length()
        steps = batches if self.split_batches else (
            batches // self.num_processes if self._drop_last else math.ceil(batches / self.num_processes))
        if steps and not self.even_batches and not self._drop_last and not self._owns_last_step():
            steps -= 1
        return steps

    def _owns_last_step(self) -> bool:
        """Whether this process gets a share of the last step when it is not completed (even_batches=False)."""
        try:
            count = len(self.dataset) if isinstance(self.dataset, IterableDataset) else len(self.batch_sampler.sampler)
        except (TypeError, AttributeError):
            return True
        if not self._base_batch_size() or not count:
            return True
        last = count % self.total_batch_size or self.total_batch_size
        return last >= self.num_processes or self.process_index < last

    # ------------------------------------------------------------------ resume
    def _replay_count(self, skip: int) -> int:
        return skip * self._batches_per_step

    def _positioner(self):
        positioner, unit = super()._positioner()
        return positioner, unit * self._batches_per_step

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._pending_first_samples = state_dict.get("dispatch_first_samples")

    # ------------------------------------------------------------------ communication
    def _transport_device(self) -> Optional[torch.device]:
        """Where tensors travel: the process's device (what its collectives use), None when alone."""
        return self.state.device if self.state.use_distributed else None

    def _send_and_receive(self, header: list, layout=None, payload=None):
        """Process 0's ``(header, payload)`` on every process."""
        transport = self._transport_device()
        if transport is None:
            return header, payload
        header_tensor = torch.tensor(header, dtype=torch.int64, device=transport)
        broadcast(header_tensor)
        header = header_tensor.tolist()
        code = header[0]
        if code in (_NEW_LAYOUT, _ERROR):
            box = [layout]
            broadcast_object_list(box)
            layout = box[0]
            if code == _ERROR:
                return header, layout
            self._layout = layout
        if code == _STOP:
            return header, None
        if payload is None:
            payload = initialize_tensors(self._layout, device=transport)
        broadcast(_tensor_leaves(payload, []))
        return header, payload

    def _outgoing(self, plan, is_last: bool) -> tuple:
        """``(header, layout, payload)`` to send for ``plan``; everything that can fail happens here, before
        any communication, so that a failure can still be reported to the other processes."""
        transport = self._transport_device()
        payload, layout, code = plan.payload, None, _SAME_LAYOUT
        if transport is not None:
            if not on_device(payload, as_device(transport)):
                payload = send_to_device(payload, transport, non_blocking=self._non_blocking)
            layout = get_data_structure(payload)
            try:
                changed = not bool(layout == self._layout)
            except Exception:  # a field whose == is not a plain bool
                changed = True
            if changed:
                pickle.dumps(layout)  # an unpicklable field fails here, not halfway through the broadcast
                code = _NEW_LAYOUT
                self._layout = layout
        return [code, int(is_last), plan.mode, plan.real, plan.total], layout, payload

    def _my_share(self, header: list, payload):
        """This process's batch of the step (None when it gets nothing)."""
        mode, total = header[2], header[4]
        if mode == SLICE:
            part = process_bounds(total, self.num_processes, self.process_index)
            if part.start == part.stop:
                return None
            if self.slice_fn is None:
                return slice_batch(payload, part, total)
            return self.slice_fn(payload, part, process_index=self.process_index, num_processes=self.num_processes)
        return payload[self.process_index] if self.process_index < len(payload) else None

    # ------------------------------------------------------------------ iteration
    def _read_step(self, batches) -> list:
        step = []
        for _ in range(self._batches_per_step):
            try:
                step.append(next(batches))
            except StopIteration:
                break
        if self._drop_last and len(step) < self._batches_per_step:
            return []
        return step

    def _first_samples_of(self, step: list):
        """The first ``num_processes`` samples of the pass (to complete its last step like the reference)."""
        first = step[0]
        size = batch_size_of(first)
        if size is None:
            return None
        take = slice(0, min(size, self.num_processes))
        if self.slice_fn is None:
            return slice_batch(first, take, size)
        return self.slice_fn(first, take, process_index=0, num_processes=self.num_processes)

    def __iter__(self):
        self._begin_pass()
        completed = False
        self._layout = None
        try:
            reading = self.state.process_index == 0
            batches = None
            if reading or isinstance(self.dataset, IterDataPipe):  # datapipes share a seed with a collective
                batches = super().__iter__()
            yield from (self._lead(batches) if reading else self._follow())
            completed = True
        finally:
            self._end_pass(completed)

    def _lead(self, batches):
        """Process 0: read, plan, send, and yield its own share."""
        first_samples, self._pending_first_samples = self._pending_first_samples, None
        complete = self.even_batches and not self._drop_last
        snapshot = self._lookahead_snapshotter()
        try:
            for _ in range(self._replay // self._batches_per_step):  # read and drop the skipped steps
                dropped = self._read_step(batches)
                if first_samples is None and dropped:
                    first_samples = self._first_samples_of(dropped)
            current = self._read_step(batches)
        except Exception as error:
            self._send_and_receive([_ERROR, 0, 0, 0, 0], f"{type(error).__name__}: {error}")
            raise
        while current:
            try:
                if first_samples is None:
                    first_samples = self._first_samples_of(current)
                if snapshot is not None:
                    self._lookahead_state = snapshot()
                if first_samples is not None:
                    self._lookahead_state["dispatch_first_samples"] = first_samples
                following = self._read_step(batches)
                is_last = not following
                plan = plan_step(current, split_batches=self.split_batches, num_processes=self.num_processes,
                                 is_last=is_last, complete=complete, first_samples=first_samples,
                                 slice_fn=self.slice_fn)
                outgoing = self._outgoing(plan, is_last)
            except Exception as error:
                self._send_and_receive([_ERROR, 0, 0, 0, 0], f"{type(error).__name__}: {error}")
                raise
            header, payload = self._send_and_receive(*outgoing)
            yield from self._deliver(header, payload)
            current = following
        self._send_and_receive([_STOP, 0, 0, 0, 0])

    def _follow(self):
        """Other processes: receive until process 0 says stop."""
        while True:
            header, payload = self._send_and_receive([_STOP, 0, 0, 0, 0])
            if header[0] == _STOP:
                return
            if header[0] == _ERROR:
                raise DispatchError(f"Process 0 failed to produce the next batch: {payload}")
            yield from self._deliver(header, payload)

    def _deliver(self, header: list, payload):
        mine = self._my_share(header, payload)
        if mine is None:
            return
        if self.device is not None:
            if not on_device(mine, as_device(self.device)):
                mine = send_to_device(mine, self.device, non_blocking=self._non_blocking)
        if header[1]:
            self.end_of_dataloader = True
            self.remainder = header[3]
        self._position += 1
        yield mine
