"""``DataLoaderConfiguration``: how the Accelerator prepares data loaders (see ``prepare_data_loader``)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from .booleans import normalize_bool_fields

__all__ = ["DataLoaderConfiguration"]

@dataclass
class DataLoaderConfiguration:
    """Options of the prepared data loaders; each has the meaning of the same argument of ``prepare_data_loader``.

    split_batches: split each batch of the original loader across processes (batch size stays the same)
        instead of giving each process whole batches (global batch size = batch size x processes).
    dispatch_batches: read on the main process only and send each process its share; ``None`` means
        "yes for an ``IterableDataset``, no otherwise".
    even_batches: repeat samples from the start so every process gets the same number of full batches.
    use_seedable_sampler: shuffle with ``SeedableRandomSampler`` (bitwise reproducible, changes with ``set_epoch``).
    data_seed: seed of that sampler (``None``: torch's initial seed).
    non_blocking: asynchronous host-to-device copies (pair with ``pin_memory=True``).
    use_stateful_dataloader: back loaders with torchdata's ``StatefulDataLoader`` (extra ``hasten[stateful]``).
    """

    split_batches: bool = False
    dispatch_batches: Optional[bool] = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: Optional[int] = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __post_init__(self):
        normalize_bool_fields(self)  # "no" -> False; anything unreadable is an error naming the field
        if self.data_seed is not None and (not isinstance(self.data_seed, int) or isinstance(self.data_seed, bool)
                                           or self.data_seed < 0):
            raise ValueError(f"DataLoaderConfiguration.data_seed must be None or an int >= 0, got {self.data_seed!r}.")

    def to_kwargs(self) -> dict:
        """The options as keyword arguments of ``prepare_data_loader``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
