"""``hasten launch``'s N-D parallelism flags (``--use_parallelism_config``, ``--parallelism_config_<option>``).

The flags, or the config file's ``parallelism_config`` section (Accelerate's keys), reach the script as
``HASTEN_USE_PARALLELISM_CONFIG=true`` and ``HASTEN_PARALLELISM_CONFIG_<OPTION>``, which ``ParallelismConfig`` and
``hasten.parallel.resolve_parallelism_config`` read. A flag beats the config file (with a note when they differ);
only what was given is exported. The sizes are checked against ``--num_processes`` before anything starts.
"""
from __future__ import annotations

import argparse
from typing import Callable, Mapping, Optional

from ..config.config_file import PARALLELISM_KEYS
from ..core.env_vars import env_name
from .errors import CommandError
from .launch_defaults import given_flags
from .launch_options import Option

__all__ = ["SWITCH", "OPTIONS", "add_parallelism_options", "parallelism_env", "extend_env"]

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


def add_parallelism_options(parser: argparse._ActionsContainer, add_flag: Callable[..., argparse.Action]) -> None:
    """Add the flags to ``parser`` in their own group with ``add_flag`` (which sets the defaults the parser shows;
    see ``launch_defaults``: the launch reads a value that only repeats it as "not given")."""
    group = parser.add_argument_group("N-D parallelism (ParallelismConfig)")
    add_flag(group, SWITCH.name, action="store_true", help=SWITCH.help)
    for option in OPTIONS:
        metavar = None if option.choices else {int: "N"}.get(option.type, "VALUE")
        add_flag(group, option.name, type=option.type, choices=option.choices, metavar=metavar, help=option.help)


def _from_flag(name: str, raw):
    """A flag's value, checked like the config file's (the same rules for both sources)."""
    try:
        return PARALLELISM_KEYS[name](raw)
    except ValueError as error:  # the config file's checks raise a ValueError subclass
        raise CommandError(f"--{name} {raw!r}: {str(error).rstrip('.')}.") from None


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _check_layout(values: dict, num_processes: int, sources: dict) -> None:
    from ..parallel.config import check_size_combination
    from ..parallel.dims import ParallelDims

    sizes = {name: values.get(f"parallelism_config_{name}_size", 1) for name in SIZES}
    try:
        check_size_combination(**{f"{name}_size": size for name, size in sizes.items() if name != "pp"})
        ParallelDims(**sizes, world_size=num_processes)
    except ValueError as error:
        given = ", ".join(f"{name}_size={size} ({sources[f'parallelism_config_{name}_size']})"
                          for name, size in sizes.items() if f"parallelism_config_{name}_size" in sources)
        raise CommandError(f"the parallel sizes do not fit --num_processes {num_processes}"
                           f"{' (' + given + ')' if given else ''}: {error}") from None


def parallelism_env(args: argparse.Namespace, config: Optional[Mapping], config_path: Optional[str],
                    num_processes: Optional[int]) -> tuple[dict[str, str], list[str]]:
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
    if num_processes is not None:
        _check_layout(values, num_processes, sources)
    env = {env_name(SWITCH.name): "true"}
    env.update({env_name(name): _text(value) for name, value in values.items()})
    return env, notes


def extend_env(args: argparse.Namespace, current_env: dict) -> dict:
    """Accelerate's ``prepare_extend_env_parallelism_config``: ``current_env`` with the parallelism variables of
    ``args`` added (``--use_parallelism_config`` assumed), checked against ``args.num_processes`` when it is set."""
    env, _ = parallelism_env(given_flags(args), None, None, getattr(args, "num_processes", None))
    current_env.update(env or {env_name(SWITCH.name): "true"})
    return current_env
