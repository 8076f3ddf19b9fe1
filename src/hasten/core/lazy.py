"""Lazy re-exports: a package's public names are imported from their home module on first use.

Keeps ``import hasten`` and the ``hasten`` command fast (no optional or heavy module is imported until a
name from it is used) while every Accelerate-style import path keeps working.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, table: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return ``(__getattr__, __dir__)`` for a package whose names live in the modules given by ``table``.

    ``table`` maps a public name to the absolute module that defines it.
    """

    def __getattr__(name: str) -> Any:
        module_name = table.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name), name)
        importlib.import_module(package).__dict__[name] = value  # cache: next lookup is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(table) | set(importlib.import_module(package).__dict__))

    return __getattr__, __dir__


def build_table(groups: dict[str, list[str]]) -> dict[str, str]:
    """``{"hasten.utils.operations": ["gather", ...]}`` -> ``{"gather": "hasten.utils.operations", ...}``."""
    table = {}
    for module_name, names in groups.items():
        for name in names:
            if name in table:
                raise RuntimeError(f"{name!r} is exported by both {table[name]} and {module_name}")
            table[name] = module_name
    return table
