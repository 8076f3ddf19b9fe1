"""One process on one device: the base behaviour, nothing to synchronise."""
from ..config.enums import DistributedType
from .base import Strategy


class SingleDeviceStrategy(Strategy):
    """Models are moved to the process's device; gradients need no synchronisation."""

    distributed_type = DistributedType.NO
