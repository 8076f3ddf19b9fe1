"""Accelerate's import path ``accelerate.utils.launch``: the launch command and environment
(``hasten/commands/launch_helpers.py``). ``which`` and ``subprocess`` are here because Accelerate's module has them
(tests patch them).
"""
import subprocess  # noqa: F401
from shutil import which  # noqa: F401

from ..commands.launch_helpers import (  # noqa: F401
    PrepareForLaunch,
    _convert_nargs_to_dict,
    _filter_args,
    env_var_path_add,
    prepare_deepspeed_cmd_env,
    prepare_extend_env_parallelism_config,
    prepare_multi_gpu_env,
    prepare_sagemager_args_inputs,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
    setup_fp8_env,
)

__all__ = [
    "PrepareForLaunch", "prepare_simple_launcher_cmd_env", "prepare_multi_gpu_env", "prepare_deepspeed_cmd_env",
    "prepare_tpu", "prepare_sagemager_args_inputs", "prepare_extend_env_parallelism_config", "setup_fp8_env",
    "env_var_path_add",
]
