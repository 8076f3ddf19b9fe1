"""Accelerate's launch helpers: the command and environment ``hasten launch`` would use, for code that builds its own.

They take the namespace of ``hasten.commands.launch.launch_command_parser()`` and go through the same plan as
``hasten launch`` (``hasten.commands.launch_plan``): flags, config file and SLURM resolved once, checked before
anything starts. Helpers of backends hasten does not have yet (TPU, SageMaker, ...) raise
``NotYetSupportedError``.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Union

from .flags import GIVEN
from ..config.launch_groups import backend_not_yet_supported

if TYPE_CHECKING:
    from ..config.enums import DistributedType

__all__ = ["PrepareForLaunch", "prepare_simple_launcher_cmd_env", "prepare_multi_gpu_env",
           "prepare_deepspeed_cmd_env", "prepare_tpu", "prepare_sagemager_args_inputs",
           "prepare_extend_env_parallelism_config", "setup_fp8_env", "env_var_path_add"]


def _filter_args(args, parser, default_args=[]):  # noqa: B006 - Accelerate's signature
    """``parser``'s namespace (from ``default_args``) with the values ``args`` has for the same names."""
    new_args, _ = parser.parse_known_args(default_args)
    for key, value in vars(args).items():
        if key in vars(new_args):
            setattr(new_args, key, value)
    return new_args


def _completed(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with every ``hasten launch`` option it lacks set to the parser's default, in place (callers build
    Namespaces by hand with the options they care about); a missing script stays None (nothing to check)."""
    from .launch import launch_command_parser

    defaults = vars(launch_command_parser().parse_args(["placeholder.py"]))
    defaults.update(training_script=None, training_script_args=[])
    defaults.pop(GIVEN, None)  # what the placeholder command line gave is not what the caller gave
    for name, value in defaults.items():
        if not hasattr(args, name):
            setattr(args, name, value)
    return args


def _plan(args):
    """``hasten launch``'s plan for ``args`` (its config file read as ``hasten launch`` reads it)."""
    from .launch import build_plan, load_launch_config

    _completed(args)
    path, config = load_launch_config(getattr(args, "config_file", None))
    return build_plan(args, config, path)


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple:
    """``(command, environment)`` that run the job as ``hasten launch`` does: torchrun's agent in a new process, or
    ``mpirun`` for a multi-CPU job with ``mpirun_hostfile`` (launch_mpi.py)."""
    plan = _plan(args)
    if plan.mpi_runner is not None:
        return list(plan.mpi_runner.argv), {**os.environ, **plan.mpi_runner.env}
    return [sys.executable, "-m", "torch.distributed.run", *plan.torchrun_args], {**os.environ, **plan.env}


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict:
    """The workers' environment (this process's plus what ``hasten launch`` adds).

    ``args`` also receives torchrun's settings (``nproc_per_node``, ``nnodes``, ``master_port`` ...), so
    ``_filter_args(args, torch.distributed.run.get_args_parser(), ...)`` yields the same torchrun call.
    """
    from torch.distributed import run as torchrun

    plan = _plan(args)
    for name, value in vars(torchrun.parse_args(plan.torchrun_args)).items():
        if name not in ("training_script", "training_script_args", "module", "no_python"):
            setattr(args, name, value)
    args.master_port = str(args.master_port)  # a string of digits, as the reference leaves it
    return {**os.environ, **plan.env}


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple:
    """``(command, environment)`` of a DeepSpeed job as ``hasten launch --use_deepspeed`` runs it: DeepSpeed's
    multi-node runner when the job spans machines with a hostfile / DeepSpeed launcher, else torchrun's agent."""
    if not getattr(args, "use_deepspeed", False):
        args.use_deepspeed = True
    plan = _plan(args)
    if plan.deepspeed_runner is not None:
        return list(plan.deepspeed_runner.argv), {**os.environ, **plan.env, **plan.deepspeed_runner.env}
    return [sys.executable, "-m", "torch.distributed.run", *plan.torchrun_args], {**os.environ, **plan.env}


