"""Accelerate's import path ``accelerate.utils.other``: compiled-model checks and regional compilation
(``hasten/compile.py``), model helpers (``hasten/core/``), safe saving (``hasten/checkpointing/serialization.py``)
and small helpers, each defined where it belongs.

Regional compilation is hasten's own: ``compile_regions`` compiles the blocks of each repeated stack in place, so
parameters keep their identity (the reference's returns a new module wrapping compiled copies).
"""
from ..big_modeling.sizes import convert_bytes  # noqa: F401
from ..checkpointing.serialization import clean_state_dict_for_safetensors, load, save  # noqa: F401
from ..compile import (  # noqa: F401
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    has_compiled_regions,
    has_repeated_blocks,
    is_compiled_module,
    is_repeated_blocks,
)
from ..core.hardware import MINIMUM_LINUX_KERNEL, check_os_kernel  # noqa: F401
from ..core.lazy import lazy_exports
from ..core.modules import (  # noqa: F401
    extract_model_from_parallel,
    get_model_tp_size,
    get_module_children_bottom_up,
    id_tensor_storage,
    model_has_dtensor,
    recursive_getattr,
)
from ..core.names import get_pretty_name  # noqa: F401
from ..core.nested import merge_dicts  # noqa: F401
from ..core.network import get_free_port, is_port_in_use  # noqa: F401
from ..state import wait_for_everyone  # noqa: F401

# What torch.load(weights_only=True) may rebuild besides tensors, built on first use as in its home
__getattr__, __dir__ = lazy_exports(__name__, {"TORCH_SAFE_GLOBALS": "hasten.checkpointing.serialization"})

__all__ = ["is_compiled_module", "has_compiled_regions", "is_repeated_blocks", "has_repeated_blocks",
           "compile_regions", "compile_regions_deepspeed", "compile_regions_fsdp2", "model_has_dtensor",
           "get_model_tp_size", "extract_model_from_parallel", "wait_for_everyone", "clean_state_dict_for_safetensors",
           "save", "load", "TORCH_SAFE_GLOBALS", "get_pretty_name", "merge_dicts", "is_port_in_use", "get_free_port",
           "convert_bytes", "check_os_kernel", "recursive_getattr", "get_module_children_bottom_up"]
