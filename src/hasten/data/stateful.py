"""torchdata's ``StatefulDataLoader`` behind the prepared loaders (``use_stateful_dataloader=True``).

``DataLoaderShard(..., use_stateful_dataloader=True)`` is an instance of ``StatefulDataLoaderShard``, a
class that inherits from both ``DataLoaderShard`` and torchdata's ``StatefulDataLoader`` (so ``isinstance``
answers yes to both, no proxy object). The classes are built on first use, so torchdata is imported only
when asked for, and they live in this module so that prepared loaders can be pickled.
"""
from __future__ import annotations

import importlib
import inspect

from ..utils.imports import require_extra

__all__ = ["stateful_dataloader_class", "stateful_variant", "drop_unsupported_kwargs"]

# Loader classes that have a stateful variant, by name (needed to rebuild a variant when unpickling).
_VARIANT_BASES = {
    "DataLoaderShard": "hasten.data.shard_loader",
    "DataLoaderDispatcher": "hasten.data.dispatcher",
    "SkipDataLoader": "hasten.data.resume",
}


def stateful_dataloader_class():
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
        base.load_state_dict(self, state_dict)

    variant = type(name, (cls, base), {
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"``{cls.__name__}`` backed by torchdata's ``StatefulDataLoader``.",
        "_is_stateful": True,
        "_base_state_dict": _base_state_dict,
        "_load_base_state_dict": _load_base_state_dict,
    })
    globals()[name] = variant
    return variant


def __getattr__(name: str):
    """Build ``Stateful<Loader>`` on demand (pickle looks classes up by module and name)."""
    base_name = name[len("Stateful"):] if name.startswith("Stateful") else None
    if base_name in _VARIANT_BASES:
        return stateful_variant(getattr(importlib.import_module(_VARIANT_BASES[base_name]), base_name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
