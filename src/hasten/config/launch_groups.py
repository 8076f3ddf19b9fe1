"""The launch flags grouped by backend, and a config file's backend section turned into the variables the backend's
plugin reads: the one table both ``hasten launch`` (``commands/launch_options.py`` adds the flags to its parser) and a
process started without the launcher (``config/launch_file.py``) use.

DeepSpeed, FSDP, Megatron-LM, MPI and fp8 (its torchao options; ``config/fp8_launch.py`` refuses the other
libraries' recipe options) are ``ready``; TPU and SageMaker are not. ``hasten launch`` accepts every one of
Accelerate's flags, so a migrated command line parses; a flag of a group that is not ``ready`` ends the launch with
``NotYetSupportedError`` before anything starts. The flags of a ``ready`` group reach the script as the variables its
plugin reads: the switch as ``HASTEN_USE_<BACKEND>=true``, each option as ``HASTEN_<PREFIX><OPTION>``
(``--fsdp_version 2`` -> ``HASTEN_FSDP_VERSION=2``). A group whose options need more than that (DeepSpeed: checks,
settings named differently, its own multi-node runner) is ``own_env``: its module (``config/deepspeed_launch.py``)
builds its variables, and ``section_env`` leaves it alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from ..core.env_vars import env_name
from ..core.input_errors import CommandError
from ..core.planned import NotYetSupportedError, not_yet_supported

__all__ = ["BACKEND_SWITCH_OF", "Option", "BackendGroup", "BACKEND_GROUPS", "SECTION_GROUPS", "SETTING_NAMES",
           "option_dest", "section_env", "backend_section_env", "backend_not_yet_supported", "env_text"]


#: a config file's ``distributed_type`` (as the file spells it) -> the switch that selects that backend (the launcher
#: sets it for its workers; ``accelerator_settings.BACKEND_SWITCHES`` are these switches)
BACKEND_SWITCH_OF = {"FSDP": "use_fsdp", "DEEPSPEED": "use_deepspeed", "MEGATRON_LM": "use_megatron_lm"}


@dataclass(frozen=True)
class Option:
    """One flag: ``--name`` (and ``--na-me``), stored in ``dest`` (default: the name)."""

    name: str
    help: str
    type: Optional[Callable[[str], Any]] = str
    action: Optional[str] = None  # "store_true", "store_const", "append"; None: takes one value
    choices: Optional[tuple] = None
    dest: Optional[str] = None
    const: Any = None


def _switch(name: str, help: str, dest: Optional[str] = None) -> Option:
    return Option(name, help, type=None, action="store_true", dest=dest)


def _int(name: str, help: str) -> Option:
    return Option(name, help, type=int)


def _float(name: str, help: str) -> Option:
    return Option(name, help, type=float)


def _bool(name: str, help: str) -> Option:
    return Option(name, help + " (true|false)")


@dataclass(frozen=True)
class BackendGroup:
    """The flags of one backend, and how to say that it is not there yet."""

    title: str
    feature: str  # for the error: "<feature> is not yet supported by hasten"
    meanwhile: str  # what to do instead, for the error
    options: tuple = field(default_factory=tuple)
    ready: bool = False
    env_prefix: str = ""  # options travel as HASTEN_<env_prefix><OPTION>; "" for launch mechanisms (TPU, MPI ...)
    own_env: bool = False  # its variables are built by its own module, not by backend_env / section_env


_MEGATRON = "Megatron-LM's"
_USE_DDP = "train with DDP (hasten launch -n N) or on one device"
BACKEND_GROUPS = (
    BackendGroup("TPU", "Launching on TPUs (torch_xla)", "run on GPUs or the CPU", (
        _switch("tpu", "launch a TPU training"),
        _switch("tpu_cluster", "use a GCP TPU pod", dest="tpu_use_cluster"),
        Option("no_tpu_cluster", "internal to TPU pod launches", type=None, action="store_const", const=False,
               dest="tpu_use_cluster"),
        _switch("tpu_use_sudo", "run the script with sudo on each TPU pod worker"),
        Option("vm", "a Compute VM instance name of the TPU pod (repeatable)", action="append"),
        Option("env", "an environment variable NAME=VALUE for the TPU pod workers (repeatable)", action="append"),
        Option("main_training_function", "the function a TPU launch calls in the script (default: main)"),
        _switch("downcast_bf16", "on TPUs with bf16, cast float64 tensors to bf16 too"),
    )),
    BackendGroup("DeepSpeed", "DeepSpeed", _USE_DDP, env_prefix="deepspeed_", ready=True, own_env=True, options=(
        _switch("use_deepspeed", "train with DeepSpeed"),
        Option("deepspeed_config_file", "DeepSpeed config file (JSON)"),
        _int("zero_stage", "ZeRO optimization stage (0-3)"),
        Option("offload_optimizer_device", "where to offload optimizer states: none, cpu or nvme"),
        Option("offload_param_device", "where to offload parameters: none, cpu or nvme"),
        Option("offload_optimizer_nvme_path", "NVMe path for offloaded optimizer states"),
        Option("offload_param_nvme_path", "NVMe path for offloaded parameters"),
        _float("gradient_clipping", "gradient clipping value"),
        _bool("zero3_init_flag", "build huge models with deepspeed.zero.Init (ZeRO-3 only)"),
        _bool("zero3_save_16bit_model", "save 16-bit model weights with ZeRO-3"),
        Option("deepspeed_hostfile", "DeepSpeed hostfile ('HOST slots=N' lines): with --num_machines > 1, "
               "DeepSpeed's runner starts the job on those machines"),
        Option("deepspeed_exclusion_filter", "DeepSpeed exclusion filter for multi-machine runs"),
        Option("deepspeed_inclusion_filter", "DeepSpeed inclusion filter for multi-machine runs"),
        Option("deepspeed_multinode_launcher", "pdsh (default with a hostfile), openmpi, mvapich, mpich, slurm, "
               "nossh, or standard (one hasten launch per machine)"),
        Option("deepspeed_moe_layer_cls_names", "comma-separated MoE layer class names to wrap"),
    )),
    BackendGroup("FSDP", "FSDP", _USE_DDP, env_prefix="fsdp_", ready=True, options=(
        _switch("use_fsdp", "train with Fully Sharded Data Parallel"),
        Option("fsdp_version", "FSDP version, 1 or 2", choices=("1", "2")),
        _bool("fsdp_offload_params", "offload parameters and gradients to the CPU"),
        _int("fsdp_min_num_params", "minimum parameters of a module wrapped by the size-based policy"),
        Option("fsdp_sharding_strategy", "sharding strategy (FSDP1): FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, ..."),
        Option("fsdp_reshard_after_forward", "reshard after forward: true|false (FSDP2) or a strategy (FSDP1)"),
        Option("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP"),
        Option("fsdp_transformer_layer_cls_to_wrap", "comma-separated layer class names to wrap"),
        Option("fsdp_backward_prefetch", "backward prefetch policy"),
        Option("fsdp_state_dict_type", "FULL_STATE_DICT, SHARDED_STATE_DICT or LOCAL_STATE_DICT"),
        _bool("fsdp_forward_prefetch", "prefetch the next all-gather during forward"),
        _bool("fsdp_use_orig_params", "allow mixed requires_grad (frozen and trainable parameters)"),
        _bool("fsdp_cpu_ram_efficient_loading", "load the checkpoint on the first process only"),
        _bool("fsdp_sync_module_states", "broadcast module states from rank 0"),
        _bool("fsdp_activation_checkpointing", "recompute activations in backward"),
        _bool("fsdp_activation_checkpointing_offload", "offload checkpointed activations to pinned CPU memory"),
    )),
    BackendGroup("Megatron-LM", "Megatron-LM", _USE_DDP, env_prefix="megatron_lm_", ready=True, options=(
        _switch("use_megatron_lm", "train with Megatron-LM"),
        _int("megatron_lm_tp_degree", f"{_MEGATRON} tensor-parallel degree"),
        _bool("megatron_lm_use_custom_fsdp", f"{_MEGATRON} custom FSDP"),
        _bool("megatron_lm_no_load_optim", "do not load the optimizer state"),
        _bool("megatron_lm_eod_mask_loss", "mask the loss at end-of-document tokens"),
        _bool("megatron_lm_overlap_cpu_optimizer_d2h_h2d", "overlap the CPU optimizer step with transfers"),
        _bool("megatron_lm_no_save_optim", "do not save the optimizer state"),
        _bool("megatron_lm_optimizer_cpu_offload", "offload the optimizer to the CPU"),
        _bool("megatron_lm_use_precision_aware_optimizer", "use the precision-aware optimizer"),
        _int("megatron_lm_decoder_last_pipeline_num_layers", "decoder layers of the last pipeline stage"),
        _int("megatron_lm_pp_degree", f"{_MEGATRON} pipeline-parallel degree"),
        _int("megatron_lm_num_micro_batches", "micro-batches per pipeline step"),
        _bool("megatron_lm_sequence_parallelism", "sequence parallelism"),
        _bool("megatron_lm_recompute_activations", "recompute the transformer blocks' activations in backward"),
        _bool("megatron_lm_use_distributed_optimizer", "the distributed optimizer"),
        _float("megatron_lm_gradient_clipping", "global gradient-norm clipping"),
        Option("megatron_lm_recompute_granularity", "recomputation granularity: full or selective"),
        Option("megatron_lm_recompute_method", "recomputation method: uniform or block"),
        _int("megatron_lm_recompute_num_layers", "layers recomputed per stage"),
        Option("megatron_lm_attention_backend", "attention backend"),
        _int("megatron_lm_expert_model_parallel_size", "expert-parallel degree"),
        _int("megatron_lm_context_parallel_size", "context-parallel degree"),
        _float("megatron_lm_attention_dropout", "attention dropout"),
        _float("megatron_lm_hidden_dropout", "hidden dropout"),
        _bool("megatron_lm_attention_softmax_in_fp32", "attention softmax in fp32"),
        _int("megatron_lm_expert_tensor_parallel_size", "expert tensor-parallel degree"),
        _bool("megatron_lm_calculate_per_token_loss", "per-token loss"),
        _bool("megatron_lm_use_rotary_position_embeddings", "rotary position embeddings"),
    )),
    # ready: fp8_launch passes the torchao options on and refuses the other libraries' recipe options itself
    BackendGroup("FP8", "The TransformerEngine / MS-AMP fp8 recipe options",
                 "use --mixed_precision fp8 through torchao (--fp8_backend ao, --fp8_pad_inner_dim, "
                 "--fp8_enable_fsdp_float8_all_gather)", env_prefix="fp8_", ready=True, own_env=True, options=(
        Option("fp8_backend", "FP8 engine", choices=("ao", "te", "msamp")),
        _switch("fp8_use_autocast_during_eval", "keep FP8 autocast during evaluation"),
        _int("fp8_margin", "scaling-factor margin"),
        _int("fp8_interval", "scaling-factor update interval"),
        Option("fp8_format", "FP8 format", choices=("HYBRID", "E4M3", "E5M2")),
        _int("fp8_amax_history_len", "amax history length"),
        Option("fp8_amax_compute_algo", "amax algorithm", choices=("max", "most_recent")),
        Option("fp8_override_linear_precision", "higher precision for fprop, dgrad, wgrad, e.g. (false,false,true)"),
        Option("fp8_opt_level", "MS-AMP optimization level", choices=("O1", "O2")),
        _bool("fp8_enable_fsdp_float8_all_gather", "FP8 all-gather under FSDP2"),
        _bool("fp8_pad_inner_dim", "pad the inner dimension for FP8 matmuls"),
    )),
    BackendGroup("Amazon SageMaker", "Launching on Amazon SageMaker", "launch on the machines with hasten launch", (
        Option("aws_access_key_id", "AWS access key id for SageMaker"),
        Option("aws_secret_access_key", "AWS secret access key for SageMaker"),
    )),
    BackendGroup("MPI", "Launching with mpirun", "start one `hasten launch` per machine (see docs/launching.md)", (
        Option("mpirun_hostfile", "hostfile for mpirun: one mpirun starts a multi-CPU job on its machines"),
    ), ready=True, own_env=True),  # commands/launch_mpi.py builds its command and variables
)



def option_dest(option: Option) -> str:
    """Where argparse stores the flag, and the config-file key of the same option."""
    return option.dest or option.name


def backend_not_yet_supported(title: str, flags: Sequence[str] = ()) -> NotYetSupportedError:
    """The error for the backend group ``title`` (naming ``flags`` when given), with what to do meanwhile."""
    group = next(group for group in BACKEND_GROUPS if group.title == title)
    if not flags:
        return not_yet_supported(group.feature, group.meanwhile)
    return not_yet_supported(f"{group.feature} ({', '.join(flags)})",
                             f"{group.meanwhile}; drop {'this flag' if len(flags) == 1 else 'these flags'}")


def env_text(value: Any) -> str:
    """A flag or config value as an environment variable holds it (``true`` / ``false``, lists comma-separated)."""
    if isinstance(value, bool):
        return str(value).lower()
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


# Flag / config-file names whose plugin setting is spelled differently (Accelerate's launcher maps them the same way).
SETTING_NAMES = {"fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_cls_to_wrap"}


def section_env(group_title: str, section: Optional[Mapping]) -> dict:
    """The ``HASTEN_*`` variables for a config file's backend section (``fsdp_config``: Accelerate's keys, e.g.
    ``fsdp_version: 2`` -> ``HASTEN_FSDP_VERSION=2``); keys that are not options of the group are refused."""
    group = next(group for group in BACKEND_GROUPS if group.title == group_title)
    if group.own_env:
        raise ValueError(f"the {group.title} group builds its variables itself (config/deepspeed_launch.py)")
    known = {option_dest(option) for option in group.options}
    env = {}
    for key, value in (section or {}).items():
        if value is None:
            continue
        if key not in known:
            raise CommandError(f"The config file's {group.env_prefix}config has an unknown key {key!r}; the known "
                               f"keys are {', '.join(sorted(known))}.")
        env[env_name(SETTING_NAMES.get(key, key))] = env_text(value)
    return env


# a config file's distributed_type -> (its flag group, the section holding that group's keys)
SECTION_GROUPS = {"FSDP": ("FSDP", "fsdp_config"), "MEGATRON_LM": ("Megatron-LM", "megatron_lm_config")}


def backend_section_env(kind: str, config: Optional[Mapping]) -> dict:
    """The variables a config file of ``distributed_type: kind`` gives its backend (FSDP, Megatron-LM): the switch
    (``HASTEN_USE_FSDP=true``) and the section's options; nothing for other kinds (DeepSpeed's are
    ``config/deepspeed_launch.py``'s)."""
    if kind not in SECTION_GROUPS:
        return {}
    group, section = SECTION_GROUPS[kind]
    env = {env_name(BACKEND_SWITCH_OF[kind]): "true"}
    env.update(section_env(group, (config or {}).get(section)))
    return env
