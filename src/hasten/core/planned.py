"""The one error for Accelerate features whose hasten backend is planned but not built yet.

Their names exist (so ``import`` lines of migrated scripts work) and fail only when used, with a message
that says what is missing and what to do meanwhile.
"""
from __future__ import annotations

__all__ = ["NotYetSupportedError", "not_yet_supported"]


class NotYetSupportedError(NotImplementedError):
    """A feature hasten will provide but does not yet (a NotImplementedError, so old ``except`` clauses work)."""


def not_yet_supported(feature: str, meanwhile: str = "") -> NotYetSupportedError:
    """The error to raise when ``feature`` is used: ``raise not_yet_supported("FSDP", "train with DDP")``."""
    message = f"{feature} is not yet supported by hasten; it is planned."
    if meanwhile:
        message += f" Meanwhile: {meanwhile}."
    return NotYetSupportedError(message)
