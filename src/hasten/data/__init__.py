"""Data loading: each process's share of the data, dispatching, reproducible shuffles and exact resume.

``prepare_data_loader`` is the entry point; the classes are what it builds. ``hasten.data_loader`` is the
same API under the import path Accelerate users write.
"""
from .batch_shard import BatchSamplerShard
from .dispatcher import DataLoaderDispatcher
from .loader_core import DataLoaderAdapter
from .iterable import IterableDatasetShard
from .prepare import prepare_data_loader
from .progress import DataLoaderStateMixin
from .resume import SkipBatchSampler, SkipDataLoader, skip_first_batches
from .samplers import SeedableRandomSampler, get_sampler
from .shard_loader import DataLoaderShard

__all__ = [
    "BatchSamplerShard", "DataLoaderAdapter", "DataLoaderDispatcher", "DataLoaderShard", "DataLoaderStateMixin", "IterableDatasetShard",
    "SeedableRandomSampler", "SkipBatchSampler", "SkipDataLoader", "get_sampler", "prepare_data_loader",
    "skip_first_batches",
]
