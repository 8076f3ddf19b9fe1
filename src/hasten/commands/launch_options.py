"""``hasten launch``'s backend flags on its parser: the table of groups and options is
``config/launch_groups.py`` (a process started without the launcher reads a config file's sections through it too).

A flag of a group that is not ``ready`` (TPU, SageMaker) ends the launch with ``NotYetSupportedError`` before anything
starts; the flags of a ``ready`` group reach the script as the variables its plugin reads (``backend_env``).
"""
from __future__ import annotations

import argparse
from typing import Callable

from ..config.launch_groups import BACKEND_GROUPS, SETTING_NAMES, env_text, option_dest
from ..core.env_vars import env_name

__all__ = ["add_backend_options", "given_backend_options", "backend_env"]


def add_backend_options(parser: argparse._ActionsContainer, add_flag: Callable[..., argparse.Action]) -> None:
    """Add every group's flags to ``parser`` with ``add_flag`` (which sets the defaults the parser shows; see
    ``launch_defaults``: the launch reads a value that only repeats it as "not given")."""
    for group in BACKEND_GROUPS:
        state = "" if group.ready else " (not yet supported by hasten)"
        container = parser.add_argument_group(f"{group.title}{state}")
        for option in group.options:
            kwargs = {"help": option.help, "dest": option_dest(option)}
            if option.action:
                kwargs["action"] = option.action
            if option.action == "store_const":
                kwargs["const"] = option.const
            if option.action in (None, "append"):
                kwargs["type"] = option.type
                kwargs["metavar"] = None if option.choices else {int: "N", float: "X"}.get(option.type, "VALUE")
                if option.choices:
                    kwargs["choices"] = option.choices
            add_flag(container, option.name, **kwargs)


def given_backend_options(args: argparse.Namespace) -> list:
    """``[(group, ["--flag", ...]), ...]`` for the groups that are not ready and whose flags ``args`` holds."""
    found = []
    for group in BACKEND_GROUPS:
        if group.ready:
            continue
        given = {}  # dest -> its flags (--tpu_cluster and --no_tpu_cluster share one)
        for option in group.options:
            if getattr(args, option_dest(option), None) is not None:
                given.setdefault(option_dest(option), []).append(f"--{option.name}")
        if given:
            found.append((group, ["/".join(flags) for flags in given.values()]))
    return found


def backend_env(args: argparse.Namespace) -> dict:
    """The ``HASTEN_*`` variables that carry the flags of ready groups given in ``args`` to their plugins."""
    env = {}
    for group in BACKEND_GROUPS:
        if not (group.ready and group.env_prefix) or group.own_env:
            continue
        for index, option in enumerate(group.options):
            value = getattr(args, option_dest(option), None)
            if value is None:
                continue
            dest = option_dest(option)
            switch = index == 0 and dest.startswith("use_")  # --use_fsdp -> HASTEN_USE_FSDP
            setting = dest if switch or dest.startswith(group.env_prefix) else group.env_prefix + dest
            env[env_name(SETTING_NAMES.get(setting, setting))] = env_text(value)
    return env
