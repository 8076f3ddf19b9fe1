"""Environment helpers that are more than reading one variable: debug mode, environment files, test isolation.

Defined here: ``is_debug_mode``, ``convert_dict_to_env_variables`` (lines of an environment file),
``are_libraries_initialized`` and ``purge_accelerate_environment`` (launcher variables removed for a test, then
restored). Reading and parsing single variables is ``env_vars.py`` / ``env_aliases.py``; Accelerate's import path
``accelerate.utils.environment`` gathers all of them (``hasten/utils/environment.py``).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import sys
from typing import TypeVar

from .env_aliases import get_flag_setting

T = TypeVar("T")  # the decorated function or class, returned as it came

logger = logging.getLogger("hasten.utils.environment")  # the name Accelerate logs these under (as_accelerate/logger_names.py)


def is_debug_mode() -> bool:
    """``HASTEN_DEBUG_MODE=1`` (or ``ACCELERATE_DEBUG_MODE=1``): extra consistency checks (see docs/debugging.md)."""
    return get_flag_setting("debug_mode")


# ----------------------------------------------------------------------------- passing variables on
_FORBIDDEN_IN_ENV_LINES = (";", "\n", "<", ">", " ")


def convert_dict_to_env_variables(current_env: dict) -> list[str]:
    """``["KEY=value\\n", ...]`` for writing an environment file; entries that are empty or contain ``;``,
    a newline, ``<``, ``>`` or a space (which would break or inject into the file) are skipped with a warning."""
    lines = []
    for key, value in current_env.items():
        key, value = str(key), str(value)
        if key and value and not any(char in key + value for char in _FORBIDDEN_IN_ENV_LINES):
            lines.append(f"{key}={value}\n")
        else:
            logger.warning("Skipping %s=%s: it is empty or contains a forbidden character (; < > space newline).",
                           key, value)
    return lines


def are_libraries_initialized(*library_names: str) -> list[str]:
    """The names among ``library_names`` that are already imported in this process."""
    return [name for name in library_names if name in sys.modules]


# ----------------------------------------------------------------------------- test isolation
_PURGED_PREFIXES = ("HASTEN_", "ACCELERATE_")
_PURGE_MARK = "_hasten_purges_environment"


def _launcher_variables() -> dict:
    return {key: value for key, value in os.environ.items() if key.startswith(_PURGED_PREFIXES)}


@contextlib.contextmanager
def _restored_launcher_variables():
    saved = _launcher_variables()
    try:
        yield
    finally:
        for key in _launcher_variables():
            if key not in saved:
                del os.environ[key]
        os.environ.update(saved)  # changed values back, and removed ones again


def _purging(function):
    if getattr(function, _PURGE_MARK, False):
        return function
    if inspect.iscoroutinefunction(function):
        @functools.wraps(function)
        async def wrapper(*args, **kwargs):
            with _restored_launcher_variables():
                return await function(*args, **kwargs)
    else:
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with _restored_launcher_variables():
                return function(*args, **kwargs)
    setattr(wrapper, _PURGE_MARK, True)
    return wrapper


def _purge_test_methods(cls: type) -> None:
    for name in dir(cls):
        if not name.startswith("test"):
            continue
        member = inspect.getattr_static(cls, name)
        if isinstance(member, (staticmethod, classmethod)):
            if not getattr(member.__func__, _PURGE_MARK, False):
                setattr(cls, name, type(member)(_purging(member.__func__)))
        elif inspect.isfunction(member):
            setattr(cls, name, _purging(member))


def purge_accelerate_environment(func_or_cls: T) -> T:
    """Decorator: every ``HASTEN_*`` / ``ACCELERATE_*`` environment variable is as it was after the call.

    Variables the call added are removed, changed ones get their value back and removed ones come back.
    On a class (``unittest.TestCase`` or a plain pytest class) it wraps every method whose name starts with
    ``test``, including inherited ones and those of subclasses defined later. Useful in test suites, where a
    library that sets e.g. ``ACCELERATE_MIXED_PRECISION`` would otherwise change the tests that follow.
    """
    if not isinstance(func_or_cls, type):
        return _purging(func_or_cls)
    cls = func_or_cls
    _purge_test_methods(cls)
    own = cls.__dict__.get("__init_subclass__")

    def __init_subclass__(subclass, **kwargs):
        if own is not None:
            own.__func__(subclass, **kwargs)
        else:
            super(cls, subclass).__init_subclass__(**kwargs)
        _purge_test_methods(subclass)

    cls.__init_subclass__ = classmethod(__init_subclass__)
    return cls
