"""Comparing versions of installed libraries (``compare_versions(">=", ...)`` style checks)."""
from __future__ import annotations

import importlib.metadata
import operator
from typing import Union

from packaging.version import InvalidVersion, Version

__all__ = ["compare_versions", "is_torch_version", "OPERATIONS", "torch_version", "HASTEN_VERSION"]

#: this package's version (``hasten.__version__``)
HASTEN_VERSION = "0.1.0"

# The comparison operators a requirement may use, by their usual spelling.
OPERATIONS = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    ">": operator.gt,
}


def _comparison(operation: str):
    try:
        return OPERATIONS[operation]
    except (KeyError, TypeError):
        raise ValueError(
            f"Unknown version comparison {operation!r}; use one of {', '.join(repr(o) for o in OPERATIONS)}."
        ) from None


def _parse(text, what: str) -> Version:
    try:
        return Version(str(text))
    except InvalidVersion:
        raise ValueError(f"{what} {text!r} is not a valid version (expected something like '2.4.0').") from None


def _installed_or_literal(library_or_version) -> Version:
    """A ``Version`` as is; a string is an installed distribution's name, or else a version literal."""
    if isinstance(library_or_version, Version):
        return library_or_version
    if not isinstance(library_or_version, str):
        raise TypeError(
            "compare_versions takes a library name, a version string or a packaging Version, got "
            f"{type(library_or_version).__name__}."
        )
    try:
        return Version(importlib.metadata.version(library_or_version))
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return Version(library_or_version)
    except InvalidVersion:
        raise importlib.metadata.PackageNotFoundError(
            f"{library_or_version!r} is neither an installed library nor a version string; install it "
            "(pip install ...) or pass a version such as '2.4.0'."
        ) from None


def compare_versions(library_or_version: Union[str, Version], operation: str, requirement_version: str) -> bool:
    """Whether ``library_or_version <operation> requirement_version`` holds.

    ``library_or_version`` is the name of an installed distribution (its version is looked up with
    ``importlib.metadata``), a version string, or a ``packaging.version.Version``. ``operation`` is one of
    ``<``, ``<=``, ``==``, ``!=``, ``>=``, ``>``.
    """
    compare = _comparison(operation)  # checked first: bad input fails before any lookup
    required = _parse(requirement_version, "requirement_version")
    return compare(_installed_or_literal(library_or_version), required)


def is_torch_version(operation: str, version: str) -> bool:
    """Whether the installed torch satisfies ``torch <operation> version`` (e.g. ``is_torch_version(">=", "2.4")``)."""
    return compare_versions(Version(importlib.metadata.version("torch")), operation, version)


def __getattr__(name: str):
    # ``torch_version``: the installed torch's version (a packaging ``Version``), looked up on first use.
    if name == "torch_version":
        value = Version(importlib.metadata.version("torch"))
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
