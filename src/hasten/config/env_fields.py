"""Parsers and the environment fallback shared by the planned-backend plugins (DeepSpeed, FSDP, Megatron-LM ...).

A plugin field left at ``None`` takes the launcher's value (``HASTEN_<SETTING>``, or Accelerate's
``ACCELERATE_<SETTING>``), then a config file's given without the launcher, then its default, through the one
precedence rule in ``resolution.resolve``. Each parser accepts what a user or a config file would write
(``"true"``, ``"2"``, ``"FULL_SHARD"``) and raises a ``ValueError`` that names the field and the accepted values.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from .launch_file import config_tier
from .resolution import resolve

__all__ = ["from_env", "as_bool", "as_int", "as_float", "as_choice"]


def from_env(owner: str, field: str, value: Any, default: Any, parse: Callable[[Any], Any],
             setting: Optional[str] = None) -> Any:
    """``value`` if given, else the environment's ``setting`` (default: ``field``), else a config file's given
    without the launcher (``config/launch_file.py``), else ``default``; parsed."""
    chosen, _ = resolve(setting or field, value, argument_name=f"{owner}({field}=...)", default=default, parse=parse,
                        **config_tier(setting or field))
    return chosen


def as_bool(what: str) -> Callable[[Any], bool]:
    def parse(value) -> bool:
        from .booleans import parse_bool

        try:
            return parse_bool(value, what)
        except TypeError as error:  # callers expect ValueError for every bad value
            raise ValueError(str(error)) from None

    return parse


def as_int(what: str, minimum: Optional[int] = None, choices: Optional[Iterable[int]] = None) -> Callable[[Any], int]:
    choices = tuple(choices) if choices is not None else None

    def parse(value) -> int:
        try:
            number = int(str(value).strip()) if isinstance(value, str) else int(value)
        except (TypeError, ValueError):
            number = None
        if number is None or isinstance(value, bool) or (isinstance(value, float) and value != number):
            raise ValueError(f"{what} must be an integer, got {value!r}.")
        if choices is not None and number not in choices:
            raise ValueError(f"{what} must be one of {', '.join(map(str, choices))}, got {value!r}.")
        if minimum is not None and number < minimum:
            raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}.")
        return number

    return parse


def as_float(what: str, minimum: Optional[float] = None) -> Callable[[Any], float]:
    def parse(value) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{what} must be a number, got {value!r}.") from None
        if isinstance(value, bool):
            raise ValueError(f"{what} must be a number, got {value!r}.")
        if minimum is not None and number < minimum:
            raise ValueError(f"{what} must be >= {minimum}, got {value!r}.")
        return number

    return parse


def as_choice(what: str, choices: Iterable[str], normalise: Callable[[str], str] = str.lower) -> Callable[[Any], str]:
    """A string among ``choices``, compared after ``normalise`` (lower-case by default) and returned normalised."""
    choices = tuple(choices)

    def parse(value) -> str:
        text = normalise(str(getattr(value, "value", value)).strip())
        if text not in choices:
            raise ValueError(f"{what} must be one of {', '.join(map(repr, choices))}, got {value!r}.")
        return text

    return parse
