"""Accelerate's import path ``accelerate.utils.versions`` (``hasten/core/versions.py``)."""
from ..core.lazy import lazy_exports
from ..core.versions import OPERATIONS, compare_versions, is_torch_version  # noqa: F401

# ``torch_version`` is looked up on first use, as in its home
__getattr__, __dir__ = lazy_exports(__name__, {"torch_version": "hasten.core.versions"})

__all__ = [
    "compare_versions", "is_torch_version", "OPERATIONS", "torch_version",
]
