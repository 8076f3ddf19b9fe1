"""``accelerate.hooks`` compatibility path: the hooks live in ``hasten.big_modeling.hooks``."""
from .big_modeling.hooks import (  # noqa: F401
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from .big_modeling.layerwise_casting import LayerwiseCastingHook, attach_layerwise_casting_hooks  # noqa: F401

__all__ = ["AlignDevicesHook", "CpuOffload", "ModelHook", "SequentialHook", "UserCpuOffloadHook", "add_hook_to_module",
           "attach_align_device_hook", "attach_align_device_hook_on_blocks", "attach_execution_device_hook",
           "remove_hook_from_module", "remove_hook_from_submodules", "LayerwiseCastingHook",
           "attach_layerwise_casting_hooks"]
