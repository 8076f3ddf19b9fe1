"""Accelerate's ``accelerate.utils.dataclasses`` import path: every name, re-exported from where it lives.

The enums and dataclasses live in ``hasten.config`` (one module per family) and ``hasten.parallel.config`` (the
N-D parallelism sizes and handlers); this module only gathers them. What is still planned (TransformerEngine and
MS-AMP fp8 recipes) raises ``NotYetSupportedError`` when trained with (see
docs/planned-features.md).
"""
from ..collectives.operations import TensorInformation
from ..config.accumulation import GradientAccumulationPlugin
from ..config.data import DataLoaderConfiguration
from ..config.deepspeed import DeepSpeedPlugin
from ..config.dynamo import TorchDynamoPlugin
from ..config.enum_compat import BaseEnum, EnumWithContains, SageMakerDistributedType
from ..config.enums import ComputeEnvironment, DistributedType, DynamoBackend, LoggerType, PrecisionType, RNGType
from ..config.fp8 import (
    AmaxComputeAlgorithm,
    AORecipeKwargs,
    Backend,
    FP8BackendType,
    FP8Format,
    FP8RecipeKwargs,
    MSAMPRecipeKwargs,
    OptLevel,
    TERecipeKwargs,
)
from ..config.fsdp import FullyShardedDataParallelPlugin, get_module_class_from_name
from ..config.kwargs import (
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
    ProfilerActivity,
)
from ..config.megatron import (
    MODEL_CONFIGS_TO_MEGATRON_PARSERS,
    MegatronLMPlugin,
    add_model_config_to_megatron_parser,
    parse_bert_config,
    parse_glm4_moe_config,
    parse_gpt2_config,
    parse_llama_config,
    parse_t5_config,
)
from ..config.project import ProjectConfiguration
from ..config.quantization import BnbQuantizationConfig, CustomDtype
from ..parallel.config import (
    DeepSpeedSequenceParallelConfig,
    TorchContextParallelConfig,
    TorchPipelineParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
)

__all__ = [
    "KwargsHandler", "EnumWithContains", "BaseEnum", "AutocastKwargs", "DDPCommunicationHookType",
    "DistributedDataParallelKwargs", "GradScalerKwargs", "InitProcessGroupKwargs", "Backend", "OptLevel",
    "FP8Format", "AmaxComputeAlgorithm", "AORecipeKwargs", "TERecipeKwargs", "MSAMPRecipeKwargs", "FP8RecipeKwargs",
    "ProfilerActivity", "ProfileKwargs", "DistributedType", "SageMakerDistributedType", "FP8BackendType",
    "ComputeEnvironment", "DynamoBackend", "LoggerType", "PrecisionType", "RNGType", "CustomDtype",
    "TensorInformation", "DataLoaderConfiguration", "ProjectConfiguration", "GradientAccumulationPlugin",
    "TorchDynamoPlugin", "DeepSpeedPlugin", "FullyShardedDataParallelPlugin", "TorchTensorParallelPlugin",
    "TorchContextParallelConfig", "DeepSpeedSequenceParallelConfig", "TorchTensorParallelConfig", "TorchPipelineParallelConfig",
    "MegatronLMPlugin", "MODEL_CONFIGS_TO_MEGATRON_PARSERS", "add_model_config_to_megatron_parser",
    "parse_bert_config", "parse_gpt2_config", "parse_t5_config", "parse_llama_config", "parse_glm4_moe_config",
    "BnbQuantizationConfig", "get_module_class_from_name",
]
