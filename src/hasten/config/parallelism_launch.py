"""The N-D parallelism settings of a launch: the ``--use_parallelism_config`` / ``--parallelism_config_<option>``
flags, or a config file's ``parallelism_config`` section (Accelerate's keys), turned into
``HASTEN_USE_PARALLELISM_CONFIG=true`` and ``HASTEN_PARALLELISM_CONFIG_<OPTION>``, which ``ParallelismConfig`` and
``hasten.parallel.resolve_parallelism_config`` read. ``hasten launch`` (``commands/launch_parallelism.py``, which also
checks the sizes against the processes it starts) and a process started without it (``config/launch_file.py``) both
build them here. A flag beats the config file (with a note when they differ); only what was given is exported.
"""
from __future__ import annotations

import argparse
from typing import Callable, Mapping, Optional

from ..core.env_vars import env_name
from ..core.input_errors import CommandError
from .config_file import PARALLELISM_KEYS
from .launch_groups import Option

__all__ = ["SWITCH", "OPTIONS", "SIZES", "parallelism_env"]

SWITCH = Option("use_parallelism_config", "configure N-D parallelism (ParallelismConfig) from these flags "
                "(implied by any of them, or by a parallelism_config section in the config file)",
                type=None, action="store_true")
OPTIONS = (
    Option("parallelism_config_dp_replicate_size", "data-parallel replicas (DDP, or HSDP with dp_shard_size)", int),
    Option("parallelism_config_dp_shard_size", "data-parallel shards (FSDP)", int),
    Option("parallelism_config_tp_size", "tensor-parallel degree", int),
    Option("parallelism_config_cp_size", "context-parallel degree", int),
    Option("parallelism_config_cp_backend", "context-parallel backend", choices=("torch",)),
    Option("parallelism_config_cp_comm_strategy", "context-parallel communication: allgather or alltoall"),
    Option("parallelism_config_sp_size", "sequence-parallel degree (DeepSpeed)", int),
    Option("parallelism_config_sp_backend", "sequence-parallel backend", choices=("deepspeed",)),
    Option("parallelism_config_sp_seq_length", "sequence length when every batch has the same one"),
    Option("parallelism_config_sp_seq_length_is_variable", "sequences of variable length (true|false)"),
    Option("parallelism_config_sp_attn_implementation", "attention implementation for sequence parallelism"),
    Option("parallelism_config_pp_size", "pipeline-parallel degree (hasten's; training needs the loss function "
           "from code, TorchPipelineParallelConfig(loss_fn=...), or MegatronLMPlugin's custom_loss_function)", int),
)
SIZES = ("dp_replicate", "dp_shard", "cp", "sp", "tp", "pp")


def _from_flag(name: str, raw):
    """A flag's value, checked like the config file's (the same rules for both sources)."""
    try:
        return PARALLELISM_KEYS[name](raw)
    except ValueError as error:  # the config file's checks raise a ValueError subclass
        raise CommandError(f"--{name} {raw!r}: {str(error).rstrip('.')}.") from None


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def parallelism_env(args: argparse.Namespace, config: Optional[Mapping], config_path: Optional[str],
                    check: Optional[Callable[[dict, dict], None]] = None) -> tuple[dict[str, str], list[str]]:
    """``(env, notes)``: the variables that carry the parallelism settings to the script, and notes to print.

    Nothing when neither a flag nor the config file's ``parallelism_config`` section is given. The sizes are
    checked against ``num_processes`` (the job's total) unless it is None.
    """
    section = dict((config or {}).get("parallelism_config") or {})
    flags = {option.name: _from_flag(option.name, getattr(args, option.name))
             for option in OPTIONS if getattr(args, option.name, None) is not None}
    switch = bool(getattr(args, SWITCH.name, None))
    if not (switch or flags or section):
        return {}, []
    notes = []
    values, sources = dict(section), {key: "config file" for key in section}
    for name, value in flags.items():
        if name in section and section[name] != value:
            notes.append(f"hasten launch: --{name} {_text(value)} overrides {name}: {_text(section[name])} "
                         f"from {config_path}")
        values[name], sources[name] = value, f"--{name}"
    if not switch and flags:
        notes.append(f"hasten launch: {', '.join('--' + name for name in flags)} given without "
                     "--use_parallelism_config; using the parallelism config as if it were given.")
    if check is not None:
        check(values, sources)
    env = {env_name(SWITCH.name): "true"}
    env.update({env_name(name): _text(value) for name, value in values.items()})
    return env, notes
