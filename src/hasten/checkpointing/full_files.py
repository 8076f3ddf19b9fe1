"""The full-state checkpoint format, ``FullStateFormat``: whole state dicts, one file per object, in the reference
library's names (so each library reads the other's folders).

=============================  ===================================================================
``model.safetensors``          first model (``model_1.safetensors`` ... for the others);
                               ``pytorch_model.bin`` / ``pytorch_model_1.bin`` with pickle
``optimizer.bin``              first optimizer (``optimizer_1.bin`` ...)
``scheduler.bin``              first scheduler (``scheduler_1.bin`` ...)
``scaler.pt``                  the fp16 ``GradScaler``
``custom_checkpoint_{i}.pkl``  objects given to ``register_for_checkpointing``
=============================  ===================================================================

The class owns these names, writing the files (``write_shared_files``), finding them in a folder and reading
them whole. Every format writes schedulers, the scaler and registered objects this way; the sharded format
(``sharded_files.py``) and DeepSpeed's engine format (``deepspeed_files.py``) replace only the models' and
optimizers' files. Each process's own files (random states, loader positions) and hasten's bookkeeping files are
the checkpoint folder's (``layout.py``).
"""
from __future__ import annotations

import re
from pathlib import Path
from functools import partial
from typing import Any, Callable, Optional

from ..core.constants import MODEL_NAME, OPTIMIZER_NAME, SAFE_MODEL_NAME, SCALER_NAME, SCHEDULER_NAME
from .weights import drop_aliases
from .optimizer_names import by_position
from .parallel_writes import write_files
from .safe_load import load_pickle_file, load_safetensors_file
from .writers import write_pickle, write_tensors

__all__ = ["FullStateFormat", "write_shared_files", "shared_file_writes"]

_CUSTOM_NAME = "custom_checkpoint"
# What the reference writes for data loaders (a pickled sampler, a stateful loader's shared state): its names.
_REFERENCE_LOADERS = ("sampler", "dl_state_dict")


def _numbered(stem: str, index: int, extension: str) -> str:
    """``stem.ext`` for the first object, ``stem_{index}.ext`` for the others (the reference's rule)."""
    return f"{stem}.{extension}" if index == 0 else f"{stem}_{index}.{extension}"


def _keyed_by_name(state: Any) -> bool:
    """Whether an optimizer state is keyed by parameter name (the reference's FSDP files), not by position."""
    return isinstance(state, dict) and isinstance(state.get("state"), dict) and bool(state["state"]) and all(
        isinstance(key, str) for key in state["state"])


class FullStateFormat:
    """Whole (unsharded) state dicts, one file per object (see the module doc): every strategy's default."""

    #: the names this format adds to a checkpoint folder (the reference's own loader files included)
    NAME_PATTERN = (rf"({SAFE_MODEL_NAME}|{MODEL_NAME}|{OPTIMIZER_NAME}|{SCHEDULER_NAME}|{'|'.join(_REFERENCE_LOADERS)})"
                    rf"(_\d+)?\.(safetensors|bin)|{re.escape(SCALER_NAME)}|{_CUSTOM_NAME}_\d+\.pkl")
    SCALER_NAME = SCALER_NAME
    #: the stems of the reference library's data loader files (read by neither library's loaders here)
    REFERENCE_LOADER_NAMES = _REFERENCE_LOADERS
    _CUSTOM = re.compile(rf"{_CUSTOM_NAME}_(\d+)\.pkl")

    # ------------------------------------------------------------ names
    @staticmethod
    def model_file(index: int, safe_serialization: bool = True) -> str:
        return _numbered(SAFE_MODEL_NAME, index, "safetensors") if safe_serialization \
            else _numbered(MODEL_NAME, index, "bin")

    @staticmethod
    def optimizer_file(index: int) -> str:
        return _numbered(OPTIMIZER_NAME, index, "bin")

    @staticmethod
    def scheduler_file(index: int) -> str:
        return _numbered(SCHEDULER_NAME, index, "bin")

    @staticmethod
    def custom_object_file(index: int) -> str:
        return f"{_CUSTOM_NAME}_{index}.pkl"

    @classmethod
    def is_custom_object_file(cls, name: str) -> bool:
        return cls._CUSTOM.fullmatch(name) is not None

    # ------------------------------------------------------------ found in a folder, read whole
    def model_location(self, folder: Path, index: int) -> Optional[Path]:
        """Model ``index``'s file in ``folder`` (safetensors first, then pickle), or None."""
        for safe in (True, False):
            path = Path(folder) / self.model_file(index, safe)
            if path.is_file():
                return path
        return None

    def optimizer_location(self, folder: Path, index: int) -> Optional[Path]:
        path = Path(folder) / self.optimizer_file(index)
        return path if path.is_file() else None

    def check_trusted(self, checkpoint: Path, marker: Optional[dict], load_kwargs: Optional[dict]) -> None:
        """Nothing to refuse: these files are read with ``weights_only`` unless the caller opts out."""

    def read_weights(self, path: Path, what: str, *, device: Any = "cpu", load_kwargs: Optional[dict] = None) -> Any:
        """The weights in ``path`` (``what`` names them in errors), on ``device``."""
        if path.suffix == ".safetensors":
            return load_safetensors_file(path, what, device=device)
        return load_pickle_file(path, what, map_location=device, load_kwargs=load_kwargs)

    def read_optimizer(self, path: Path, what: str, names: Callable[[], list], *, device: Any = "cpu",
                       load_kwargs: Optional[dict] = None) -> Any:
        """The optimizer's state by position; one keyed by parameter name (the reference's FSDP files) is laid
        out by ``names()``: the prepared optimizer's parameter names per group (it raises when it has none)."""
        state = load_pickle_file(path, what, map_location=device, load_kwargs=load_kwargs)
        if _keyed_by_name(state):
            state = by_position(state, names(), state["param_groups"])
        return state


def write_shared_files(folder: Path, snapshot: Any, safe_serialization: bool) -> None:
    """Write the snapshot's models, optimizers, schedulers, scaler and registered objects into ``folder``, each
    file checksummed, side by side (``parallel_writes.py``); a model whose weights are None is skipped."""
    write_files(shared_file_writes(folder, snapshot, safe_serialization))


def shared_file_writes(folder: Path, snapshot: Any, safe_serialization: bool) -> list[Callable[[], None]]:
    """One call per file ``write_shared_files`` writes (larger files first), to run alongside other writes."""
    writes: list[Callable[[], None]] = []
    for index, weights in enumerate(snapshot.weights):
        if weights is None:
            continue
        path = folder / FullStateFormat.model_file(index, safe_serialization)
        if safe_serialization:
            writes.append(partial(write_tensors, drop_aliases(weights)[0], path, metadata={"format": "pt"},
                                  checksum=True))
        else:
            writes.append(partial(write_pickle, weights, path, checksum=True))
    writes = [partial(write_pickle, state, folder / FullStateFormat.optimizer_file(index), checksum=True)
              for index, state in enumerate(snapshot.optimizers)] + writes  # moments: twice the weights (Adam)
    writes += [partial(write_pickle, state, folder / FullStateFormat.scheduler_file(index), checksum=True)
               for index, state in enumerate(snapshot.schedulers)]
    if snapshot.scaler is not None:
        writes.append(partial(write_pickle, snapshot.scaler, folder / FullStateFormat.SCALER_NAME, checksum=True))
    writes += [partial(write_pickle, state, folder / FullStateFormat.custom_object_file(index), checksum=True)
               for index, state in enumerate(snapshot.custom)]
    return writes
