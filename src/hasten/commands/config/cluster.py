"""``hasten config``'s questions for machines you launch on yourself; the answers become a ``ClusterConfig``.

Only what hasten can run is asked: processes, machines, GPUs, mixed precision, debug checks, torch.compile.
FSDP, DeepSpeed, Megatron-LM and TPUs are not offered until their backends land.
"""
from __future__ import annotations

from ...config.enums import DistributedType
from ...utils.constants import TORCH_DYNAMO_MODES
from .config_args import ClusterConfig
from .config_utils import (DISTRIBUTED_CHOICES, DYNAMO_BACKENDS, _ask_field, _ask_options, _convert_distributed_mode,
                           _convert_dynamo_backend, _convert_mixed_precision, _convert_yes_no_to_bool)

__all__ = ["get_cluster_input"]

_YES_NO = "Please enter yes or no."


def _yes_no(question: str, default: bool = False) -> bool:
    return _ask_field(f"{question} [{'YES/no' if default else 'yes/NO'}]: ", _convert_yes_no_to_bool,
                      default=default, error_message=_YES_NO)


def _whole(question: str, default: int, minimum: int = 0) -> int:
    def convert(text):
        number = int(text)
        if number < minimum:
            raise ValueError(number)
        return number

    return _ask_field(f"{question} [{default}]: ", convert, default=default,
                      error_message=f"Please enter a whole number of at least {minimum}.")


def _machines(config: dict) -> None:
    machines = _whole("How many machines will you use (more than 1 for multi-node training)?", 1, minimum=1)
    config["num_machines"] = machines
    if machines == 1:
        return
    config["machine_rank"] = _ask_options("What is the rank of this machine?", [str(rank) for rank in range(machines)])
    config["main_process_ip"] = _ask_field("What is the IP address of the machine that will host the main process? ")
    config["main_process_port"] = _whole("What is the port you will use to communicate with the main process?",
                                         29500, minimum=1)
    config["same_network"] = _yes_no("Are all the machines on the same local network?", default=True)
    if not config["same_network"]:
        config["rdzv_backend"] = _ask_field("What rendezvous backend will you use? ('static', 'c10d', ...) [static]: ",
                                            default="static")


def _dynamo() -> dict:
    if not _yes_no("Do you wish to optimize your script with torch.compile?"):
        return {}
    dynamo = {"dynamo_backend": _ask_options("Which backend do you want to use?", [b.lower() for b in DYNAMO_BACKENDS],
                                             _convert_dynamo_backend, default=DYNAMO_BACKENDS.index("INDUCTOR"))}
    if _yes_no("Do you want to customize the defaults sent to torch.compile?"):
        dynamo["dynamo_mode"] = _ask_options("Which mode do you want to use?", TORCH_DYNAMO_MODES,
                                             lambda index: TORCH_DYNAMO_MODES[int(index)])
        dynamo["dynamo_use_fullgraph"] = _yes_no("Do you want the whole model compiled as one graph (fullgraph)?")
        dynamo["dynamo_use_dynamic"] = _yes_no("Do you want to enable dynamic shape tracing?")
        dynamo["dynamo_use_regional_compilation"] = _yes_no("Do you want to compile repeated blocks once "
                                                            "(regional compilation)?")
    return dynamo


def get_cluster_input() -> ClusterConfig:
    """Ask about this machine (and the others, for multi-node training) and return the config."""
    distributed_type = _ask_options("Which type of machine are you using?", [label for label, _ in DISTRIBUTED_CHOICES],
                                    _convert_distributed_mode)
    config = {"compute_environment": "LOCAL_MACHINE", "distributed_type": distributed_type}
    distributed = distributed_type != DistributedType.NO
    if distributed:
        _machines(config)
    config["debug"] = distributed and _yes_no(
        "Should distributed operations be checked while running for errors (slower, but a mismatch is reported "
        "instead of hanging)?")
    config["use_cpu"] = distributed_type == DistributedType.MULTI_CPU or (
        not distributed and _yes_no("Do you want to run your training on the CPU only (even if a GPU is available)?"))
    config["dynamo_config"] = _dynamo()
    if distributed:
        config["num_processes"] = _whole("How many processes in total will you use (over all machines)?", 2,
                                         minimum=1)
    else:
        config["num_processes"] = 1
    if distributed_type in (DistributedType.MULTI_GPU, DistributedType.MULTI_XPU):
        config["gpu_ids"] = _ask_field("Which GPU(s) (by id) should be used on this machine, as a comma-separated "
                                       "list? [all]: ", default="all")
        config["enable_cpu_affinity"] = _yes_no("Should each process be pinned to the CPU cores of its GPU's "
                                                "NUMA node?")
    config["mixed_precision"] = _ask_options("Do you wish to use mixed precision?", ["no", "fp16", "bf16", "fp8"],
                                             _convert_mixed_precision).value
    return ClusterConfig(**config)
