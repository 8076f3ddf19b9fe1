"""Accelerate's import path ``accelerate.utils.imports``: whether optional libraries are installed (``hasten/core/imports.py``)."""
from ..core.lazy import lazy_exports
from ..core.env_vars import parse_flag_from_env, patch_environment  # noqa: F401
from ..core.imports import (  # noqa: F401
    EXTRAS, is_4bit_bnb_available, is_8bit_bnb_available, is_aim_available, is_amdsmi_available,
    is_bf16_available, is_bitsandbytes_multi_backend_available, is_bnb_available, is_boto3_available,
    is_clearml_available, is_comet_ml_available, is_cuda_available, is_datasets_available, is_deepspeed_available,
    is_dvclive_available, is_fp16_available, is_fp8_available, is_habana_gaudi1, is_hpu_available,
    is_import_timer_available, is_lomo_available, is_matplotlib_available, is_megatron_lm_available,
    is_mlflow_available, is_mlu_available, is_mps_available, is_msamp_available, is_musa_available,
    is_neuron_available, is_npu_available, is_numpy_available, is_pandas_available, is_peft_available,
    is_pippy_available, is_pynvml_available, is_pytest_available, is_rich_available, is_rocm_available,
    is_sagemaker_available, is_schedulefree_available, is_sdaa_available, is_swanlab_available,
    is_tensorboard_available, is_timm_available, is_torch_distributed_available, is_torch_xla_available,
    is_torchao_available, is_torchdata_available, is_torchdata_stateful_dataloader_available,
    is_torchvision_available, is_tqdm_available, is_trackio_available, is_transformer_engine_available,
    is_transformer_engine_mxfp8_available, is_transformers_available, is_triton_available, is_wandb_available,
    is_weights_only_available, is_xccl_available, is_xpu_available, require_extra, torchao_required, USE_TORCH_XLA,
)
from ..core.versions import compare_versions, is_torch_version  # noqa: F401

# DeepSpeed's guard asks the run's state: served from the DeepSpeed strategy on first use
__getattr__, __dir__ = lazy_exports(__name__, {"deepspeed_required": "hasten.strategies.deepspeed.strategy"})

__all__ = [
    "parse_flag_from_env", "patch_environment", "compare_versions", "is_torch_version", "EXTRAS", "USE_TORCH_XLA",
    "is_torch_distributed_available", "is_xccl_available", "is_cuda_available", "is_rocm_available",
    "is_torch_xla_available", "is_mps_available", "is_mlu_available", "is_musa_available", "is_npu_available",
    "is_sdaa_available", "is_neuron_available", "is_hpu_available", "is_habana_gaudi1", "is_xpu_available",
    "is_pippy_available", "is_weights_only_available", "is_bf16_available", "is_fp16_available", "is_fp8_available",
    "is_numpy_available", "is_deepspeed_available", "is_bnb_available", "is_4bit_bnb_available",
    "is_8bit_bnb_available", "is_bitsandbytes_multi_backend_available", "is_torchdata_available",
    "is_torchdata_stateful_dataloader_available", "is_megatron_lm_available", "is_torchao_available",
    "is_msamp_available", "is_transformer_engine_available", "is_transformer_engine_mxfp8_available",
    "is_schedulefree_available", "is_lomo_available", "is_import_timer_available", "is_pynvml_available",
    "is_amdsmi_available", "is_pytest_available", "is_torchvision_available", "is_transformers_available",
    "is_datasets_available", "is_peft_available", "is_timm_available", "is_triton_available", "is_tqdm_available",
    "is_pandas_available", "is_matplotlib_available", "is_boto3_available", "is_sagemaker_available",
    "is_rich_available", "is_tensorboard_available", "is_wandb_available", "is_mlflow_available",
    "is_comet_ml_available", "is_aim_available", "is_clearml_available", "is_dvclive_available",
    "is_swanlab_available", "is_trackio_available", "torchao_required", "deepspeed_required", "require_extra",
]
