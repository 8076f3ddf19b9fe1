"""``unwrap_model(model).save_pretrained(folder)`` on a model sharded with FSDP2 (or tensor parallelism).

transformers' and PEFT's ``save_pretrained`` write ``model.state_dict()``, which under FSDP2 holds DTensor shards:
safetensors refuses them (the reference library stops there too; its answer is to pass
``state_dict=accelerator.get_state_dict(model)``). When a model with such a method is prepared, hasten gives the
prepared model a ``save_pretrained`` of its own: without a ``state_dict=`` it gathers the full weights first (every
process takes part: each holds a shard), the main process writes them with the library's own method, and the other
processes return without writing. Given a ``state_dict=``, the library's method runs unchanged, on any process.

A call on the main process only (``if accelerator.is_main_process:``) cannot gather: the main process waits up to
``HASTEN_SAVE_PRETRAINED_JOIN_TIMEOUT`` seconds (default 60) for the others to call it too, then raises an error
saying how to call it. The processes meet in the process group's store, one meeting per call.
"""
from __future__ import annotations

import inspect
import itertools
import time
import types
from datetime import timedelta

from torch import nn

from ...core.env_aliases import get_setting

__all__ = ["gather_in_save_pretrained", "SavePretrainedOnOneProcessError"]

_DEFAULT_JOIN_SECONDS = 60.0
_calls = itertools.count(1)


class SavePretrainedOnOneProcessError(RuntimeError):
    """``save_pretrained`` of a sharded model was called on some processes only."""


def gather_in_save_pretrained(model: nn.Module) -> None:
    """Give ``model`` (sharded in place) the gathering ``save_pretrained`` described above, when its class has a
    ``save_pretrained`` that takes ``state_dict``."""
    method = getattr(type(model), "save_pretrained", None)
    if method is None or "save_pretrained" in vars(model):
        return
    try:
        takes_state_dict = "state_dict" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        takes_state_dict = False
    if takes_state_dict:
        model.save_pretrained = types.MethodType(_save_pretrained, model)


def _save_pretrained(self: nn.Module, save_directory, *args, **kwargs):
    if kwargs.get("state_dict") is not None:
        return type(self).save_pretrained(self, save_directory, *args, **kwargs)
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    _meet_the_other_processes()
    full = get_model_state_dict(self, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return None  # the main process writes; the others only gave their shards
    return type(self).save_pretrained(self, save_directory, *args, state_dict=full, **kwargs)


def _join_seconds() -> float:
    return get_setting("save_pretrained_join_timeout", _DEFAULT_JOIN_SECONDS, parse=float)


def _meet_the_other_processes() -> None:
    """Every process that calls counts itself in; the main process waits for all (see the module docstring)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    world = dist.get_world_size()
    if world == 1:
        return
    store = distributed_c10d._get_default_store()
    key = f"hasten/save_pretrained/{next(_calls)}"
    store.add(f"{key}/arrived", 1)
    if dist.get_rank() == 0:
        deadline = time.monotonic() + _join_seconds()
        while store.add(f"{key}/arrived", 0) < world and time.monotonic() < deadline:
            time.sleep(0.005)
        arrived = store.add(f"{key}/arrived", 0)
        store.set(f"{key}/decision", "gather" if arrived >= world else "refuse")
    else:
        store.wait([f"{key}/decision"], getattr(distributed_c10d, "default_pg_timeout", timedelta(minutes=30)))
    if store.get(f"{key}/decision").decode() == "gather":
        return
    raise SavePretrainedOnOneProcessError(
        "save_pretrained of a model sharded over several processes (FSDP2, tensor parallelism) was called on "
        f"{'the main process' if dist.get_rank() == 0 else 'this process'} while the other processes did not call it "
        f"within {_join_seconds():g} s (HASTEN_SAVE_PRETRAINED_JOIN_TIMEOUT): every process holds a shard of the "
        "weights, so every process must call it. Call accelerator.unwrap_model(model).save_pretrained(folder) on "
        "every process (only the main process writes), or gather first on every process and write on the main one: "
        "state_dict = accelerator.get_state_dict(model); then, on the main process, "
        "unwrapped.save_pretrained(folder, state_dict=state_dict).")

