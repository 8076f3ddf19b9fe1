"""What every prepared loader shares: epochs, position, exact resume, and randomness that stays private.

A prepared loader is a real ``torch.utils.data.DataLoader`` subclass (or, with ``use_stateful_dataloader``,
also a subclass of torchdata's ``StatefulDataLoader``). On top of it, this module keeps:

- the epoch (``iteration``) and the number of batches yielded in the current pass;
- ``state_dict()`` / ``load_state_dict()``: the epoch, the position, the states the random generators had
  when the pass started and, where they exist, the dataset's or torchdata's own state (a stateful loader's
  state is torchdata's ``StatefulDataLoader`` state with hasten's keys beside it). Loading makes the
  next pass start exactly there: by starting the batch sampler at that batch (no sample is loaded), by
  restoring the dataset or torchdata state, and only as a last resort by reading and dropping batches.
  ``len()`` stays the length of a whole epoch (as Accelerate's and torchdata's loaders answer), so a resume
  loop can compute ``divmod(completed_steps, len(loader))``; only a ``skip_first_batches`` copy is shorter,
  by the batches it skips, until its first pass is over;
- a private ``torch.Generator`` for the loader when the user gave none, reseeded from the epoch: creating
  an iterator then never draws from torch's global generator, so the training script's later random numbers
  (dropout, augmentation) are the same whether or not a run was resumed.
"""
from __future__ import annotations

import copy
import inspect
import warnings
from typing import Any, Iterable, Optional

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset

from .batch_shard import BatchSamplerShard
from .iterable import IterableDatasetShard, has_own_state
from .progress import DataLoaderStateMixin
from .samplers import SeedableRandomSampler, get_sampler
from .stateful import (drop_unsupported_kwargs, is_torchdata_state, plain_batch_sampler_state, stateful_variant,
                       torchdata_position)
from .validation import check_non_negative_int

__all__ = ["PreparedDataLoader", "DataLoaderAdapter", "loader_options"]

# DataLoader settings a rebuilt loader keeps (batching is rebuilt, everything else carried over).
_CARRIED_OPTIONS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
                    "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order")
_STATEFUL_OPTIONS = ("snapshot_every_n_steps",)

_STATE_KEYS = ("epoch", "batches_yielded")
# Every key hasten's own state may hold; the other keys of a stateful loader's state are torchdata's.
_OWN_KEYS = _STATE_KEYS + ("generators", "sampler", "dataset", "dispatch_first_samples", "base")
# Per-pass bookkeeping a pickled copy starts without (it is between passes, like a loader never iterated).
_PASS_ATTRIBUTES = {"_iterator": None, "_active_copy": None, "_position": 0, "_pass_skip": 0, "_replay": 0,
                    "end_of_dataloader": False, "remainder": -1}
# Options DataLoader refuses next to a batch sampler (it decides batches itself), with their defaults.
_BATCH_SAMPLER_EXCLUSIVE = {"batch_size": 1, "shuffle": None, "sampler": None, "drop_last": False}


class _ItselfOnInstances:
    """``loader.base_dataloader``: the loader itself (Accelerate's wrappers keep the real loader there; a prepared
    loader is the real loader). Asked of the class, there is no loader: AttributeError, as in the reference."""

    def __get__(self, loader, owner=None):
        if loader is None:
            raise AttributeError(f"base_dataloader is an attribute of a {owner.__name__} object, not of the class.")
        return loader


def loader_options(dataloader: DataLoader, stateful: bool) -> dict:
    """The settings of ``dataloader`` that a loader rebuilt from it keeps (all but its batching)."""
    names = _CARRIED_OPTIONS + (_STATEFUL_OPTIONS if stateful else ())
    return {name: getattr(dataloader, name) for name in names if hasattr(dataloader, name)}


