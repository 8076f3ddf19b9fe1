"""torchdata's ``StatefulDataLoader`` behind the prepared loaders (``use_stateful_dataloader=True``).

``DataLoaderShard(..., use_stateful_dataloader=True)`` is an instance of ``StatefulDataLoaderShard``, a
class that inherits from both ``DataLoaderShard`` and torchdata's ``StatefulDataLoader`` (so ``isinstance``
answers yes to both, no proxy object). The classes are built on first use, so torchdata is imported only
when asked for, and they live in this module so that prepared loaders can be pickled.

A stateful loader's ``state_dict()`` is torchdata's own state (taken before the batch read ahead, so it
needs no prefetch correction) with hasten's keys beside it; the helpers here read and adapt the torchdata
part so that states move between hasten, torchdata and Accelerate.
"""
from __future__ import annotations

import copy
import importlib
import inspect
from typing import Any

from torch.utils.data import IterDataPipe

from ..core.imports import require_extra
from .batch_shard import BatchSamplerShard

__all__ = ["stateful_dataloader_class", "stateful_variant", "drop_unsupported_kwargs", "is_torchdata_state",
           "torchdata_position", "plain_batch_sampler_state"]

# torchdata's keys: every state has the first; a single-process one has the second, a multi-worker one the third.
_FINISHED, _NUM_YIELDED, _SNAPSHOT = "_iterator_finished", "_num_yielded", "_snapshot"


def is_torchdata_state(state: Any) -> bool:
    """Whether ``state`` is (or holds at its top level) a torchdata ``StatefulDataLoader`` state."""
    return isinstance(state, dict) and _FINISHED in state and (_NUM_YIELDED in state or _SNAPSHOT in state)


def _main_state(state: dict) -> dict:
    """The part of a torchdata state that the main process's iterator keeps (the sampler's position)."""
    return state[_SNAPSHOT]["_main_snapshot"] if _SNAPSHOT in state else state


def torchdata_position(state: dict) -> int:
    """Batches a torchdata state had yielded in its epoch."""
    if _SNAPSHOT in state:
        return int(state[_SNAPSHOT]["_snapshot_step"]) + int(state.get("_steps_since_snapshot", 0))
    return int(state[_NUM_YIELDED])


def _with_shard_position(state: dict) -> dict:
    """``state`` with an index-sampler state a ``BatchSamplerShard`` can load.

    A state saved by another loader (torchdata's own, Accelerate's) holds its batch sampler's state or None
    there; the shard starts at the batches that loader had drawn from its index sampler instead.
    """
    main = _main_state(state)
    sampler_state = main.get("_index_sampler_state")
    if isinstance(sampler_state, dict) and "batches_yielded" in sampler_state:
        return state
    state = copy.deepcopy(state)
    _main_state(state)["_index_sampler_state"] = {"batches_yielded": int(main.get("_sampler_iter_yielded", 0))}
    return state


def plain_batch_sampler_state(state: dict) -> dict:
    """``state`` as torchdata's own loader reports it: where hasten's ``BatchSamplerShard`` recorded only its
    position, which torchdata's ``_sampler_iter_yielded`` already holds, the index-sampler state is None (a plain
    ``BatchSampler`` has none). A shard that also holds a seedable sampler's epoch and seed keeps its state."""
    main = _main_state(state)
    shard = main.get("_index_sampler_state")
    if not (isinstance(shard, dict) and set(shard) == {"batches_yielded"}
            and shard["batches_yielded"] == main.get("_sampler_iter_yielded")):
        return state
    state = copy.copy(state)
    if _SNAPSHOT in state:
        state[_SNAPSHOT] = {**state[_SNAPSHOT], "_main_snapshot": {**main, "_index_sampler_state": None}}
    else:
        state["_index_sampler_state"] = None
    return state


# Loader classes that have a stateful variant, by name (needed to rebuild a variant when unpickling).
_VARIANT_BASES = {
    "DataLoaderShard": "hasten.data.shard_loader",
    "DataLoaderDispatcher": "hasten.data.dispatcher",
    "SkipDataLoader": "hasten.data.resume",
}


