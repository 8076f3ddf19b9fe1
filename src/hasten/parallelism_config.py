"""Accelerate's ``accelerate.parallelism_config`` import path; the class lives in ``hasten.config.parallelism``."""
from .config.parallelism import ParallelismConfig

__all__ = ["ParallelismConfig"]