def _check_batch_sampler_options(owner: str, kwargs: dict) -> None:
    if kwargs.get("batch_sampler") is None:
        return
    clashing = [f"{key}={kwargs[key]!r}" for key, default in _BATCH_SAMPLER_EXCLUSIVE.items()
                if key in kwargs and kwargs[key] not in (default, None, False)]
    if clashing:
        raise ValueError(
            f"{owner} got batch_sampler={type(kwargs['batch_sampler']).__name__} together with "
            f"{', '.join(clashing)}: the batch sampler already decides which samples form each batch. Pass either "
            "batch_sampler=... alone, or batch_size/shuffle/sampler/drop_last without a batch sampler."
        )


class PreparedDataLoader(DataLoaderStateMixin, DataLoader):
    """Base of ``DataLoaderShard`` and ``DataLoaderDispatcher`` (see the module docstring)."""

    _is_stateful = False  # True in the StatefulDataLoader-backed variants (see stateful.py)
    _reads_data = True  # False where another process reads this loader's data (a dispatcher's receivers)

    def __new__(cls, *args, **kwargs):
        if not cls._is_stateful and _wants_stateful(cls, args, kwargs):
            cls = stateful_variant(cls)
        return super().__new__(cls)

    def __init__(self, dataset: Dataset, use_stateful_dataloader: bool = False,
                 batch_sampler: Optional[Iterable[list[int]]] = None, *, skip_batches: int = 0, iteration: int = 0,
                 **kwargs: Any):
        check_non_negative_int(skip_batches, "skip_batches")
        kwargs["batch_sampler"] = batch_sampler
        _check_batch_sampler_options(type(self).__name__, kwargs)
        self._private_generator_seed: Optional[int] = None
        if kwargs.get("generator") is None:
            # Never let an iterator draw its worker seeds from the global generator (see the module docstring).
            kwargs["generator"] = torch.Generator()
            self._private_generator_seed = torch.initial_seed()
        if use_stateful_dataloader:
            kwargs = drop_unsupported_kwargs(kwargs)
        elif "snapshot_every_n_steps" in kwargs:
            raise ValueError("snapshot_every_n_steps is a StatefulDataLoader option: pass use_stateful_dataloader=True.")
        with warnings.catch_warnings():
            # torchdata's constructor calls a torch API deprecated in recent versions; not the user's concern.
            warnings.filterwarnings("ignore", message=".*set_vital.* is deprecated", category=UserWarning)
            super().__init__(dataset, **kwargs)
        self.use_stateful_dataloader = use_stateful_dataloader
        self.skip_batches = skip_batches
        self.iteration = iteration
        self._pending_skip = skip_batches  # batches the next pass starts after
        self._length_skip = skip_batches  # batches len() leaves out: those skip_batches skips, until that pass ends
        self._pass_skip = 0  # batches the current pass started after
        self._position = 0  # batches of the current pass behind us, skipped ones included
        self._replay = 0  # batches the current pass must read and drop (no cheaper way to skip them)
        self._pass_start_generators: dict = {}
        self._pending_base_state = None
        self._pending_dataset_state = None
        self._loaded_state: Optional[dict] = None
        self._lookahead_state: dict = {}  # states taken before reading ahead, matching the batch just yielded

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict:
        """Everything but a live pass: no iterator (worker processes cannot be pickled); the copy starts its
        next pass where the original's next pass would start."""
        state = dict(self.__dict__)
        state.update(_PASS_ATTRIBUTES)
        state["_lookahead_state"] = {}
        if getattr(self, "_initial_iter_for_state_dict", False):  # torchdata: state_dict() made an iterator
            state["_initial_iter_for_state_dict"] = False
        return state

    # ------------------------------------------------------------------ compatibility
    base_dataloader = _ItselfOnInstances()

    def get_sampler(self) -> Optional[Iterable[int]]:
        return get_sampler(self)

    def set_sampler(self, sampler: Iterable[int]) -> None:
        """Replace the index sampler under the batching (e.g. with a ``SeedableRandomSampler``)."""
        holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        holder.sampler = sampler

    @property
    def total_dataset_length(self) -> int:
        dataset = self.dataset
        return dataset.total_length if isinstance(dataset, IterableDatasetShard) else len(dataset)

    # ------------------------------------------------------------------ epochs
    def set_epoch(self, epoch: int) -> None:
        """Set the epoch: it picks the shuffle of seeded samplers and datasets (forwarded to all that take one)."""
        self.iteration = epoch
        batching = self.batch_sampler if self.batch_sampler is not None else self.sampler
        from .batch_shard import BatchSamplerShard, SampleShard

        # hasten's shards forward the epoch to what they wrap; a plain batch sampler does not: reach its sampler too
        forwards = isinstance(batching, (BatchSamplerShard, SampleShard)) and hasattr(batching, "set_epoch")
        candidates = (batching,) + (() if forwards else (get_sampler(self),)) + (self.dataset,)
        targets = {id(target): target for target in candidates if target is not None and hasattr(target, "set_epoch")}
        for target in targets.values():
            target.set_epoch(epoch)

    def _owned_generators(self) -> dict:
        """Generators whose state decides this pass's order (and is not rebuilt from the epoch)."""
        sampler = get_sampler(self)
        if sampler is None:  # a batch sampler without index sampler: its own generator decides the order
            batching = self.batch_sampler if self.batch_sampler is not None else self.sampler
            sampler = getattr(batching, "batch_sampler", batching)
        dataset = self.dataset.dataset if isinstance(self.dataset, IterableDatasetShard) else self.dataset
        candidates = (
            ("sampler", None if isinstance(sampler, SeedableRandomSampler) else getattr(sampler, "generator", None)),
            ("dataset", getattr(dataset, "generator", None)),
            ("loader", None if self._private_generator_seed is not None else self.generator),
        )
        found: dict = {}
        for role, generator in candidates:
            if isinstance(generator, torch.Generator) and all(generator is not g for g in found.values()):
                found[role] = generator
        return found

    # ------------------------------------------------------------------ a pass
    def _begin_pass(self) -> None:
        """Everything a pass does before its first batch is read."""
        origin = self.__dict__.get("_origin")
        if origin is not None:
            origin._active_copy = self
        self.begin()
        self.set_epoch(self.iteration)
        if self._private_generator_seed is not None:
            self.generator.manual_seed((self._private_generator_seed + self.iteration) % 2**64)
        self._pass_start_generators = {role: g.get_state() for role, g in self._owned_generators().items()}
        self._lookahead_state = {}
        self._pass_skip = self._position = self._start_from_resume()

    def _end_pass(self, completed: bool) -> None:
        self.end()
        if completed:
            self.iteration += 1
            self._position = self._pass_skip = self._length_skip = 0
        origin = self.__dict__.get("_origin")
        if origin is not None and completed:
            origin.iteration = self.iteration
            origin._active_copy = None

    def _start_from_resume(self) -> int:
        """Set up the pending skip or restored state; return the batch the pass starts at."""
        skip, self._pending_skip = self._pending_skip, 0
        if not skip:
            self._length_skip = 0
        base_state, self._pending_base_state = self._pending_base_state, None
        dataset_state, self._pending_dataset_state = self._pending_dataset_state, None
        self._loaded_state = None
        self._replay = 0
        if base_state is not None:
            self._load_base_state_dict(base_state)
        elif dataset_state is not None:
            self._resumable_dataset().load_state_dict(dataset_state)
        elif skip:
            positioner, samples_per_batch = self._positioner()
            if positioner is not None:
                positioner.start_at(skip * samples_per_batch)
            else:
                self._replay = self._replay_count(skip)
        return skip

    def _replay_count(self, skip: int) -> int:
        """Batches of the underlying loader to read and drop for ``skip`` batches of this one."""
        return skip

    def _positioner(self):
        """``(batch sampler that can start at a batch, sampler items per batch of this loader)`` or ``(None, 0)``."""
        if isinstance(self.batch_sampler, BatchSamplerShard):
            return self.batch_sampler, 1
        if isinstance(self.sampler, BatchSamplerShard):  # a batch sampler given as `sampler=`
            return self.sampler, (self.batch_size or 1)
        return None, 0

    def _resumable_dataset(self):
        """The iterable dataset whose own state can stand for the position, or None."""
        dataset = self.dataset
        if isinstance(dataset, IterableDataset) and has_own_state(dataset) and self.num_workers == 0:
            return dataset
        return None

    def _lookahead_snapshotter(self):
        """A function returning the states to remember before each read-ahead, or None when there are none."""
        if self._is_stateful:
            return lambda: {"base": self._base_state_dict()}
        dataset = self._resumable_dataset()
        if dataset is not None:
            return lambda: {"dataset": dataset.state_dict()}
        return None

    def _base_state_dict(self):  # overridden by the StatefulDataLoader variants
        raise RuntimeError("This loader is not backed by a StatefulDataLoader.")

    def _load_base_state_dict(self, state_dict) -> None:  # overridden by the StatefulDataLoader variants
        raise ValueError(
            "This state holds torchdata's StatefulDataLoader state (saved by a loader prepared with "
            "use_stateful_dataloader=True, or by torchdata itself); prepare this loader with "
            "use_stateful_dataloader=True to restore it."
        )

    # ------------------------------------------------------------------ length
    def _full_length(self) -> int:
        return DataLoader.__len__(self)

    def __len__(self) -> int:
        """Batches of a whole epoch (restoring a position does not change it); a ``skip_first_batches`` copy
        is shorter by the batches it skips until its first pass is over."""
        return max(0, self._full_length() - self._length_skip)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        """Where this loader is, for ``load_state_dict``.

        A loader prepared with ``use_stateful_dataloader=True`` answers as torchdata's ``StatefulDataLoader``
        does, key for key (taken before the batch read ahead), so the state equals torchdata's own loader's and
        loads into torchdata's and Accelerate's loaders; like theirs, it continues the current epoch. Any other
        loader answers ``resume_state_dict()``. ``Accelerator.save_state`` stores ``resume_state_dict()``.
        """
        state = self.resume_state_dict()
        if not self._is_stateful:
            return state
        torchdata_part = {key: value for key, value in state.items() if key not in _OWN_KEYS}
        if not is_torchdata_state(torchdata_part):
            return state  # nothing of torchdata's to say (a dispatcher's receiving process)
        return plain_batch_sampler_state(torchdata_part)

    def resume_state_dict(self) -> dict:
        """Where this loader is, in full: restore it with ``load_state_dict`` to continue exactly from here, the
        epoch counter and the random generators included.

        Keys: ``epoch``, ``batches_yielded`` (in that epoch), ``generators`` (states at the start of the
        pass), ``sampler`` (a ``SeedableRandomSampler``'s seed) and, mid-pass, ``dataset`` (an iterable
        dataset's own state). After the last batch of a pass it points at the next epoch. A loader prepared
        with ``use_stateful_dataloader=True`` adds torchdata's ``StatefulDataLoader`` state beside them (its
        top-level keys).
        """
        active = self.__dict__.get("_active_copy")
        if active is not None:
            return active.resume_state_dict()
        if self._loaded_state is not None:
            return copy.deepcopy(self._loaded_state)
        mid_pass = self._position > 0 and not self.end_of_dataloader
        finished_pass = self._position > 0 and self.end_of_dataloader
        generators = (self._pass_start_generators if mid_pass
                      else {role: g.get_state() for role, g in self._owned_generators().items()})
        state = {
            "epoch": self.iteration + int(finished_pass),
            "batches_yielded": self._position if mid_pass else 0,
            "generators": {role: value.clone() for role, value in generators.items()},
        }
        sampler = get_sampler(self)
        if isinstance(sampler, SeedableRandomSampler):
            state["sampler"] = {"epoch": state["epoch"], "seed": sampler.initial_seed}
        base = None
        if mid_pass:
            lookahead = copy.deepcopy(self._lookahead_state)
            base = lookahead.pop("base", None)
            state.update(lookahead)
        elif self._is_stateful:
            base = self._idle_base_state_dict()
        if base is not None:
            state = {**self._portable_base_state(base), **state}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next pass continue from ``state_dict`` (from ``state_dict()``): same epoch, same order, next
        batch; later passes go on as they would have.

        A stateful loader also takes a plain torchdata ``StatefulDataLoader`` state (it continues its current
        epoch at the batch that state had reached) and the older hasten format (torchdata's state under
        ``"base"``)."""
        if not isinstance(state_dict, dict):
            raise self._foreign_state(state_dict)
        if any(key not in state_dict for key in _STATE_KEYS):
            if is_torchdata_state(state_dict):
                self._load_plain_base_state(state_dict)
                return
            raise self._foreign_state(state_dict)
        base = state_dict.get("base")
        if base is None:
            portable = {key: value for key, value in state_dict.items() if key not in _OWN_KEYS}
            if is_torchdata_state(portable) and int(state_dict["batches_yielded"]) > 0:
                base = portable  # mid-pass: torchdata's state restores the position (before: hasten's alone)
        if base is not None and not self._is_stateful:
            self._load_base_state_dict(base)  # raises the explanation
        generators = self._owned_generators()
        for role, value in state_dict.get("generators", {}).items():
            if role not in generators:
                raise ValueError(
                    f"The saved state restores a {role!r} random generator but this loader has none: it was saved "
                    "from a loader built differently (shuffle, generator=...). Prepare the same loader as the saved run."
                )
            generators[role].set_state(value)
        sampler = get_sampler(self)
        if "sampler" in state_dict and isinstance(sampler, SeedableRandomSampler):
            sampler.load_state_dict(state_dict["sampler"])
        self.iteration = int(state_dict["epoch"])
        self._pending_skip = check_non_negative_int(int(state_dict["batches_yielded"]), "batches_yielded")
        self._length_skip = 0
        self._pending_base_state = base
        self._pending_dataset_state = state_dict.get("dataset")
        if self._pending_dataset_state is not None and self._resumable_dataset() is None:
            raise ValueError(
                "The saved state holds the dataset's own state, but this loader's dataset cannot load it (it has "
                "no load_state_dict, or num_workers > 0): prepare the same loader as the saved run."
            )
        self._loaded_state = copy.deepcopy(state_dict)

    def _load_plain_base_state(self, state_dict: dict) -> None:
        """A state from torchdata's own ``StatefulDataLoader`` (no epoch of hasten's): continue this epoch there."""
        if not self._is_stateful:
            self._load_base_state_dict(state_dict)  # raises the explanation
        finished = bool(state_dict.get("_iterator_finished"))
        self._pending_skip = 0 if finished else torchdata_position(state_dict)
        self._length_skip = 0
        self._pending_base_state = None if finished else state_dict
        self._pending_dataset_state = None
        self._loaded_state = copy.deepcopy(state_dict)

    def _foreign_state(self, state_dict) -> ValueError:
        return ValueError(
            f"{type(self).__name__}.load_state_dict needs a dict from state_dict() with keys {_STATE_KEYS} (or, "
            f"with use_stateful_dataloader=True, a torchdata StatefulDataLoader state); got {state_dict!r:.200}."
        )

    def adjust_state_dict_for_prefetch(self) -> None:
        """Accelerate's hook to correct a state taken after batches were read ahead. hasten takes the state
        before reading ahead, so there is nothing to adjust."""

    # Overridden by the StatefulDataLoader variants (stateful.py).
    def _idle_base_state_dict(self):
        return None

    def _portable_base_state(self, base: dict) -> dict:
        return base


DataLoaderAdapter = PreparedDataLoader  # Accelerate's name for the base of its prepared loaders


def _wants_stateful(cls, args: tuple, kwargs: dict) -> bool:
    """Whether the constructor call ``cls(*args, **kwargs)`` asks for ``use_stateful_dataloader``."""
    if "use_stateful_dataloader" in kwargs or len(args) < 2:  # the dataset alone is positional, as usual
        return bool(kwargs.get("use_stateful_dataloader", False))
    try:
        bound = inspect.signature(cls.__init__).bind_partial(None, *args, **kwargs)
    except TypeError:
        return False
    return bool(bound.arguments.get("use_stateful_dataloader", False))
