"""The strategy as checkpointing sees it: the state dicts and checkpoint IO steps the transaction, the reader and
``save_model`` call on the run's backend.

Checkpointing sits below the strategies, so it names the members it uses in a protocol instead of importing the
class; ``Strategy`` (``strategies/base.py``) and every backend derived from it fit it. The protocol holds no code:
it types the ``strategy`` parameters of this room (and of the backends' own checkpoint IO, which extend it).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed import ProcessGroup

    from ..core.aliases import Device
    from .targets import CheckpointTargets

__all__ = ["CheckpointingStrategy"]


class CheckpointingStrategy(Protocol):
    """What checkpointing asks of a strategy (see ``Strategy`` for what each member does)."""

    #: the keyword arguments ``save_state(**save_model_func_kwargs)`` may pass to the backend's checkpoint IO
    save_options_accepted: tuple
    #: whether ``save_state(async_save=True)`` may write in a background thread
    supports_async_save: bool
    #: whether one process holds the whole state (the main process writes a complete checkpoint alone)
    saves_from_one_process: bool

    def unwrap(self, model: nn.Module, keep_fp32_wrapper: bool = True,
               keep_torch_compile: bool = True) -> nn.Module: ...

    def model_state_dict(self, model: nn.Module, full: bool = True) -> dict: ...

    def expected_state_dict(self, model: nn.Module, keep_vars: bool = False) -> dict: ...

    def load_model_state_dict(self, model: nn.Module, state_dict: dict, strict: bool = True) -> Optional[tuple]: ...

    def optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> dict: ...

    def load_optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer,
                                  state_dict: dict) -> None: ...

    def optimizer_parameter_names(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]: ...

    def optimizer_group_sizes(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> list[int]: ...

    # the snapshot (``checkpoint_io.Snapshot``) and what was read are the strategy's IO's own: Any here, since the
    # modules that define them import this one
    def collect_checkpoint(self, targets: CheckpointTargets, options: Optional[dict] = None) -> Any: ...

    def write_checkpoint(self, staging_dir: Path, collected: Any, *, writes_shared_files: bool, process_index: int,
                         safe_serialization: bool = True, process_group: Optional[ProcessGroup] = None) -> None: ...

    def read_checkpoint(self, folder: Path, marker: Optional[dict], targets: CheckpointTargets, *,
                        load_kwargs: Optional[dict] = None, device: Device = "cpu", strict: bool = True) -> Any: ...

    def apply_checkpoint(self, loaded: Any, targets: CheckpointTargets, strict: bool = True) -> None: ...
