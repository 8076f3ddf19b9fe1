"""Reading a setting from the environment: ``HASTEN_<SETTING>``, or Accelerate's ``ACCELERATE_<SETTING>``.

Every setting hasten takes from the environment has one name, ``HASTEN_<SETTING>`` (``HASTEN_MIXED_PRECISION``,
``HASTEN_USE_CPU`` ...). Job scripts, ``accelerate launch`` and Accelerate's documentation set the same settings
as ``ACCELERATE_<SETTING>`` (and the FSDP, Megatron-LM and parallelism-config options under their bare names,
``FSDP_<OPTION>``, ``MEGATRON_LM_<OPTION>``, ``PARALLELISM_CONFIG_<OPTION>``, which is what ``accelerate launch``
exports); hasten reads those as aliases, through this module only, so the rule is the same for every setting:

- only one is set: its value is used;
- several are set to the same value (after parsing: ``1`` and ``true`` agree, ``BF16`` and ``bf16`` agree): fine;
- two are set to different values: ``EnvAliasConflictError``, naming both variables and their values;
- an empty value counts as not set.

Read sites call ``read_setting`` / ``get_setting`` / ``get_flag_setting`` / ``setting_is_set`` with the setting's
name (``"mixed_precision"``) or its ``HASTEN_`` variable name; they never read ``os.environ`` themselves.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Optional

__all__ = [
    "HASTEN_PREFIX", "ACCELERATE_PREFIX", "BARE_ACCELERATE_FAMILIES", "ConfigConflictError", "EnvAliasConflictError",
    "setting_variables", "read_setting", "get_setting", "get_flag_setting", "setting_is_set",
]

HASTEN_PREFIX = "HASTEN_"
ACCELERATE_PREFIX = "ACCELERATE_"
# Families Accelerate's plugins read without the ACCELERATE_ prefix (``FSDP_SHARDING_STRATEGY`` ...).
BARE_ACCELERATE_FAMILIES = ("FSDP_", "MEGATRON_LM_", "PARALLELISM_CONFIG_")


class ConfigConflictError(ValueError):
    """Two explicit sources gave different values for one setting."""


class EnvAliasConflictError(ConfigConflictError):
    """``HASTEN_<SETTING>`` and ``ACCELERATE_<SETTING>`` are both set, to values that differ."""


def setting_variables(setting: str) -> tuple[str, ...]:
    """The variables that carry ``setting``, hasten's first: ``(HASTEN_<SETTING>, ACCELERATE_<SETTING>)``, plus
    the bare ``<SETTING>`` for the families in ``BARE_ACCELERATE_FAMILIES`` (``fsdp_sharding_strategy`` ->
    ``HASTEN_FSDP_SHARDING_STRATEGY``, ``ACCELERATE_FSDP_SHARDING_STRATEGY``, ``FSDP_SHARDING_STRATEGY``).

    ``setting`` is a setting's name (``"mixed_precision"``) or the full name of its ``HASTEN_`` or
    ``ACCELERATE_`` variable (``"HASTEN_MIXED_PRECISION"``, ``"ACCELERATE_MIXED_PRECISION"``).
    """
    if not setting:
        raise ValueError("setting_variables needs a setting name, got an empty one.")
    for prefix in (HASTEN_PREFIX, ACCELERATE_PREFIX):
        if setting.startswith(prefix) and len(setting) > len(prefix):
            suffix = setting[len(prefix):]
            break
    else:
        suffix = setting.upper()
    names = (HASTEN_PREFIX + suffix, ACCELERATE_PREFIX + suffix)
    if suffix.startswith(BARE_ACCELERATE_FAMILIES):
        names += (suffix,)
    return names


def _parsed(variable: str, raw: str, parse: Optional[Callable[[str], Any]]):
    if parse is None:
        return raw
    try:
        return parse(raw)
    except ValueError as error:
        raise ValueError(f"Environment variable {variable}={raw!r}: {error}") from None


def read_setting(setting: str, parse: Optional[Callable[[str], Any]] = None,
                 environ: Optional[Mapping[str, str]] = None) -> tuple[Any, Optional[str]]:
    """``(value, variable)`` for ``setting`` from ``HASTEN_<SETTING>`` or its aliases (``setting_variables``).

    ``(None, None)`` when none is set (or all are empty). ``parse`` turns the text into a value and raises
    ``ValueError`` for bad input (re-raised naming the variable); without it the value is the text, stripped.
    When several variables are set their parsed values must be equal, else ``EnvAliasConflictError``. The
    variable returned is the first set in ``setting_variables`` order: the ``HASTEN_`` one whenever it is set.
    """
    environ = os.environ if environ is None else environ
    found = []
    for variable in setting_variables(setting):
        raw = environ.get(variable)
        if raw is None or raw.strip() == "":
            continue
        found.append((variable, raw, _parsed(variable, raw if parse else raw.strip(), parse)))
    if not found:
        return None, None
    (variable, raw, value), others = found[0], found[1:]
    for other_variable, other_raw, other_value in others:
        if other_value != value:
            raise EnvAliasConflictError(
                f"Conflicting environment variables for the same setting: {variable}={raw!r} but "
                f"{other_variable}={other_raw!r} (hasten reads {' and '.join(setting_variables(setting))} as one "
                f"setting). Unset one of them or give both the same value."
            )
    return value, variable


def get_setting(setting: str, default: Any = None, parse: Optional[Callable[[str], Any]] = None) -> Any:
    """The value of ``setting`` from the environment (see ``read_setting``), or ``default`` when it is not set."""
    value, variable = read_setting(setting, parse)
    return default if variable is None else value


def get_flag_setting(setting: str, default: bool = False) -> bool:
    """A boolean setting (``1/0``, ``true/false``, ``yes/no``, ``on/off``); ``default`` when it is not set."""
    from .env_vars import str_to_bool

    return bool(get_setting(setting, default, parse=lambda raw: bool(str_to_bool(raw))))


def setting_is_set(setting: str) -> bool:
    """Whether any variable of ``setting`` is set to a non-empty value (no conflict check)."""
    return any((os.environ.get(variable) or "").strip() for variable in setting_variables(setting))
