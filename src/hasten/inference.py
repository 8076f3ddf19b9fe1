"""Accelerate's ``accelerate.inference``: pipeline-parallel inference (``prepare_pippy``) is planned, not built yet.

Planning works now: ``generate_device_map`` splits a model into balanced per-process parts and
``find_pippy_batch_size`` finds the batch size of the inputs. Building and running the pipeline raise
``NotYetSupportedError``; meanwhile ``dispatch_model`` / ``load_checkpoint_and_dispatch`` run a model too big for
one device across several devices of one process.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Union

from .core.planned import not_yet_supported

__all__ = ["generate_device_map", "find_pippy_batch_size", "build_pipeline", "pippy_forward", "prepare_pippy"]

_MEANWHILE = "split the model over the devices of one process with dispatch_model or load_checkpoint_and_dispatch"


def generate_device_map(model, num_processes: int = 1, no_split_module_classes=None,
                        max_memory: Optional[dict] = None):
    """A device map giving each of ``num_processes`` processes (devices ``0 .. n-1``) about an equal share of
    ``model`` (10% headroom for shared weights), unless ``max_memory`` says how much each may take."""
    from .big_modeling.device_map import infer_auto_device_map

    if num_processes == 1:
        return infer_auto_device_map(model, no_split_module_classes=no_split_module_classes, clean_result=False)
    if max_memory is None:
        from .big_modeling.sizes import calculate_maximum_sizes

        model_size, (largest_layer, _) = calculate_maximum_sizes(model)
        share = math.ceil((model_size + largest_layer) / num_processes * 1.1)
        max_memory = {index: share for index in range(num_processes)}
    return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split_module_classes,
                                 clean_result=False)


def find_pippy_batch_size(args, kwargs):
    """The batch size of the first input (positional, then keyword) it can be read from; None if none."""
    from .collectives.operations import ignorant_find_batch_size

    for value in list(args or ()) + list((kwargs or {}).values()):
        found = ignorant_find_batch_size(value)
        if found is not None:
            return found
    return None


def build_pipeline(model, split_points, args, kwargs, num_chunks):
    raise not_yet_supported("Pipeline-parallel inference (build_pipeline)", _MEANWHILE)


def pippy_forward(forward, num_chunks, gather_output, *args, **kwargs):
    raise not_yet_supported("Pipeline-parallel inference (pippy_forward)", _MEANWHILE)


def prepare_pippy(
    model,
    split_points: Optional[Union[str, list[str]]] = "auto",
    no_split_module_classes: Optional[list[str]] = None,
    example_args: Optional[tuple[Any]] = (),
    example_kwargs: Optional[dict[str, Any]] = None,
    num_chunks: Optional[int] = None,
    gather_output: Optional[bool] = False,
):
    """Split ``model`` into one pipeline stage per process for inference (planned)."""
    raise not_yet_supported("Pipeline-parallel inference (prepare_pippy)", _MEANWHILE)
