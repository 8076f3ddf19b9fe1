"""``hasten launch``'s N-D parallelism flags (``--use_parallelism_config``, ``--parallelism_config_<option>``) on its
parser. The flags and a config file's ``parallelism_config`` section become variables in
``config/parallelism_launch.py``; here the sizes are checked against ``--num_processes`` before anything starts.
"""
from __future__ import annotations

import argparse
from typing import Callable, Mapping, Optional

from ..config.parallelism_launch import OPTIONS, SIZES, SWITCH
from ..config.parallelism_launch import parallelism_env as section_parallelism_env
from ..core.env_vars import env_name
from .errors import CommandError
from .launch_defaults import given_flags

__all__ = ["add_parallelism_options", "parallelism_env", "extend_env"]


def add_parallelism_options(parser: argparse._ActionsContainer, add_flag: Callable[..., argparse.Action]) -> None:
    """Add the flags to ``parser`` in their own group with ``add_flag`` (which sets the defaults the parser shows;
    see ``launch_defaults``: the launch reads a value that only repeats it as "not given")."""
    group = parser.add_argument_group("N-D parallelism (ParallelismConfig)")
    add_flag(group, SWITCH.name, action="store_true", help=SWITCH.help)
    for option in OPTIONS:
        metavar = None if option.choices else {int: "N"}.get(option.type, "VALUE")
        add_flag(group, option.name, type=option.type, choices=option.choices, metavar=metavar, help=option.help)


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
    """``(env, notes)``: the variables that carry the parallelism settings to the script
    (``config/parallelism_launch.py``), with the sizes checked against ``num_processes`` (the job's total) unless it
    is None."""
    check = None if num_processes is None else (lambda values, sources: _check_layout(values, num_processes, sources))
    return section_parallelism_env(args, config, config_path, check)


def extend_env(args: argparse.Namespace, current_env: dict) -> dict:
    """Accelerate's ``prepare_extend_env_parallelism_config``: ``current_env`` with the parallelism variables of
    ``args`` added (``--use_parallelism_config`` assumed), checked against ``args.num_processes`` when it is set."""
    env, _ = parallelism_env(given_flags(args), None, None, getattr(args, "num_processes", None))
    current_env.update(env or {env_name(SWITCH.name): "true"})
    return current_env
