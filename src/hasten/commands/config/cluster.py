"""``hasten config``'s questions for machines you launch on yourself; the answers become a ``ClusterConfig``.

The order: the type of machine, the machines and the number of processes, how the processes share the model
(DDP, FSDP, DeepSpeed, tensor parallelism, Megatron-LM) with that backend's settings, debug checks, torch.compile,
the GPUs, mixed precision. Each section lives in its own ``questionnaire_*`` module; this one composes them. TPUs
and Amazon SageMaker are not offered (hasten cannot launch them yet).
"""
from __future__ import annotations

from ...config.enums import ComputeEnvironment, DistributedType
from .config_args import ClusterConfig
from .questionnaire_compile import ask_dynamo
from .questionnaire_deepspeed import ask_deepspeed
from .questionnaire_fsdp import ask_fsdp
from .questionnaire_fp8 import ask_fp8
from .questionnaire_machines import ask_machines, ask_num_processes
from .questionnaire_megatron import ask_megatron
from .questionnaire_parallelism import ask_fsdp_parallelism, ask_model_parallel
from .questions import ask_bool, ask_choice, ask_text

__all__ = ["get_cluster_input", "MACHINE_TYPES", "BACKENDS"]

MACHINE_TYPES = [("No distributed training (one process)", DistributedType.NO),
                 ("multi-CPU (several processes on CPUs)", DistributedType.MULTI_CPU),
                 ("multi-GPU (CUDA or ROCm)", DistributedType.MULTI_GPU),
                 ("multi-XPU (Intel GPUs)", DistributedType.MULTI_XPU)]
BACKENDS = [("DDP: each process holds the whole model", "ddp"),
            ("FSDP: parameters, gradients and optimizer states sharded over the processes", "fsdp"),
            ("DeepSpeed ZeRO", "deepspeed"),
            ("Tensor parallelism (layers split over GPUs), with FSDP or DDP over the rest", "tp"),
            ("Megatron-LM style: tensor and pipeline degrees, on hasten's torch-native engine", "megatron")]
_PRECISIONS = [("no (float32)", "no"), ("fp16", "fp16"), ("bf16", "bf16"), ("fp8", "fp8")]


def _gpu_ids(per_machine: int):
    """``all`` or a comma-separated list of device ids, at least as many as the processes of one machine."""
    def check(text: str) -> str:
        if text.strip().lower() == "all":
            return "all"
        ids = [part.strip() for part in text.split(",") if part.strip()]
        if not ids or not all(part.isdigit() for part in ids):
            raise ValueError(f"{text!r} is not a list of device ids: write e.g. 0,1 (or all).")
        if len(set(ids)) != len(ids):
            raise ValueError(f"{text!r} names a device twice.")
        if len(ids) < per_machine:
            raise ValueError(f"{len(ids)} device(s) for {per_machine} processes on this machine: name at least "
                             f"{per_machine} (one per process).")
        return ",".join(ids)

    return check


def _backend(config: dict, num_processes: int) -> None:
    """How the processes share the model, and that backend's settings."""
    backend = ask_choice("How should the processes share the model?", BACKENDS)
    if backend == "fsdp":
        config["distributed_type"] = DistributedType.FSDP
        config["fsdp_config"] = ask_fsdp()
        if config["fsdp_config"]["fsdp_version"] == 2:
            config["parallelism_config"] = ask_fsdp_parallelism(num_processes)
    elif backend == "deepspeed":
        config["distributed_type"] = DistributedType.DEEPSPEED
        config["deepspeed_config"] = ask_deepspeed(config.get("num_machines", 1))
    elif backend == "tp":
        config["parallelism_config"] = ask_model_parallel(num_processes)
    elif backend == "megatron":
        config["distributed_type"] = DistributedType.MEGATRON_LM
        config["megatron_lm_config"] = ask_megatron(num_processes)


def get_cluster_input() -> ClusterConfig:
    """Ask about this machine (and the others, for multi-node training) and return the config."""
    kind = ask_choice("Which type of machine are you using?", MACHINE_TYPES)
    config = {"compute_environment": ComputeEnvironment.LOCAL_MACHINE, "distributed_type": kind}
    distributed = kind != DistributedType.NO
    on_gpus = kind in (DistributedType.MULTI_GPU, DistributedType.MULTI_XPU)
    if distributed:
        ask_machines(config)
        what = "processes" if kind == DistributedType.MULTI_CPU else ("GPUs" if kind == DistributedType.MULTI_GPU
                                                                        else "XPUs")
        config["num_processes"] = ask_num_processes(config, what)
        config["use_cpu"] = kind == DistributedType.MULTI_CPU
    else:
        config["num_processes"] = 1
        config["use_cpu"] = ask_bool("Run on the CPU only, even where a GPU is available?", False)
    if on_gpus or kind == DistributedType.MULTI_CPU:  # every backend runs on CPUs too (gloo)
        _backend(config, config["num_processes"])
    config["debug"] = distributed and ask_bool(
        "Check distributed operations while running (slower, but a mismatch between processes is reported "
        "instead of hanging)?", False)
    config["dynamo_config"] = ask_dynamo()
    if on_gpus or not config["use_cpu"]:
        per_machine = config["num_processes"] // config.get("num_machines", 1)
        config["gpu_ids"] = ask_text("Which GPUs (by id) should this machine use, comma-separated?", default="all",
                                     check=_gpu_ids(per_machine))
        config["enable_cpu_affinity"] = ask_bool("Pin each process to the CPU cores of its GPU's NUMA node?", False)
    if "deepspeed_config_file" in (config.get("deepspeed_config") or {}):
        print("  Mixed precision is set in the DeepSpeed config file (its fp16 / bf16 sections).")
    else:
        config["mixed_precision"] = ask_choice("Do you wish to use mixed precision?", _PRECISIONS)
        if config["mixed_precision"] == "fp8":
            config["fp8_config"] = ask_fp8()
    config.setdefault("mixed_precision", None)
    return ClusterConfig(**config)
