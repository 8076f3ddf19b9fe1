"""A config file given to a process that ``hasten launch`` did not start: a pod's, an srun step's or a Ray worker's
``python train.py`` with ``HASTEN_CONFIG_FILE`` (or ``ACCELERATE_CONFIG_FILE``) naming the file.

Such a process reads the variables the launcher would have exported for the file's backend section (FSDP, DeepSpeed,
Megatron-LM: the switch and the options), its ``parallelism_config``, its ``fp8_config`` and its ``dynamo_config``
options, built by the same code
the launcher uses (``config/launch_groups.py``, ``config/deepspeed_launch.py``, ``config/parallelism_launch.py``,
``config/fp8_launch.py``). They are the config-file tier of the one precedence rule (``config/resolution.py``): an
argument in code > the environment > this file > the default, and an environment variable that contradicts the file
is a ``ConfigConflictError`` naming both. The general settings (precision, CPU, accumulation steps, dynamo backend)
are read from the same file by ``config/accelerator_settings.py``.

``hasten launch --config_file`` exports the file's settings itself (its flags may override the file) and marks its
workers with ``HASTEN_CONFIG_FILE_APPLIED=true``: for them this module gives nothing. The file is read once per
version (path, modification time, size); what it gives is checked as the launcher checks it, so a bad key is an
error before any process group or model is touched.
"""
from __future__ import annotations

import argparse
import functools
import os
import warnings
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional

from ..core.env_aliases import get_flag_setting, get_setting, read_setting, setting_variables
from ..core.env_vars import env_name
from .config_file import load_config_file
from .deepspeed_launch import resolve_deepspeed
from .fp8_launch import fp8_env
from .launch_groups import backend_section_env, env_text
from .parallelism_launch import parallelism_env
from .resolution import resolve

__all__ = ["APPLIED_SETTING", "FileVariables", "config_file_env", "unlaunched_file_variables", "config_tier",
           "read_launch_setting"]

#: the setting ``hasten launch`` sets for its workers when it exported a config file's settings itself
APPLIED_SETTING = "config_file_applied"


@dataclass(frozen=True)
class FileVariables:
    """The variables a config file stands for (``HASTEN_<SETTING>`` -> text), and the file's path."""

    path: str
    variables: Mapping[str, str]

    def get(self, setting: str) -> Optional[str]:
        """The file's value of ``setting`` (a setting name or any of its variables' names), else None."""
        return self.variables.get(setting_variables(setting)[0])


#: the ``dynamo_config`` keys the launcher exports besides the backend (which ``accelerator_settings`` reads), with
#: the value that counts as not given
_DYNAMO_KEYS = {"dynamo_mode": "default", "dynamo_use_fullgraph": False, "dynamo_use_dynamic": False,
                "dynamo_use_regional_compilation": False}


def _dynamo_env(config: Mapping) -> dict:
    section = config.get("dynamo_config") or {}
    return {env_name(key): env_text(section[key]) for key, neutral in _DYNAMO_KEYS.items()
            if section.get(key) is not None and section[key] != neutral}


def _general_settings(config: Mapping) -> tuple[dict, dict]:
    """The launcher's ``(values, sources)`` for the general settings the DeepSpeed group is checked against."""
    values = {"mixed_precision": config.get("mixed_precision") or "no",
              "gradient_accumulation_steps": config.get("gradient_accumulation_steps", 1)}
    sources = {key: "config file" if config.get(key) is not None else "default" for key in values}
    return values, sources


def config_file_env(config: Mapping, path: str) -> tuple[dict, list]:
    """``(variables, notes)``: what ``hasten launch --config_file path`` with no flags exports for the file's fp8,
    backend, parallelism and dynamo sections. Raises ``CommandError`` (a ``ValueError``) or ``NotYetSupportedError``
    for what the launcher refuses (an unknown key, a bad value, another library's fp8 recipe)."""
    no_flags = argparse.Namespace()
    env = fp8_env(no_flags, config)
    kind = str(config.get("distributed_type") or "").upper()
    env.update(backend_section_env(kind, config))
    values, sources = _general_settings(config)
    deepspeed = resolve_deepspeed(no_flags, config, path, kind == "DEEPSPEED", values, sources)
    env.update(deepspeed.env)
    parallel, notes = parallelism_env(no_flags, config, path)
    env.update(parallel)
    env.update(_dynamo_env(config))
    return env, [note.replace("hasten launch: ", f"{path}: ", 1) for note in deepspeed.notes + notes]


@functools.lru_cache(maxsize=8)
def _read(path: str, modified_ns: int, size: int) -> FileVariables:
    """The variables of one version of the file (cached on its path, modification time and size)."""
    variables, notes = config_file_env(load_config_file(path), path)
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return FileVariables(path=path, variables=MappingProxyType(variables))


def unlaunched_file_variables() -> Optional[FileVariables]:
    """The variables of the config file named by ``HASTEN_CONFIG_FILE`` when ``hasten launch`` did not export them
    itself (no ``HASTEN_CONFIG_FILE_APPLIED``); None when no file is named or the launcher applied it."""
    path = get_setting("config_file")
    if not path or get_flag_setting(APPLIED_SETTING):
        return None
    try:
        status = os.stat(path)
    except OSError:
        load_config_file(path)  # raises the loader's error, which names the file and the variable
        raise
    return _read(os.path.abspath(path), status.st_mtime_ns, status.st_size)


def config_tier(setting: str) -> dict:
    """The keyword arguments that give ``resolution.resolve`` the unlaunched config file as the config-file tier of
    ``setting`` (``{}`` when there is none): how the plugins' fields read the file's sections."""
    layer = unlaunched_file_variables()
    if layer is None:
        return {}
    return {"config": layer.variables, "config_path": layer.path, "config_key": setting_variables(setting)[0]}


def read_launch_setting(setting: str, parse: Optional[Callable[[str], Any]] = None,
                        environ: Optional[Mapping[str, str]] = None) -> tuple[Any, Optional[str]]:
    """``(value, where)`` for a setting the launcher exports: the environment's, else the unlaunched config file's,
    by the one precedence rule (``resolution.resolve``; both giving different values is a ``ConfigConflictError``
    naming both); ``(None, None)`` when neither gives it. ``where``: the variable, or the file. ``environ``: a mapping
    to read instead of the process's environment (then the file is not consulted: the caller chose its source)."""
    if environ is not None and environ is not os.environ:
        return read_setting(setting, parse, environ=environ)
    value, source = resolve(setting, **({"parse": parse} if parse is not None else {}), **config_tier(setting))
    return value, (source.where or None)
