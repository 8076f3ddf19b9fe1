"""hasten: run one plain PyTorch script on one CPU, one GPU, many processes or many machines.

The public names match Hugging Face Accelerate's, so ``from accelerate import X`` becomes
``from hasten import X``. Names are imported lazily from the module that defines them.
"""
import os as _os

from .core.lazy import build_table, lazy_exports
from .core.versions import HASTEN_VERSION as __version__

if _os.environ.get("HASTEN_AS_ACCELERATE"):  # the switch set after interpreter start still counts (as_accelerate/)
    from .as_accelerate.startup import honour_on_import

    honour_on_import()

_EXPORTS = build_table({
    "hasten.accelerator": ["Accelerator"],
    "hasten.state": ["PartialState", "AcceleratorState", "GradientState"],
    "hasten.config.accumulation": ["GradientAccumulationPlugin"],
    "hasten.config.dynamo": ["TorchDynamoPlugin"],
    "hasten.config.project": ["ProjectConfiguration"],
    "hasten.local_sgd": ["LocalSGD"],
    "hasten.config.enums": ["DistributedType", "RNGType", "PrecisionType", "DynamoBackend", "LoggerType"],
    "hasten.collectives.operations": ["gather", "gather_object", "broadcast", "broadcast_object_list", "reduce",
                                "pad_across_processes", "send_to_device"],
    "hasten.collectives.random": ["set_seed", "synchronize_rng_states"],
    "hasten.core.memory": ["find_executable_batch_size"],
    "hasten.core.imports": ["is_rich_available"],
    "hasten.logging": ["get_logger"],
    "hasten.launchers": ["notebook_launcher", "debug_launcher"],
    "hasten.checkpointing": ["auto_resume"],
    "hasten.planning.planner": ["plan"],
    "hasten.inference": ["prepare_pippy"],
    "hasten.parallel.config": ["ParallelismConfig"],
    "hasten.config.deepspeed": ["DeepSpeedPlugin"],
    "hasten.config.fsdp": ["FullyShardedDataParallelPlugin"],
    "hasten.config.data": ["DataLoaderConfiguration"],
    "hasten.config.kwargs": ["DistributedDataParallelKwargs", "DDPCommunicationHookType", "GradScalerKwargs",
                             "InitProcessGroupKwargs", "AutocastKwargs", "ProfileKwargs"],
    "hasten.data.resume": ["skip_first_batches"],
    "hasten.big_modeling.init_context": ["init_empty_weights", "init_on_device"],
    "hasten.big_modeling.dispatch": ["cpu_offload", "cpu_offload_with_hook", "disk_offload", "dispatch_model",
                                     "load_checkpoint_and_dispatch"],
    "hasten.big_modeling.device_map": ["infer_auto_device_map"],
    "hasten.big_modeling.loading": ["load_checkpoint_in_model"],
    "hasten.as_accelerate.switch": ["install_as_accelerate"],
})

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS) + ["__version__"]
