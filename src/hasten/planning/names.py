"""The names a plan's options take, importable without torch (``hasten plan --help`` lists them)."""
from __future__ import annotations

__all__ = ["FAMILIES", "OPTIMIZER_NAMES"]

#: every family of layouts, in the order the table lists them (``layouts.py``)
FAMILIES = ("single", "ddp", "fsdp2", "fsdp2_offload", "hsdp", "fsdp1", "zero", "tp", "fsdp2_tp", "cp")
#: the optimizers a plan knows (``traces.OPTIMIZERS``)
OPTIMIZER_NAMES = ("adamw", "adam", "sgd", "sgd_momentum", "adafactor", "adam8bit")
