"""``broadcast_from_rank0``: only rank 0 opens the checkpoint; the tensors reach the other ranks (and are
sharded there for DTensor models) through PyTorch's ``set_model_state_dict``.

Rank 0 checks the checkpoint first and tells every rank how many files follow, or what went wrong, so a bad
checkpoint raises the same error everywhere instead of leaving the other ranks waiting in a collective.
"""
from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist
import torch.nn as nn


def load_from_rank0(model: nn.Module, open_and_check: Callable[[], tuple[Any, ...]], full_state_dict: bool) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("broadcast_from_rank0=True needs an initialised process group (launch with `hasten launch`).")
    rank = dist.get_rank()
    readers, keys_by_file, model_keys = [], [], set()
    failure = None
    if rank == 0:
        try:
            readers, keys_by_file, model_keys, *_ = open_and_check()
        except Exception as error:  # told to every rank below, then raised here
            failure = error
    message = [len(readers), None if failure is None else f"{type(failure).__name__}: {failure}"]
    dist.broadcast_object_list(message, src=0)
    if failure is not None:
        raise failure
    if message[1] is not None:
        raise ValueError(f"Rank 0 could not load the checkpoint: {message[1]}")
    options = StateDictOptions(full_state_dict=full_state_dict, strict=False, broadcast_from_rank0=True)
    for index in range(message[0]):
        state = {}
        if rank == 0:
            state = dict(readers[index].tensors([k for k in keys_by_file[index] if k in model_keys]))
        set_model_state_dict(model, state, options=options)
        del state
