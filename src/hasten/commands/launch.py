"""``hasten launch``: run a script on N processes of this machine, or across machines.

The processes are started and watched by torchrun's elastic agent (``torch.distributed.run``), called in
this process: hasten only turns its flags and the config file into torchrun's arguments and ``HASTEN_*``
environment variables (see ``launch_plan``). When one rank fails, the agent stops the others and the
job ends with a non-zero status and the failing rank's traceback. A DeepSpeed job across machines with a
DeepSpeed hostfile or launcher is started by DeepSpeed's own runner instead (see ``launch_deepspeed``).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any, NoReturn, Optional, Union

from .errors import CommandError
from .failure_summary import root_cause, signal_hint
from .flags import OneSpellingHelpFormatter, add_flag, recording
from .launch_defaults import SHOWN_DEFAULTS, given_flags
from .launch_deepspeed import DeepSpeedRunner, env_file_text
from ..config.launch_groups import BACKEND_GROUPS, backend_not_yet_supported
from .launch_options import add_backend_options
from .launch_parallelism import add_parallelism_options
from .launch_plan import LaunchPlan, build_plan
from .loopback_store import launch_with_loopback_store
from .parent_watch import LAUNCHER_PID_ENV

if TYPE_CHECKING:
    from .launch_mpi import MpiRunner

__all__ = ["add_parser", "run", "launch_command_parser", "launch_command", "main", "load_launch_config", "execute",
           "CustomHelpFormatter", "clean_option", "options_to_group", "simple_launcher", "multi_gpu_launcher",
           "deepspeed_launcher", "execute_deepspeed_runner", "tpu_launcher", "tpu_pod_launcher", "sagemaker_launcher"]

_DESCRIPTION = (
    "Run SCRIPT on --num_processes processes (the total over all machines) with torchrun's elastic agent. "
    "Settings reach the script as HASTEN_* environment variables; flags override the config file. Every flag "
    "also answers to its dashed spelling (--num-processes)."
)

_USAGE = "%(prog)s [options] SCRIPT [script arguments ...]"


class CustomHelpFormatter(OneSpellingHelpFormatter):
    """Accelerate's name for ``launch``'s help formatter: each flag shown once, under its underscore spelling."""

    def __init__(self, *args: Any, **kwargs: Any):  # Accelerate's signature
        super().__init__(*args, **kwargs)


# a backend's switch -> its group in --help
options_to_group = {"multi_gpu": "processes and machines",
                    **{option.dest or option.name: f"{group.title}" for group in BACKEND_GROUPS
                       for option in group.options[:1]}}


def clean_option(option: str) -> Optional[str]:
    """``"--num-processes"`` -> ``"num_processes"`` (the flag's name); None for a value that is not a long option."""
    if option.startswith("--"):
        return option[2:].split("=", 1)[0].replace("-", "_")
    return None


def _flag(parser, name: str, *short: str, **kwargs) -> argparse.Action:
    """``add_flag`` with Accelerate's parser default for the flag, where it has one (see ``launch_defaults``)."""
    dest = kwargs.get("dest") or name
    if dest in SHOWN_DEFAULTS:
        kwargs["default"] = SHOWN_DEFAULTS[dest]
    return add_flag(parser, name, *short, **kwargs)


def _define(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _flag(parser, "config_file", default=None, metavar="PATH",
          help="config file to read (default: the one written by `hasten config default`, if it exists)")
    _flag(parser, "quiet", "-q", action="store_true", default=None,
          help="accepted for Accelerate compatibility: a failed job always shows only the failing rank's traceback")
    procs = parser.add_argument_group("processes and machines")
    _flag(procs, "num_processes", "-n", type=int, default=None, metavar="N",
          help="total number of processes over all machines (default: one per GPU on each machine, else 1)")
    _flag(procs, "num_machines", aliases=("nnodes",), default=None, metavar="N|MIN:MAX",
          help="number of machines (default 1, or the SLURM allocation's); MIN:MAX for an elastic job (c10d)")
    _flag(procs, "machine_rank", type=int, default=None, metavar="RANK",
          help="this machine's index, from 0 (inside SLURM: SLURM_NODEID)")
    _flag(procs, "main_process_ip", default=None, metavar="ADDRESS",
          help="address of machine 0 (inside SLURM: the first host of the allocation)")
    _flag(procs, "main_process_port", type=int, default=None, metavar="PORT",
          help="port on machine 0 (0 or absent on one machine: a free port; 29500 across machines)")
    _flag(procs, "same_network", action="store_true",
          help="accepted for Accelerate compatibility: machines always meet at --main_process_ip")
    _flag(procs, "rdzv_backend", metavar="NAME",
          help="torchrun rendezvous backend: static (default), c10d (elastic), etcd")
    _flag(procs, "rdzv_conf", metavar="K=V,...", help="extra rendezvous settings")
    _flag(procs, "max_restarts", type=int, metavar="N",
          help="restart the whole worker group up to N times after a failure (default 0)")
    _flag(procs, "monitor_interval", type=float, metavar="SECONDS",
          help="how often the agent checks its workers (default 0.1)")
    _flag(procs, "role", metavar="NAME", help="torchrun's role name of the workers")
    _flag(procs, "cpu", action="store_true", help="run on CPU even when GPUs are present")
    _flag(procs, "gpu_ids", default=None, metavar="IDS", help="GPUs to use, e.g. 0,1 (default all)")
    _flag(procs, "enable_cpu_affinity", action="store_true",
          help="pin each GPU process to the CPU cores of its GPU's NUMA node")
    _flag(procs, "as_accelerate", action="store_true", default=False,
          help="set HASTEN_AS_ACCELERATE=1 for the workers: `import accelerate` in them (transformers' Trainer, "
               "TRL, PEFT, diffusers ...) is hasten")
    _flag(procs, "num_cpu_threads_per_process", type=int, default=None, metavar="N",
          help="OMP_NUM_THREADS of each process (default: cores // processes on this machine)")
    _flag(procs, "multi_gpu", action="store_true",
          help="accepted for Accelerate compatibility; hasten always starts --num_processes processes")
    training = parser.add_argument_group("training settings (passed to the script)")
    _flag(training, "mixed_precision", default=None, metavar="MODE", help="no, fp16, bf16 or fp8")
    _flag(training, "gradient_accumulation_steps", type=int, default=None, metavar="N")
    _flag(training, "dynamo_backend", default=None, metavar="BACKEND", help="torch.compile backend, e.g. inductor")
    _flag(training, "dynamo_mode", metavar="MODE")
    _flag(training, "dynamo_use_fullgraph", action="store_true")
    _flag(training, "dynamo_use_dynamic", action="store_true")
    _flag(training, "dynamo_use_regional_compilation", action="store_true")
    _flag(training, "debug", action="store_true", default=None,
          help="HASTEN_DEBUG_MODE=1: extra consistency checks in collectives")
    program = parser.add_argument_group("the program")
    _flag(program, "module", "-m", action="store_true", default=None,
          help="SCRIPT is a module name, run as `python -m SCRIPT`")
    _flag(program, "no_python", action="store_true", default=None,
          help="SCRIPT is an executable, run without python")
    _flag(program, "tee", "-t", metavar="STREAMS",
          help="also write stdout/stderr to files in --log_dir: 1 stdout, 2 stderr, 3 both")
    _flag(program, "log_dir", default=None, metavar="DIR", help="where torchrun writes the workers' logs")
    add_parallelism_options(parser, _flag)
    add_backend_options(parser, _flag)
    parser.add_argument("training_script", metavar="SCRIPT", action=recording("store", parser),
                        help="the Python script (or module, or executable)")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, metavar="...",
                        action=recording("store", parser), help="arguments for the script")
    return parser


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``hasten launch`` on the ``hasten`` parser."""
    parser = subparsers.add_parser("launch", help="run a script on N processes and/or machines",
                                   description=_DESCRIPTION, formatter_class=CustomHelpFormatter,
                                   allow_abbrev=False, usage=_USAGE)
    return _define(parser)


def launch_command_parser(subparsers: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """``hasten launch``'s parser: registered on ``subparsers`` when given (Accelerate's form), else stand-alone."""
    if subparsers is not None:
        parser = add_parser(subparsers)
        parser.set_defaults(func=launch_command)
        return parser
    return _define(argparse.ArgumentParser(prog="hasten launch", description=_DESCRIPTION, allow_abbrev=False,
                                           formatter_class=CustomHelpFormatter, usage=_USAGE))


def load_launch_config(config_file: Optional[Union[str, os.PathLike]]) -> tuple[Optional[str], Optional[dict]]:
    """``(path, settings)`` of the config file to use: the one given, else the default one if it exists."""
    try:
        from ..config import config_file as config_io
    except ImportError as error:
        if config_file:
            raise CommandError(f"--config_file {config_file}: config files cannot be read here ({error}).") from None
        return None, None
    if config_file:
        if not os.path.isfile(config_file):
            raise CommandError(f"--config_file {config_file}: no such file. Write one with "
                               "`hasten config default --config_file PATH`, or drop the flag.")
        path = config_file
    else:
        path = str(config_io.default_config_path())
        if not os.path.isfile(path):
            return None, None
    try:
        return path, config_io.load_config_file(path)
    except (ValueError, OSError) as error:
        raise CommandError(f"cannot use the config file {path}: {error}") from None


def execute(plan: LaunchPlan) -> int:
    """Start the workers with torchrun's agent and wait; the job's exit status."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from ..core.env_vars import patch_environment

    class JobFailed(ChildFailedError):
        """torch's failure summary, naming the user's program and the real root cause."""

        def get_first_failure(self):
            return root_cause(self.failures)

    parsed = torchrun.parse_args(plan.torchrun_args)
    with patch_environment(**plan.env, **{LAUNCHER_PID_ENV: str(os.getpid())}):
        try:
            if plan.loopback_store:
                launch_with_loopback_store(parsed)
            else:
                torchrun.run(parsed)
        except ChildFailedError as failure:
            summary = JobFailed(plan.program, failure.failures)
            print(str(summary), file=sys.stderr)
            rank, first = summary.get_first_failure()
            hint = signal_hint(rank, first)
            if hint:
                print(hint, file=sys.stderr)
            code = first.exitcode
            return code if 0 < code < 256 else 1
        except SignalException as stop:
            print(f"hasten launch: stopped by signal {stop.sigval.name}; the workers were ended.", file=sys.stderr)
            return 128 + int(stop.sigval)
    return 0


