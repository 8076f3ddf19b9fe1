"""Accelerate's enum helpers (``BaseEnum``, ``EnumWithContains``) and the SageMaker distributed type.

hasten's own enums (``hasten.config.enums``) are ``str`` enums; these exist so that code written against
``accelerate.utils.dataclasses`` — subclassing ``BaseEnum``, testing ``"value" in SomeEnum`` — keeps working.
"""
from __future__ import annotations

import enum

__all__ = ["EnumWithContains", "BaseEnum", "SageMakerDistributedType"]


class EnumWithContains(enum.EnumMeta):
    """A metaclass that makes ``value in EnumClass`` true for members and for their values."""

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(enum.Enum, metaclass=EnumWithContains):
    """An enum whose ``str()`` is its value, with ``list()`` giving every value."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        """Every value of the enum, as strings."""
        return list(map(str, cls))


class SageMakerDistributedType(str, enum.Enum):
    """How a job on Amazon SageMaker is distributed (SageMaker launching is not part of hasten)."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"
