"""Which ``ParallelismConfig`` a run uses: the one given in code, else the launcher's, else none.

``hasten launch --use_parallelism_config --parallelism_config_<size> N`` (or a config file's ``parallelism_config``
section) exports ``HASTEN_USE_PARALLELISM_CONFIG=true`` and ``HASTEN_PARALLELISM_CONFIG_<SIZE>=N``; Accelerate's
launcher exports ``ACCELERATE_USE_PARALLELISM_CONFIG`` and ``PARALLELISM_CONFIG_<SIZE>``, read as aliases; a config
file given without the launcher stands for the same variables (``config/launch_file.py``). The one
precedence rule applies: a config given in code wins over the environment, and a size that the two set to different
values is an error naming both.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

from ..config.booleans import parse_bool
from ..config.env_fields import as_int
from ..config.launch_file import read_launch_setting
from ..core.env_aliases import ConfigConflictError
from .config import SIZE_FIELDS, ParallelismConfig

__all__ = ["USE_PARALLELISM_CONFIG", "launcher_parallel_sizes", "resolve_parallelism_config"]

USE_PARALLELISM_CONFIG = "use_parallelism_config"  # HASTEN_USE_PARALLELISM_CONFIG / ACCELERATE_USE_PARALLELISM_CONFIG


def _setting(field: str) -> str:
    return f"parallelism_config_{field}"


def launcher_parallel_sizes(env: Mapping[str, str] = os.environ) -> dict:
    """``{size field: (value, variable)}`` for each size the launcher's environment sets (e.g.
    ``{"dp_shard_size": (2, "HASTEN_PARALLELISM_CONFIG_DP_SHARD_SIZE")}``)."""
    found = {}
    for field in SIZE_FIELDS:
        value, variable = read_launch_setting(_setting(field), as_int(f"ParallelismConfig.{field}", minimum=1),
                                              environ=env)
        if variable is not None:
            found[field] = (value, variable)
    return found


def _use_flag(env: Mapping[str, str]) -> bool:
    value, variable = read_launch_setting(USE_PARALLELISM_CONFIG, lambda raw: parse_bool(raw, USE_PARALLELISM_CONFIG),
                                         environ=env)
    return bool(value) if variable is not None else False


def resolve_parallelism_config(explicit: Optional[ParallelismConfig] = None,
                               env: Mapping[str, str] = os.environ) -> Optional[ParallelismConfig]:
    """The ``ParallelismConfig`` of this run.

    ``explicit`` (given in code) when there is one, after checking that no size of it contradicts the launcher's
    environment (``ConfigConflictError`` naming both values otherwise); else a config built from the environment
    when ``HASTEN_USE_PARALLELISM_CONFIG`` (or ``ACCELERATE_USE_PARALLELISM_CONFIG``) is true; else ``None``
    (plain data parallelism).
    """
    sizes = launcher_parallel_sizes(env)
    if explicit is not None:
        if not isinstance(explicit, ParallelismConfig):
            raise TypeError(f"parallelism_config must be a ParallelismConfig, got {type(explicit).__name__}.")
        conflicts = [f"{field}={getattr(explicit, field)} in the ParallelismConfig given in code, but "
                     f"{variable}={value} in the launcher's environment"
                     for field, (value, variable) in sizes.items() if getattr(explicit, field) != value]
        if conflicts:
            raise ConfigConflictError(
                "Conflicting parallel sizes: " + "; ".join(conflicts) + ". Give each size in one place only (in "
                "code, or to hasten launch / the config file), or make both agree.")
        return explicit
    if not _use_flag(env):
        return None
    backends = {}
    for field in ("cp_backend", "sp_backend"):
        value, variable = read_launch_setting(_setting(field), environ=env)
        if variable is not None:
            backends[field] = value
    return ParallelismConfig(**{field: value for field, (value, _) in sizes.items()}, **backends)
