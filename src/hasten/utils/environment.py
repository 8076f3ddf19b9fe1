"""Accelerate's import path ``accelerate.utils.environment``: environment variables, hardware queries and NUMA pinning
(``hasten/core/``).
"""
from ..core.env_vars import (  # noqa: F401
    clear_environment,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    str_to_bool,
)
from ..core.environment import (  # noqa: F401
    are_libraries_initialized,
    convert_dict_to_env_variables,
    is_debug_mode,
    purge_accelerate_environment,
)
from ..core.hardware import (  # noqa: F401
    CPUInformation,
    check_cuda_fp8_capability,
    check_cuda_p2p_ib_support,
    get_cpu_distributed_information,
    get_current_device_type,
    get_driver_version,
    get_gpu_info,
)
from ..core.lazy import lazy_exports

# NUMA pinning needs torch: served on first use
__getattr__, __dir__ = lazy_exports(__name__, {"set_numa_affinity": "hasten.core.numa",
                                               "override_numa_affinity": "hasten.core.numa"})

__all__ = [
    "clear_environment", "get_int_from_env", "parse_choice_from_env", "parse_flag_from_env", "patch_environment",
    "str_to_bool", "CPUInformation", "check_cuda_fp8_capability", "check_cuda_p2p_ib_support",
    "get_cpu_distributed_information", "get_current_device_type", "get_driver_version", "get_gpu_info",
    "is_debug_mode", "convert_dict_to_env_variables", "are_libraries_initialized", "set_numa_affinity",
    "override_numa_affinity", "purge_accelerate_environment",
]
