"""Reading checkpoint files without running code from them.

Pickle files (``optimizer.bin``, ``random_states_0.pkl``, ``custom_checkpoint_0.pkl`` ...) are read with
``torch.load(weights_only=True)``: tensors, numbers, strings, containers, NumPy arrays, and the small
allow-list below of standard-library value types that saved states commonly hold (dates, fractions, paths
...), all of which are rebuilt without calling user code. A file that needs anything else (an instance of
your own class, a lambda) is refused with ``UnsafeCheckpointError``, which names the type and the two ways
to accept it:

* allow that type: ``torch.serialization.add_safe_globals([YourClass])`` (only its constructor runs), or
* trust the whole checkpoint: ``accelerator.load_state(folder, load_kwargs={"weights_only": False})``.

The reference library loads registered objects with ``weights_only=False`` unconditionally, so a
checkpoint downloaded from elsewhere can run arbitrary code when its state is loaded; hasten does not.

Damaged files end in ``CorruptCheckpointError``, missing ones in ``IncompleteCheckpointError``, each naming
the file.
"""
from __future__ import annotations

import datetime
import decimal
import fractions
import os
import pathlib
import pickle
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from .errors import CorruptCheckpointError, IncompleteCheckpointError, UnsafeCheckpointError
from .serialization import MapLocation
from .serialization import load as _torch_load

if TYPE_CHECKING:
    from ..core.aliases import Device

__all__ = ["SAFE_TYPES", "load_pickle_file", "load_safetensors_file", "UNSAFE_OPT_IN", "wants_weights_only"]

#: Standard-library value types a checkpoint may contain beyond what ``weights_only`` accepts by itself.
SAFE_TYPES = (datetime.datetime, datetime.date, datetime.time, datetime.timedelta, datetime.timezone,
              decimal.Decimal, fractions.Fraction, pathlib.PurePosixPath, pathlib.PureWindowsPath,
              pathlib.PosixPath, pathlib.WindowsPath, frozenset, range, slice)

UNSAFE_OPT_IN = 'load_kwargs={"weights_only": False}'
# How torch.load's RuntimeErrors say that the bytes are not a readable checkpoint (a zeroed or cut file).
_DAMAGE_SIGNS = ("zip archive", "central directory", "PytorchStreamReader", "legacy .tar format", "magic number")
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")  # how torch names the object it refused


def _missing(path: Path, what: str) -> IncompleteCheckpointError:
    return IncompleteCheckpointError(
        f"Checkpoint {path.parent} is incomplete: {path.name} ({what}) is missing. Load a complete checkpoint, or "
        "one saved with the same prepared objects."
    )


def _refused(path: Path, what: str, error: Exception) -> UnsafeCheckpointError:
    text = str(error)
    found = _GLOBAL.search(text)
    culprit = f" it contains {found.group(1)}," if found else ""
    details = [line.strip() for line in text.splitlines() if "GLOBAL" in line]
    return UnsafeCheckpointError(
        f"Refused to load {path.name} ({what}) from {path.parent}:{culprit} an object that only arbitrary "
        "unpickling can rebuild, which could run code hidden in the file. If you trust this checkpoint, either "
        f"allow that type with torch.serialization.add_safe_globals([...]) or load with {UNSAFE_OPT_IN} "
        f"(e.g. accelerator.load_state(folder, {UNSAFE_OPT_IN})).\ntorch.load: {details[0] if details else text[-300:]}"
    )


def _damaged(path: Path, what: str, error: Exception) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"Cannot read {path.name} ({what}) in {path.parent}: the file is damaged or not a checkpoint file "
        f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). Load another checkpoint."
    )


def wants_weights_only(load_kwargs: Optional[dict]) -> bool:
    """Whether ``load_state``'s ``load_kwargs`` keep the safe default, ``weights_only=True`` (False: the caller
    trusts the checkpoint and lets its pickles run code)."""
    return bool((load_kwargs or {}).get("weights_only", True))


def load_pickle_file(path: Union[str, os.PathLike], what: str,
                     map_location: Optional[MapLocation] = None, load_kwargs: Optional[dict] = None) -> Any:
    """Load a ``torch.save`` file from a checkpoint, safely unless ``load_kwargs`` says ``weights_only=False``.

    ``what`` describes the file in error messages ("optimizer 0", "random states of process 1" ...).
    """
    path = Path(path)
    if not path.is_file():
        raise _missing(path, what)
    options = dict(load_kwargs or {})
    options.setdefault("weights_only", True)
    if "map_location" in options:
        map_location = options.pop("map_location")
    try:
        with torch.serialization.safe_globals(list(SAFE_TYPES)):
            return _torch_load(path, map_location=map_location, **options)
    except pickle.UnpicklingError as error:
        if options["weights_only"] and _GLOBAL.search(str(error)):
            raise _refused(path, what, error) from None
        raise _damaged(path, what, error) from None
    except (EOFError, zipfile.BadZipFile, ValueError, OSError) as error:  # OSError: a truncated file's seek
        raise _damaged(path, what, error) from None
    except RuntimeError as error:
        if any(sign in str(error) for sign in _DAMAGE_SIGNS):
            raise _damaged(path, what, error) from None
        raise


def load_safetensors_file(path: Union[str, os.PathLike], what: str, device: Device = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file (memory-mapped, copied only when used)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise _missing(path, what)
    try:
        return load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as error:
        raise _damaged(path, what, error) from None
