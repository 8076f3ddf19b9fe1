"""Helpers shipped with hasten for checking an installation (used by ``hasten test``)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["sanity_script_path", "path_in_hasten_package"]


def path_in_hasten_package(*parts: str) -> Path:
    """The path of a file inside the installed ``hasten`` package."""
    return Path(__file__).resolve().parent.parent.joinpath(*parts)


def sanity_script_path() -> Path:
    """The script ``hasten test`` launches: process state, a gather, a broadcast and a barrier."""
    return path_in_hasten_package("test_utils", "scripts", "sanity_check.py")
