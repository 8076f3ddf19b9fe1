"""A group of processes seen as a run of its own, so hasten's checked collectives can run over a sub-group.

Gathers, reductions and data sharding work over the *data-parallel* processes. Without model parallelism
those are all processes and the collectives use ``PartialState`` itself (today's path, unchanged). Under
tensor or context parallelism the data-parallel group is a sub-group of the mesh: a ``ProcessView`` gives the
collectives the same facts they read from ``PartialState`` (how many processes, which one is this, the
device, the backend) for that group, and the group to pass to ``torch.distributed``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from ..state import PartialState

__all__ = ["ProcessView", "Processes", "group_of"]


@dataclass(frozen=True)
class ProcessView:
    """The processes of ``group`` (a ``torch.distributed.ProcessGroup``), with this process's rank in it."""

    group: Any
    num_processes: int
    process_index: int
    device: torch.device
    backend: Optional[str] = None
    debug: bool = False
    local_process_index: Optional[int] = None  # on its machine, where the group spans machines; None: process_index

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return (self.process_index if self.local_process_index is None else self.local_process_index) == 0

    @classmethod
    def alone(cls, state: Processes) -> ProcessView:
        """This process as a run of one (collectives over it are local): a save the main process makes alone."""
        return cls(group=None, num_processes=1, process_index=0, device=state.device,
                   debug=bool(getattr(state, "debug", False)))

    @classmethod
    def of_group(cls, group: ProcessGroup, state: Processes) -> ProcessView:
        """The view of ``group`` from this process, with the device and debug setting of ``state``."""
        import torch.distributed as dist

        return cls(group=group, num_processes=dist.get_world_size(group), process_index=dist.get_rank(group),
                   device=state.device, backend=dist.get_backend(group), debug=bool(getattr(state, "debug", False)))


# The processes a collective runs over: the whole run (its ``PartialState``) or a sub-group (a ``ProcessView``).
Processes = Union["PartialState", ProcessView]


def group_of(state: Processes) -> Optional[ProcessGroup]:
    """The process group a collective over ``state`` runs on: None (the default, world group) for the run's
    own ``PartialState``, the view's group for a ``ProcessView``."""
    return getattr(state, "group", None)
