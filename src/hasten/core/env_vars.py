"""Environment variables read and changed, without any other part of hasten: the names ``HASTEN_<SETTING>``,
parsing their values (booleans, integers), and changing them for a while.

The modules that need these (``hardware.py``, ``imports.py``, the settings reader ``core/env_aliases.py``)
import them from here, not from ``environment.py``, which gathers several of those modules under Accelerate's
names and so would import them back.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any, Union

__all__ = ["ENV_PREFIX", "env_name", "str_to_bool", "parse_flag_from_env", "parse_choice_from_env",
           "get_int_from_env", "patch_environment", "clear_environment"]

ENV_PREFIX = "HASTEN_"

_TRUE = {"1", "true", "yes", "y", "on", "t"}
_FALSE = {"0", "false", "no", "n", "off", "f", ""}


def env_name(setting: str) -> str:
    """``"mixed_precision"`` -> ``"HASTEN_MIXED_PRECISION"``."""
    return ENV_PREFIX + setting.upper()


def str_to_bool(value: Any, to_bool: bool = False) -> Union[int, bool]:
    """Parse a boolean written as text (``1/0``, ``true/false``, ``yes/no``, ``on/off``): 1 or 0, or with
    ``to_bool`` True or False."""
    text = str(value).strip().lower()
    if text in _TRUE:
        return True if to_bool else 1
    if text in _FALSE:
        return False if to_bool else 0
    raise ValueError(f"Cannot read {value!r} as a boolean; use one of 1/0, true/false, yes/no, on/off.")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """A boolean environment variable; ``default`` when unset."""
    value = os.environ.get(key)
    if value is None:
        return default
    try:
        return bool(str_to_bool(value))
    except ValueError as error:
        raise ValueError(f"Environment variable {key}={value!r}: {error}") from None


def parse_choice_from_env(key: str, default: str = "no") -> str:
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys: Iterable[str], default: int) -> int:
    """The first of ``env_keys`` that is set and non-negative, as an int; else ``default``."""
    for key in env_keys:
        value = os.environ.get(key)
        if value is None or value == "":
            continue
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"Environment variable {key}={value!r} is not an integer.") from None
        if number >= 0:
            return number
    return default


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Temporarily set environment variables (keys upper-cased, values turned into str); restored on exit."""
    saved = {}
    for key, value in kwargs.items():
        key = key.upper()
        saved[key] = os.environ.get(key)
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Temporarily empty ``os.environ``; the original is restored on exit (the same mapping object)."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