def stateful_dataloader_class() -> type:
    """torchdata's ``StatefulDataLoader`` class, or ImportError naming the extra that installs it."""
    torchdata = require_extra("torchdata", "use_stateful_dataloader=True (torchdata >= 0.8's StatefulDataLoader)")
    try:
        module = importlib.import_module("torchdata.stateful_dataloader")
    except ImportError:
        raise ImportError(
            f"use_stateful_dataloader=True needs torchdata >= 0.8 (StatefulDataLoader); the installed version is "
            f"{getattr(torchdata, '__version__', 'older')}: pip install -U 'hasten[stateful]'"
        ) from None
    return module.StatefulDataLoader


# DataLoader options that older torchdata versions do not take, with the value that means "not used".
_RECENT_OPTIONS = {"in_order": True}


def drop_unsupported_kwargs(kwargs: dict) -> dict:
    """``kwargs`` without the recent DataLoader options this torchdata version does not take (when unused)."""
    accepted = inspect.signature(stateful_dataloader_class().__init__).parameters
    kept = dict(kwargs)
    for option, unused in _RECENT_OPTIONS.items():
        if option in kept and option not in accepted:
            if kept[option] != unused:
                raise ValueError(
                    f"{option}={kept[option]!r} is not supported by the installed torchdata's StatefulDataLoader: "
                    "upgrade torchdata (pip install -U torchdata) or leave the option at its default."
                )
            del kept[option]
    return kept


def stateful_variant(cls: type) -> type:
    """The subclass of ``cls`` and ``StatefulDataLoader`` (built once, then reused)."""
    name = "Stateful" + cls.__name__
    variant = globals().get(name)
    if variant is not None and variant.__bases__[0] is cls:
        return variant
    base = stateful_dataloader_class()

    def _base_state_dict(self):
        return base.state_dict(self)

    def _load_base_state_dict(self, state_dict):
        if isinstance(self._index_sampler, BatchSamplerShard):
            state_dict = _with_shard_position(state_dict)
        base.load_state_dict(self, state_dict)

    def _idle_base_state_dict(self):
        """torchdata's state between passes, without changing what the next pass does."""
        if self._iterator is not None:  # the last pass's iterator: asking it changes nothing
            return base.state_dict(self)
        if not self._reads_data or isinstance(self.dataset, IterDataPipe):
            return None  # nothing to say (a dispatcher's receiving process), or a new iterator runs a collective
        # torchdata answers with a fresh iterator, which draws its worker seed from the loader's generator (and
        # may start workers): take the answer, then put the iterator and the generators back as they were.
        generators = {id(g): g for g in (self.generator, *self._owned_generators().values()) if g is not None}
        saved = [(g, g.get_state()) for g in generators.values()]
        try:
            return base.state_dict(self)
        finally:
            iterator, self._iterator = self._iterator, None
            self._initial_iter_for_state_dict = False
            if hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
            for generator, state in saved:
                generator.set_state(state)

    def _portable_base_state(self, state):
        """The torchdata state plus the position as a plain torchdata batch sampler reads it (samples drawn)."""
        size = getattr(self._index_sampler, "batch_size", None)
        if _main_state(state).get("_sampler_iter_state") is not None or not isinstance(size, int):
            return state
        state = copy.deepcopy(state)
        main = _main_state(state)
        shard = main.get("_index_sampler_state")
        batches = shard["batches_yielded"] if isinstance(shard, dict) and "batches_yielded" in shard \
            else main.get("_sampler_iter_yielded", 0)
        main["_sampler_iter_state"] = {"samples_yielded": int(batches) * size}
        return state

    variant = type(name, (cls, base), {
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"``{cls.__name__}`` backed by torchdata's ``StatefulDataLoader``.",
        "_is_stateful": True,
        "_base_state_dict": _base_state_dict,
        "_load_base_state_dict": _load_base_state_dict,
        "_idle_base_state_dict": _idle_base_state_dict,
        "_portable_base_state": _portable_base_state,
    })
    globals()[name] = variant
    return variant


def __getattr__(name: str):
    """Build ``Stateful<Loader>`` on demand (pickle looks classes up by module and name)."""
    base_name = name[len("Stateful"):] if name.startswith("Stateful") else None
    if base_name in _VARIANT_BASES:
        return stateful_variant(getattr(importlib.import_module(_VARIANT_BASES[base_name]), base_name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
