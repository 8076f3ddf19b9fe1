"""Lazy imports of the trackers' third-party packages, with an error that says how to install a missing one."""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
from types import ModuleType
from typing import Optional

__all__ = ["how_to_install", "import_tracker_package"]


@functools.lru_cache(maxsize=None)
def _extra_installing(distribution: str) -> Optional[str]:
    """The extra of hasten whose requirements name ``distribution``, read from hasten's installed metadata
    (pyproject.toml's optional dependencies, the one place they are listed); None when no extra does, or when
    hasten runs from a source folder without metadata."""
    from packaging.requirements import Requirement

    try:
        metadata = importlib.metadata.metadata("hasten")
    except importlib.metadata.PackageNotFoundError:
        return None
    extras = metadata.get_all("Provides-Extra") or []
    wanted = distribution.lower().replace("_", "-")
    for line in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.name.lower().replace("_", "-") != wanted or requirement.marker is None:
            continue
        for extra in extras:
            if requirement.marker.evaluate({"extra": extra}):
                return extra
    return None


def how_to_install(distribution: str) -> str:
    """The pip command that installs ``distribution``: through hasten's extra when one lists it."""
    extra = _extra_installing(distribution)
    return f"pip install 'hasten[{extra}]' (or pip install {distribution})" if extra else f"pip install {distribution}"


def import_tracker_package(module: str, tracker: str, distribution: str | None = None) -> ModuleType:
    """Import ``module`` for the ``tracker`` tracker, or raise ImportError naming the pip command that installs it.

    Imports happen when a tracker starts, never when hasten is imported: the packages are heavy and optional.
    """
    distribution = distribution or module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"The {tracker!r} tracker needs the `{distribution}` package, which is not installed "
                          f"({error}): {how_to_install(distribution)}") from error