_DS_ENV_FILE = "DS_ENV_FILE"  # the variable DeepSpeed's runner reads its environment file's name from
_DS_ENV_NAME = ".deepspeed_env"


def _users_deepspeed_env(environ) -> str:
    """The user's own DeepSpeed environment files (home folder, then this folder), which the runner would read."""
    name = environ.get(_DS_ENV_FILE, _DS_ENV_NAME)
    texts = []
    for folder in (os.path.expanduser("~"), "."):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                texts.append(handle.read())
    return "\n".join(texts)


def execute_deepspeed_runner(runner: DeepSpeedRunner) -> int:
    """Run DeepSpeed's multi-node runner and wait; its exit status.

    The runner exports only some variables to the other machines, plus those of its environment file: the
    ``HASTEN_*`` settings are written to a temporary one (after the user's own ``.deepspeed_env`` lines), which
    ``DS_ENV_FILE`` points it to; the user's files are left untouched.
    """
    with tempfile.TemporaryDirectory(prefix="hasten-deepspeed-") as folder:
        env_file = os.path.join(folder, _DS_ENV_NAME)
        with open(env_file, "w", encoding="utf-8") as handle:
            handle.write(env_file_text(runner.env, _users_deepspeed_env(os.environ)))
        return _run_and_wait(runner.argv, {**os.environ, **runner.env, _DS_ENV_FILE: env_file})


