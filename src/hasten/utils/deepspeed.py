"""Accelerate's import path ``accelerate.utils.deepspeed`` (``hasten/strategies/``, ``hasten/config/deepspeed.py``)."""
from ..config.deepspeed import HfDeepSpeedConfig  # noqa: F401
from ..strategies.deepspeed.wrappers import (  # noqa: F401
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
    get_active_deepspeed_plugin,
    map_pytorch_optim_to_deepspeed,
)

__all__ = [
    "map_pytorch_optim_to_deepspeed", "get_active_deepspeed_plugin", "HfDeepSpeedConfig", "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper", "DummyOptim", "DummyScheduler",
]
