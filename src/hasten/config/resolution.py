"""The one precedence rule for settings: argument in code > launcher environment > config file > default.

Every setting that can come from more than one place is resolved here. When two explicit sources give
different values the user meant two different things; instead of silently picking one, the conflict is an
error that names both sources and says how to make them agree.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..core.env_aliases import HASTEN_PREFIX, ConfigConflictError, read_setting

__all__ = ["ConfigConflictError", "Source", "resolve"]

_UNSET = object()


@dataclass(frozen=True)
class Source:
    """Where a value came from, in words a user can act on."""

    kind: str  # "argument", "environment", "config file", "default"
    where: str  # e.g. "Accelerator(mixed_precision=...)", "HASTEN_MIXED_PRECISION", "~/.cache/.../default_config.yaml"

    def describe(self) -> str:
        return f"{self.kind} {self.where}" if self.where else self.kind


def resolve(
    setting: str,
    argument: Any = None,
    *,
    argument_name: Optional[str] = None,
    config: Optional[dict] = None,
    config_path: Optional[str] = None,
    config_key: Optional[str] = None,
    default: Any = None,
    parse: Callable[[Any], Any] = lambda value: value,
    env_var: Optional[str] = None,
) -> tuple[Any, Source]:
    """Resolve one setting and return ``(value, source)``.

    ``argument`` is ``None`` when the user did not pass it. The launcher environment is
    ``HASTEN_<SETTING>`` or its Accelerate alias ``ACCELERATE_<SETTING>`` (see ``env_aliases``) unless
    ``env_var`` names another variable. ``parse`` normalises each explicit value (so ``"BF16"`` and ``"bf16"``
    agree) and raises ``ValueError`` for bad input. The plugins give a config file's backend sections as ``config``
    through ``config/launch_file.py``'s ``config_tier``.
    """
    config_key = config_key or setting
    candidates = []
    if argument is not None:
        candidates.append((parse(argument), Source("argument", argument_name or f"{setting}=")))
    if env_var is None or env_var.startswith(HASTEN_PREFIX):
        value, variable = read_setting(env_var or setting, parse)
    else:  # a variable of another family, read as it is
        raw_env = os.environ.get(env_var)
        value, variable = None, None
        if raw_env not in (None, ""):
            try:
                value, variable = parse(raw_env), env_var
            except ValueError as error:
                raise ValueError(f"Environment variable {env_var}={raw_env!r}: {error}") from None
    if variable is not None:
        candidates.append((value, Source("environment", variable)))
    if config and config.get(config_key) is not None:
        try:
            value = parse(config[config_key])
        except ValueError as error:
            raise ValueError(f"Config file {config_path} key {config_key!r}: {error}") from None
        candidates.append((value, Source("config file", f"{config_path} ({config_key})")))
    if not candidates:
        return default, Source("default", "")
    chosen, source = candidates[0]
    for value, other in candidates[1:]:
        if value != chosen:
            raise ConfigConflictError(
                f"Conflicting values for {setting!r}: {chosen!r} from the {source.describe()} but {value!r} "
                f"from the {other.describe()}. Remove one of them or make them agree."
            )
    return chosen, source