def _run_and_wait(argv: list, environ: dict) -> int:
    """Run a launcher program (DeepSpeed's runner, mpirun) to its end; its exit status (130 on Ctrl-C, passed on)."""
    process = subprocess.Popen(argv, env=environ)
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        process.wait()
        return 130


def run(args: argparse.Namespace) -> int:
    """``hasten launch``: validate everything, print notes (flag overrides), then run the job."""
    path, config = load_launch_config(args.config_file)
    plan = build_plan(args, config, path)
    for note in plan.notes:
        print(note, file=sys.stderr)
    sys.stderr.flush()
    if plan.deepspeed_runner is not None:
        return execute_deepspeed_runner(plan.deepspeed_runner)
    if plan.mpi_runner is not None:
        return execute_mpi_runner(plan.mpi_runner)
    return execute(plan)


def execute_mpi_runner(runner: MpiRunner) -> int:
    """Run ``mpirun`` (launch_mpi.py) and wait; its exit status."""
    return _run_and_wait(runner.argv, {**os.environ, **runner.env})


def main() -> None:
    """``hasten launch`` as a program of its own (Accelerate's ``accelerate-launch``)."""
    from .cli import main as cli_main

    sys.exit(cli_main(["launch", *sys.argv[1:]]))


def _validate_launch_command(args):
    """Accelerate's helper of the same name: ``args`` with every setting it leaves unset taken from the config file
    (``--config_file``, else the default one), checked as ``hasten launch`` checks them; returns ``(args, defaults,
    mp_from_config_flag)``: the config file's contents (None without one) and whether ``mixed_precision`` came
    from it. Sections (``fsdp_config``, ``deepspeed_config``, ``dynamo_config`` ...) fill their flags
    (``fsdp_<key>``) the same way. Flags given on the command line are kept; a value that only repeats the
    parser's default (``launch_defaults``) gives way to the config file's."""
    from .launch_plan import resolve_settings

    path, config = load_launch_config(args.config_file)
    given = given_flags(args)
    values, sources, _ = resolve_settings(args, config, path)  # which reads the same view
    for name, value in values.items():
        if getattr(given, name, None) is None and value is not None:
            setattr(args, name, value)
    for section, entries in (config or {}).items():
        if not isinstance(entries, dict):
            continue
        prefix = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_"}.get(section, "")
        for key, value in entries.items():
            flag = key if key.startswith(prefix) else prefix + key
            if hasattr(args, flag) and getattr(given, flag) is None:
                setattr(args, flag, value)
    return args, config, sources.get("mixed_precision") == "config file"


