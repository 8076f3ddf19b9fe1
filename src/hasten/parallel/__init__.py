"""N-D parallelism: the sizes (``ParallelismConfig``), the layout of the processes over them and the one DeviceMesh
(``ParallelDims``), and which config a run uses (``resolve_parallelism_config``).

``ParallelismConfig`` lives in ``hasten.config.parallelism`` with the other configuration dataclasses (and is
importable from ``hasten``, ``hasten.utils`` and ``hasten.parallelism_config``, as in Accelerate).
"""
from .config import ParallelismConfig
from .dims import ParallelDims
from .resolve import launcher_parallel_sizes, resolve_parallelism_config

__all__ = ["ParallelismConfig", "ParallelDims", "resolve_parallelism_config", "launcher_parallel_sizes"]
