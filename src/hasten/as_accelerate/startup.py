"""``HASTEN_AS_ACCELERATE``: the switch read from the environment on ``import hasten``, which the start-up hook the
package installs (``hasten-as-accelerate.pth``) does at interpreter start whenever the variable is set.

``1`` / ``true`` turns it on, ``0`` / ``false`` / unset leaves everything as it is (an installed real accelerate
untouched); any other value is an error naming the variable. At interpreter start ``site`` only prints what a hook
raises and Python goes on, so the error is also left behind: every later ``import accelerate`` raises it, and so
does ``import hasten``.
"""
from __future__ import annotations

import importlib.abc
import os
import sys
from types import ModuleType
from typing import Optional, Sequence

from .switch import install_as_accelerate

__all__ = ["VARIABLE", "switch_from_environment", "honour_on_import"]

VARIABLE = "HASTEN_AS_ACCELERATE"
_ON, _OFF = ("1", "true"), ("", "0", "false")


def switch_from_environment() -> bool:
    """Whether the variable turns the switch on (``ValueError`` naming it for a value that is neither on nor off)."""
    value = os.environ.get(VARIABLE, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{VARIABLE}={os.environ[VARIABLE]!r} is not a switch value: use {VARIABLE}=1 (hasten answers "
                     f"every `import accelerate`) or {VARIABLE}=0 / unset it (the real accelerate, if installed).")


class Refusal(importlib.abc.MetaPathFinder):
    """Left on ``sys.meta_path`` when the variable is wrong: ``import accelerate`` raises the error instead of
    quietly giving the real accelerate or nothing."""

    def __init__(self, error: Exception):
        self.error = error

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> None:
        if fullname == "accelerate" or fullname.startswith("accelerate."):
            raise ImportError(str(self.error))
        return None


def honour_on_import() -> None:
    """``import hasten`` with the variable set: install the switch (a variable set after interpreter start counts
    too); a wrong value raises (and leaves the refusal behind), as does a real accelerate imported already."""
    try:
        on = switch_from_environment()
    except ValueError as error:
        if not any(isinstance(finder, Refusal) for finder in sys.meta_path):
            sys.meta_path.insert(0, Refusal(error))
        raise
    if on:
        install_as_accelerate()
