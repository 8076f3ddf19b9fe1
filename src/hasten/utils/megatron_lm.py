"""Accelerate's import path ``accelerate.utils.megatron_lm`` (``hasten/strategies/``)."""
from ..optimizer import AcceleratedOptimizer  # noqa: F401
from ..scheduler import AcceleratedScheduler  # noqa: F401
from ..strategies.model_parallel.megatron_engine import (  # noqa: F401
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    MegatronEngine,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    MegatronLMOptimizerWrapper,
    MegatronLMSchedulerWrapper,
    T5TrainStep,
    avg_losses_across_data_parallel_group,
    finish_mpu_init,
    gather_across_data_parallel_groups,
    initialize,
    megatron_param_groups,
    model_provider_func,
    prepare_data_loader,
    prepare_model_optimizer_scheduler,
    prepare_optimizer,
    prepare_scheduler,
)

__all__ = [
    "model_provider_func", "prepare_model_optimizer_scheduler", "MegatronLMDummyDataLoader", "prepare_data_loader",
    "MegatronLMOptimizerWrapper", "prepare_optimizer", "MegatronLMDummyScheduler", "megatron_param_groups",
    "MegatronLMSchedulerWrapper", "prepare_scheduler", "AbstractTrainStep", "BertTrainStep", "GPTTrainStep",
    "T5TrainStep", "finish_mpu_init", "initialize", "MegatronEngine", "avg_losses_across_data_parallel_group",
    "gather_across_data_parallel_groups", "AcceleratedOptimizer", "AcceleratedScheduler",
]
