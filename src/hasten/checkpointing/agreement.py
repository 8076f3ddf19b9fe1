"""Phases of a save or load that every process runs, ending together: all succeed, or all raise.

Without this, a process that fails (a full disk, an object that cannot be saved) raises while the others
wait at the next barrier until the process group's timeout. Here each process runs its part, then all
exchange one line of outcome; the failing process raises its own error, the others an error that names the
process and what went wrong there. When no phase hands in a report, the exchange starts with one all-reduce of a
failure flag (a few bytes, no pickling); the lines are gathered only when some process failed. The lines are
hasten's own (an outcome, a small report), so they are exchanged with ``torch.distributed``'s plain object gather,
without the argument checks of the collectives users call, over the group of the processes taking part (the run's
default group, or the one an asynchronous save agrees on in its background thread).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

import torch
import torch.distributed as dist

from ..collectives.process_view import group_of
from ..state import PartialState
from .errors import CheckpointError

if TYPE_CHECKING:
    from ..collectives.process_view import ProcessView

__all__ = ["together", "together_reporting", "raise_if_any_failed", "gather_failures", "from_main_process",
           "gathered"]

T = TypeVar("T")


def gathered(item: Any, processes: Optional[ProcessView] = None) -> list:
    """Collective: ``item`` (small, picklable) of every process of ``processes`` (default every process), in
    process order."""
    state = processes or PartialState()
    if not state.use_distributed:
        return [item]
    everyone: list = [None] * state.num_processes
    dist.all_gather_object(everyone, item, group=group_of(state))
    return everyone


def from_main_process(values: list, processes: Optional[ProcessView] = None) -> list:
    """Collective: ``values`` (a list, the same length everywhere) replaced in place by the main process's, over the
    group of ``processes`` (default every process); returns it."""
    state = processes or PartialState()
    if state.use_distributed:
        group = group_of(state)
        dist.broadcast_object_list(values, src=0 if group is None else dist.get_global_rank(group, 0), group=group)
    return values


def _some_failed(failed: bool, state) -> bool:
    """Collective: whether any process ``failed`` (one all-reduce of a flag on the processes' device)."""
    flag = torch.tensor([1 if failed else 0], dtype=torch.int32, device=state.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group_of(state))
    return bool(flag.item())


def gather_failures(error: Optional[BaseException],
                    processes: Optional[ProcessView] = None) -> list[tuple[int, str, str]]:
    """Collective: ``(process, error type name, message)`` of every process whose ``error`` is not None."""
    state = processes or PartialState()
    outcome = None if error is None else (type(error).__name__, str(error))
    if state.use_distributed and not _some_failed(error is not None, state):
        return []
    outcomes = gathered(outcome, state)
    return [(index, found[0], found[1]) for index, found in enumerate(outcomes) if found is not None]


def _raise_first(error: Optional[BaseException], failures: list, during: str) -> None:
    if error is not None:
        raise error
    if failures:
        index, kind, text = failures[0]
        raise CheckpointError(f"{during} failed on process {index} (so it stops here too): {kind}: {text}")


def raise_if_any_failed(error: Optional[BaseException], during: str, processes: Optional[ProcessView] = None) -> None:
    """Collective (over ``processes``, default every process): re-raise ``error`` here, or raise
    ``CheckpointError`` if another process had one."""
    state = processes or PartialState()
    if not state.use_distributed:
        if error is not None:
            raise error
        return
    _raise_first(error, gather_failures(error, processes), during)


def together(during: str, function: Callable[..., T], *args: Any, processes: Optional[ProcessView] = None,
             **kwargs: Any) -> T:
    """Run ``function`` on this process, then agree with the others (see the module docstring). ``processes``: who
    takes part (None: every process; a one-process view when the main process saves alone)."""
    error = result = None
    try:
        result = function(*args, **kwargs)
    except Exception as caught:  # noqa: BLE001 - raised below, once every process knows
        error = caught
    _raise_first(error, gather_failures(error, processes), during)
    return result


def together_reporting(during: str, function: Callable[..., T], *args: Any, report: Callable[[], Any],
                       processes: Optional[ProcessView] = None, **kwargs: Any) -> tuple[T, list]:
    """``together``, where each process that succeeded also hands in ``report()`` (small: it travels with the
    outcome, in the same exchange). Returns ``(result, every process's report, in process order)``."""
    state = processes or PartialState()
    error = result = None
    try:
        result = function(*args, **kwargs)
        mine = (None, report())
    except Exception as caught:  # noqa: BLE001 - raised below, once every process knows
        error = caught
        mine = ((type(caught).__name__, str(caught)), None)
    exchanged = gathered(mine, state)
    failures = [(index, outcome[0], outcome[1]) for index, (outcome, _) in enumerate(exchanged) if outcome]
    _raise_first(error, failures, during)
    return result, [found for _, found in exchanged]
