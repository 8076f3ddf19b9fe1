"""Accelerate's ``accelerate.data_loader`` import path: the names of ``hasten.data`` (not a copy)."""
from .config.data import DataLoaderConfiguration
from .data import (BatchSamplerShard, DataLoaderAdapter, DataLoaderDispatcher, DataLoaderShard, DataLoaderStateMixin,
                   IterableDatasetShard, SeedableRandomSampler, SkipBatchSampler, SkipDataLoader, get_sampler,
                   prepare_data_loader, skip_first_batches)

__all__ = [
    "BatchSamplerShard", "DataLoaderAdapter", "DataLoaderConfiguration", "DataLoaderDispatcher", "DataLoaderShard",
    "DataLoaderStateMixin", "IterableDatasetShard", "SeedableRandomSampler", "SkipBatchSampler", "SkipDataLoader",
    "get_sampler", "prepare_data_loader", "skip_first_batches",
]
