"""One reading of booleans for every flag hasten takes: arguments in code, config files and the environment.

``Accelerator(split_batches="no")`` must mean False, not ``bool("no") == True``. A flag takes ``True``/``False``,
the integers 1/0, or the words a config file uses (``yes/no``, ``true/false``, ``on/off``, ``1/0``, any case);
anything else is refused with an error naming the argument, before any state changes.
"""
from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any, Iterable, Optional

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["parse_bool", "normalize_bool_fields", "ACCEPTED_WORDS"]

_TRUE = ("1", "true", "yes", "on", "y", "t")
_FALSE = ("0", "false", "no", "off", "n", "f")
ACCEPTED_WORDS = "yes/no, true/false, on/off, 1/0"

_BOOL_ANNOTATIONS = {"bool", "Optional[bool]", "typing.Optional[bool]", "bool|None", "Union[bool,None]"}


def parse_bool(value: Any, what: str, *, optional: bool = False) -> Optional[bool]:
    """``value`` read as a boolean; ``None`` kept when ``optional``. ``what`` names the argument in the error."""
    if isinstance(value, bool):
        return value
    if value is None and optional:
        return None
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    allowed = "True, False or None" if optional else "True or False"
    error = ValueError if isinstance(value, (str, int)) else TypeError
    raise error(f"{what} must be {allowed} (or the text {ACCEPTED_WORDS}), got {value!r}.")


def _is_bool_field(annotation: Any) -> bool:
    if annotation is bool:
        return True
    return isinstance(annotation, str) and annotation.replace(" ", "") in _BOOL_ANNOTATIONS


def normalize_bool_fields(obj: DataclassInstance, names: Optional[Iterable[str]] = None) -> None:
    """Replace each boolean field of the dataclass ``obj`` (those annotated ``bool`` / ``Optional[bool]``, or
    ``names``) by its parsed value; ``Optional`` fields keep ``None``."""
    owner = type(obj).__name__
    for item in fields(obj):
        if names is not None and item.name not in names:
            continue
        if names is None and not _is_bool_field(item.type):
            continue
        optional = not (item.type is bool or str(item.type).replace(" ", "") == "bool")
        setattr(obj, item.name, parse_bool(getattr(obj, item.name), f"{owner}.{item.name}", optional=optional))