def _typed(text: str):
    """A command-line value as SageMaker hyperparameters carry it: ``True``/``False`` as bool, then int, then
    float, else the text."""
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _convert_nargs_to_dict(nargs: list) -> dict:
    """A training script's arguments as ``{name: typed value}`` (SageMaker's hyperparameters): each ``--name`` takes
    the word after it. Options that are all bare flags become True; a mix of bare flags and options with values is
    a ValueError naming the bare ones (which value belongs to which option cannot be told)."""
    if not nargs:
        return {}
    starts = [index for index, word in enumerate(nargs) if word.startswith("--")]
    if not starts or starts[0] != 0:
        raise ValueError(f"The script arguments must start with an option (--name), got {nargs[0]!r}.")
    options = [(nargs[start], nargs[start + 1:end]) for start, end in zip(starts, starts[1:] + [len(nargs)])]
    bare = [name for name, words in options if not words]
    if len(bare) == len(options):
        return {name.lstrip("-"): True for name in bare}
    if bare:
        raise ValueError(f"The script arguments mix flags without a value ({', '.join(bare)}) with options that take "
                         "one; SageMaker passes them as name/value pairs: give each flag a value (--do_train True).")
    for name, words in options:
        if len(words) != 1:
            raise ValueError(f"{name} takes one value, got {words}.")
    return {name.lstrip("-"): _typed(words[0]) for name, words in options}


def prepare_tpu(args: argparse.Namespace, current_env: dict, pod: bool = False) -> NoReturn:
    raise backend_not_yet_supported("TPU")


def prepare_sagemager_args_inputs(sagemaker_config: Any, args: argparse.Namespace) -> NoReturn:
    raise backend_not_yet_supported("Amazon SageMaker")


def prepare_extend_env_parallelism_config(args: argparse.Namespace, current_env: dict) -> dict:
    from .launch_parallelism import extend_env

    return extend_env(args, current_env)


def setup_fp8_env(args: argparse.Namespace, current_env: dict) -> dict:
    """``current_env`` with the ``HASTEN_FP8_*`` variables of the torchao fp8 options ``args`` gives
    (``config/fp8_launch.py``); the recipe options of TransformerEngine / MS-AMP raise ``NotYetSupportedError``."""
    from ..config.fp8_launch import fp8_env
    from .launch_defaults import given_flags

    current_env.update(fp8_env(given_flags(args)))
    return current_env


def env_var_path_add(env_var_name: str, path_to_add: Union[str, os.PathLike]) -> str:
    """The value of the path list ``env_var_name`` with ``path_to_add`` appended (the caller sets it)."""
    paths = [path for path in os.environ.get(env_var_name, "").split(os.pathsep) if path]
    return os.pathsep.join([*paths, str(path_to_add)])


class PrepareForLaunch:
    """Wrap ``launcher`` for spawned processes (``torch.multiprocessing.spawn`` style): process ``index`` gets its
    ranks in the environment before ``launcher(*args)`` runs.

    ``hasten launch`` and ``notebook_launcher`` do not need it (torchrun's agent sets the ranks); it is for code
    that spawns processes itself. With ``debug=True`` the processes form a gloo group through the file named by
    ``HASTEN_DEBUG_RDV_FILE`` (Accelerate's ``debug_launcher`` protocol).
    """

    def __init__(self, launcher: Callable[..., Any], distributed_type: Union[str, DistributedType] = "NO",
                 debug: bool = False):
        from ..config.enums import DistributedType

        self.launcher = launcher
        self.distributed_type = DistributedType(distributed_type)
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> None:
        from ..config.enums import DistributedType

        if self.debug:
            import torch.distributed as dist

            from ..core.env_aliases import get_setting

            world_size = int(os.environ["WORLD_SIZE"])
            store = dist.FileStore(get_setting("debug_rdv_file"), world_size)
            dist.init_process_group("gloo", rank=index, store=store, world_size=world_size)
        elif self.distributed_type not in (DistributedType.NO, DistributedType.XLA):
            os.environ["LOCAL_RANK"] = str(index)
            per_machine = int(os.environ.get("NPROC", 1))
            os.environ["RANK"] = str(per_machine * int(os.environ.get("NODE_RANK", 0)) + index)
        os.environ["FORK_LAUNCHED"] = "1"
        self.launcher(*args)
