"""The sharded (DCP) checkpoint format, ``ShardedFormat``: its names, how it is recognised on disk, and reading its
model and optimizer folders in one process, as full states.

An unsharded run (one process, DDP) loads a checkpoint an FSDP run wrote with ``SHARDED_STATE_DICT`` through
these, and ``hasten merge-weights`` turns one into a safetensors model with them. Nothing beyond DCP metadata,
tensors and plain values is unpickled unless the caller trusts the files (``weights_only=False``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from ..core.constants import FSDP_MODEL_NAME
from .errors import CorruptCheckpointError
from .optimizer_names import by_position
from .safe_load import UNSAFE_OPT_IN, load_pickle_file, wants_weights_only

__all__ = ["ShardedFormat", "is_sharded_folder", "model_weights_from_shards", "optimizer_state_from_shards"]


class ShardedFormat:
    """Models and optimizers saved as ``torch.distributed.checkpoint`` folders, one file per rank (FSDP's
    ``SHARDED_STATE_DICT``, tensor / pipeline / context parallelism), in the reference library's names:

    - ``pytorch_model_fsdp_{i}/``: model ``i``, ``{"model": state dict}``, a ``__{rank}_0.distcp`` file per rank
      and ``.metadata``;
    - ``optimizer_{i}/``: optimizer ``i``, ``{"optimizer": state dict keyed by parameter name}``;
    - ``pytorch_model_fsdp[_i].bin``: the same model gathered into one file (FSDP's ``FULL_STATE_DICT``).

    The one place these names are spelled: the sharded IO writes with them, the full-state reader and
    ``merge-weights`` find the folders through them, the folder scan (``formats.is_checkpoint_file``) knows them
    by ``NAME_PATTERN``.
    """

    #: the names this format adds to a checkpoint folder (its DCP folders)
    NAME_PATTERN = rf"{FSDP_MODEL_NAME}_\d+|optimizer_\d+|{FSDP_MODEL_NAME}(_\d+)?\.bin"

    @staticmethod
    def model_folder(index: int) -> str:
        return f"{FSDP_MODEL_NAME}_{index}"

    @staticmethod
    def optimizer_folder(index: int) -> str:
        return f"optimizer_{index}"

    @staticmethod
    def gathered_model_file(index: int) -> str:
        """Model ``index`` gathered into one pickled file (``pytorch_model_fsdp.bin``, ``pytorch_model_fsdp_1.bin``)."""
        return f"{FSDP_MODEL_NAME}.bin" if index == 0 else f"{FSDP_MODEL_NAME}_{index}.bin"

    @staticmethod
    def recognises(path: Path) -> bool:
        """Whether ``path`` is one of this format's folders (``is_sharded_folder``)."""
        return is_sharded_folder(path)

    # ------------------------------------------------------------ found in a folder, read whole in one process
    def model_location(self, folder: Path, index: int) -> Optional[Path]:
        """Model ``index``'s DCP folder in ``folder``, else its gathered file (the reference's FSDP
        ``FULL_STATE_DICT``), else None."""
        sharded = Path(folder) / self.model_folder(index)
        if self.recognises(sharded):
            return sharded
        gathered = Path(folder) / self.gathered_model_file(index)
        return gathered if gathered.is_file() else None

    def optimizer_location(self, folder: Path, index: int) -> Optional[Path]:
        sharded = Path(folder) / self.optimizer_folder(index)
        return sharded if self.recognises(sharded) else None

    def check_trusted(self, checkpoint: Path, marker: Optional[dict], load_kwargs: Optional[dict]) -> None:
        """Nothing to refuse: DCP folders are read without unpickling code unless the caller opts out."""

    def read_weights(self, path: Path, what: str, *, device: Any = "cpu", load_kwargs: Optional[dict] = None) -> Any:
        """The full weights of a DCP folder (on the CPU), or of a gathered file (on ``device``)."""
        if path.is_dir():
            return model_weights_from_shards(path, weights_only=wants_weights_only(load_kwargs))
        return load_pickle_file(path, what, map_location=device, load_kwargs=load_kwargs)

    def read_optimizer(self, path: Path, what: str, names: Callable[[], list], *, device: Any = "cpu",
                       load_kwargs: Optional[dict] = None) -> dict:
        """The full optimizer state of a DCP folder, by position for the parameters ``names()`` lists."""
        return optimizer_state_from_shards(path, names(), weights_only=wants_weights_only(load_kwargs))


def is_sharded_folder(path: Path) -> bool:
    """Whether ``path`` is a DCP checkpoint folder (it has the ``.metadata`` file every DCP save writes)."""
    return (Path(path) / ".metadata").is_file()


def _entry(path: Path, key: str, weights_only: bool) -> dict:
    from .safe_dcp import read_dcp_checkpoint  # torch.distributed.checkpoint: only when a DCP folder is read

    state = read_dcp_checkpoint(path, weights_only=weights_only, unsafe_hint=UNSAFE_OPT_IN)
    if not isinstance(state.get(key), dict):
        raise CorruptCheckpointError(f"{path} is a sharded checkpoint without a {key!r} entry (it holds "
                                     f"{sorted(state)}). Load another checkpoint.")
    return state[key]


def model_weights_from_shards(path: Path, weights_only: bool = True) -> dict:
    """The full state dict of the model saved in the DCP folder ``path`` (``{"model": ...}``), on the CPU."""
    return _entry(Path(path), "model", weights_only)


def optimizer_state_from_shards(path: Path, names: list, weights_only: bool = True) -> dict:
    """The full state of the optimizer saved in the DCP folder ``path``, laid out as ``optimizer.state_dict()``
    (by position) for an optimizer whose parameters are called ``names`` (per group, in order:
    ``Strategy.optimizer_parameter_names``)."""
    named = _entry(Path(path), "optimizer", weights_only)
    missing = [name for group in names for name in group if name not in named.get("state", {})]
    if named.get("state") and missing:
        raise CorruptCheckpointError(f"{path} holds no optimizer state for {missing[:4]}: it was saved for another "
                                     "model. Nothing was loaded.")
    return by_position(named, names, [{k: _as_saved(v) for k, v in group.items()}
                                      for group in named.get("param_groups", [])])


def _as_saved(value):
    """DCP stores tuples (Adam's betas) as lists; the optimizer's own state dict has tuples."""
    return tuple(value) if isinstance(value, list) and all(isinstance(v, (int, float)) for v in value) else value