def launch_command(args: argparse.Namespace) -> None:
    """Accelerate's in-process entry point: run the job like ``hasten launch``; a job that fails raises
    ``subprocess.CalledProcessError`` with its exit status (a caller must never read a failure as success).

    Accelerate picks a launcher per backend; hasten runs every job, one process or many, through torchrun's agent
    (DeepSpeed across machines: DeepSpeed's runner, when asked for).
    """
    code = run(args)
    if code:
        command = [sys.executable, str(getattr(args, "training_script", "") or ""),
                   *map(str, getattr(args, "training_script_args", None) or ())]
        raise subprocess.CalledProcessError(returncode=code, cmd=command)


simple_launcher = multi_gpu_launcher = launch_command


def deepspeed_launcher(args: argparse.Namespace) -> None:
    """Accelerate's DeepSpeed launcher: ``launch_command`` with DeepSpeed switched on (``--use_deepspeed``); a job
    that fails raises ``CalledProcessError``."""
    args.use_deepspeed = True
    launch_command(args)


def tpu_launcher(args: argparse.Namespace) -> NoReturn:
    raise backend_not_yet_supported("TPU")


tpu_pod_launcher = tpu_launcher


def sagemaker_launcher(sagemaker_config: Any, args: argparse.Namespace) -> NoReturn:
    raise backend_not_yet_supported("Amazon SageMaker")
