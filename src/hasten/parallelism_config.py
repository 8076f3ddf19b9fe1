"""Accelerate's ``accelerate.parallelism_config`` import path; the class lives in ``hasten.parallel.config``."""
from .parallel.config import ParallelismConfig

__all__ = ["ParallelismConfig"]
