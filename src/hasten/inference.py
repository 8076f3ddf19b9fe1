"""Accelerate's ``accelerate.inference``: pipeline-parallel inference, one stage of the model per process.

``prepare_pippy`` traces a model on an example micro-batch with ``torch.distributed.pipelining``, cuts it into one
stage per process and makes its ``forward`` run a ``ScheduleGPipe``; ``build_pipeline`` and ``pippy_forward`` are
its two steps, ``generate_device_map`` the balanced split behind ``split_points="auto"`` and
``find_pippy_batch_size`` the batch-size finder. They live in ``strategies/model_parallel/pipeline_inference.py``.
"""
from .strategies.model_parallel.pipeline_inference import (
    build_pipeline,
    find_pippy_batch_size,
    generate_device_map,
    pippy_forward,
    prepare_pippy,
)

__all__ = ["generate_device_map", "find_pippy_batch_size", "build_pipeline", "pippy_forward", "prepare_pippy"]
