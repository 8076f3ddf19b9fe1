"""From ``hasten launch`` flags and the config file to torchrun's arguments and the workers' environment.

Nothing is started here: every rule (flag > config file > default, validation, ports, thread counts) is
a pure function of the parsed flags, the config dict and a few machine facts, so each can be unit-tested.

``--num_processes`` is the TOTAL number of processes over all machines, as in Accelerate: each machine
starts ``num_processes // num_machines`` of them. ``--num_machines MIN:MAX`` (torchrun's elastic form) counts
the total at MAX machines. Inside a SLURM allocation the machine layout comes from SLURM (``slurm``).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Optional

from ..config.deepspeed_launch import resolve_deepspeed
from ..config.fp8_launch import fp8_env
from ..config.enums import DistributedType, DynamoBackend, PrecisionType
from ..config.launch_file import APPLIED_SETTING
from ..config.launch_groups import BACKEND_SWITCH_OF, backend_not_yet_supported, backend_section_env
from ..core.env_vars import env_name, str_to_bool
from .errors import CommandError
from .launch_defaults import given_flags
from .launch_deepspeed import DeepSpeedRunner, runner_command, uses_runner
from .launch_mpi import MpiRunner, mpirun_command, mpirun_hostfile
from .launch_options import backend_env, given_backend_options
from .launch_parallelism import parallelism_env
from .loopback_store import is_loopback
from ..core.slurm import SlurmLayout, first_host, slurm_layout

RUNNER_MODULE = "hasten.commands.run_script"
DEFAULT_MULTI_MACHINE_PORT = 29500
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")


@dataclass
class LaunchPlan:
    """What ``hasten launch`` will do: torchrun's command line, the workers' extra environment, notes to print."""

    torchrun_args: list
    env: dict
    notes: list
    settings: dict  # the resolved values, by flag name
    config_path: Optional[str] = None
    program: str = ""  # the script, module or executable, as the user wrote it
    sources: dict = field(default_factory=dict)  # flag name -> "flag" | "SLURM" | "config file" | "default"
    loopback_store: bool = False  # the rendezvous store listens on the loopback address only (one machine)
    deepspeed_runner: Optional[DeepSpeedRunner] = None  # set: DeepSpeed's multi-node runner starts the job instead
    mpi_runner: Optional[MpiRunner] = None  # set: mpirun starts the job instead (launch_mpi.py)


# ---------------------------------------------------------------------------------------------- parsing
def _integer(value, minimum: int) -> int:
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise ValueError(f"expected a whole number, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected a whole number, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"must be at least {minimum}, got {number}")
    return number


def _positive(value) -> int:
    return _integer(value, 1)


def _non_negative(value) -> int:
    return _integer(value, 0)


def _port(value) -> int:
    port = _integer(value, 0)
    if port > 65535:
        raise ValueError(f"a port is a number from 0 to 65535, got {port}")
    return port


def _boolean(value) -> bool:
    return value if isinstance(value, bool) else bool(str_to_bool(value))


def _precision(value) -> str:
    return PrecisionType.parse(value, "mixed precision").value


def _dynamo(value) -> str:
    return DynamoBackend.parse(str(value).upper(), "dynamo backend").value


def _rdzv_backend(value) -> str:
    text = str(value).strip().lower()
    if text not in RDZV_BACKENDS:
        raise ValueError(f"unknown rendezvous backend {value!r}; choose one of {', '.join(RDZV_BACKENDS)}")
    return text


def _text(value) -> str:
    return str(value)


class MachineCount(NamedTuple):
    """``--num_machines``: a number, or torchrun's elastic ``MIN:MAX``."""

    minimum: int
    maximum: int

    def __str__(self) -> str:
        return str(self.maximum) if self.minimum == self.maximum else f"{self.minimum}:{self.maximum}"


def _machines(value) -> MachineCount:
    if isinstance(value, MachineCount):
        return value
    low, sep, high = str(value).partition(":")
    if not sep:
        count = _positive(value)
        return MachineCount(count, count)
    try:
        minimum, maximum = _positive(low.strip()), _positive(high.strip())
    except ValueError:
        raise ValueError(f"write a number of machines, or MIN:MAX for an elastic job (e.g. 1:4); "
                         f"got {value!r}") from None
    if minimum > maximum:
        raise ValueError(f"MIN:MAX needs MIN <= MAX, got {value!r}")
    return MachineCount(minimum, maximum)


_NONE = object()  # a _Setting field left unset (None can be a value)


@dataclass(frozen=True)
class _Setting:
    """One launcher setting, declared once: its flag (the argparse dest), where it sits in the config dict, how to
    parse it, its default when neither gives it, the ``HASTEN_*`` setting that carries it to the script, and what
    the script assumes without it (a config file value equal to that is not exported: ``write_basic_config`` writes
    ``mixed_precision: no``, which would otherwise contradict an argument in code)."""

    name: str
    parse: Callable[[Any], Any]
    config_key: Optional[tuple] = None  # path into the config dict; None: flag only
    is_switch: bool = False  # a flag without a value (--cpu)
    default: Any = _NONE  # the launcher's value when neither flag nor config file gives one
    env: Optional[str] = None  # the HASTEN_<ENV> setting exported to the script (only when given explicitly)
    script_default: Any = _NONE  # what the script assumes when the setting is not exported


def _key(*path: str) -> tuple:
    return path


SETTINGS = (
    _Setting("num_processes", _positive, _key("num_processes")),
    _Setting("num_machines", _machines, _key("num_machines"), default=MachineCount(1, 1)),
    _Setting("machine_rank", _non_negative, _key("machine_rank"), default=0),
    _Setting("main_process_ip", _text, _key("main_process_ip")),
    _Setting("main_process_port", _port, _key("main_process_port")),
    _Setting("rdzv_backend", _rdzv_backend, _key("rdzv_backend"), default="static"),
    _Setting("rdzv_conf", _text, _key("rdzv_conf")),
    _Setting("max_restarts", _non_negative, _key("max_restarts"), default=0),
    _Setting("monitor_interval", float, _key("monitor_interval"), default=0.1),
    _Setting("mixed_precision", _precision, _key("mixed_precision"), env="mixed_precision", script_default="no"),
    _Setting("cpu", _boolean, _key("use_cpu"), is_switch=True, default=False, env="use_cpu", script_default=False),
    _Setting("gpu_ids", _text, _key("gpu_ids")),
    _Setting("gradient_accumulation_steps", _positive, _key("gradient_accumulation_steps"),
             env="gradient_accumulation_steps", script_default=1),
    _Setting("dynamo_backend", _dynamo, _key("dynamo_config", "dynamo_backend"), env="dynamo_backend",
             script_default="NO"),
    _Setting("dynamo_mode", _text, _key("dynamo_config", "dynamo_mode"), env="dynamo_mode", script_default="default"),
    _Setting("dynamo_use_fullgraph", _boolean, _key("dynamo_config", "dynamo_use_fullgraph"),
             env="dynamo_use_fullgraph", script_default=False),
    _Setting("dynamo_use_dynamic", _boolean, _key("dynamo_config", "dynamo_use_dynamic"), env="dynamo_use_dynamic",
             script_default=False),
    _Setting("dynamo_use_regional_compilation", _boolean, _key("dynamo_config", "dynamo_use_regional_compilation"),
             env="dynamo_use_regional_compilation", script_default=False),
    _Setting("debug", _boolean, _key("debug"), is_switch=True, default=False, env="debug_mode", script_default=False),
    _Setting("enable_cpu_affinity", _boolean, _key("enable_cpu_affinity"), is_switch=True, default=False,
             env="cpu_affinity", script_default=False),
    _Setting("num_cpu_threads_per_process", _positive, None),
    _Setting("tee", _text, None),
    _Setting("role", _text, None),
    _Setting("log_dir", _text, None),
)

# Views of SETTINGS by name, for the code that reads one column
DEFAULTS = {setting.name: setting.default for setting in SETTINGS if setting.default is not _NONE}
SETTING_ENV = {setting.name: setting.env for setting in SETTINGS if setting.env is not None}
SCRIPT_DEFAULTS = {setting.name: setting.script_default for setting in SETTINGS if setting.script_default is not _NONE}

# distributed_type in a config file -> the HASTEN_USE_* switch that tells the script which strategy to use
STRATEGY_ENV = BACKEND_SWITCH_OF


def chosen_strategy(args: argparse.Namespace, config: Optional[Mapping], config_path: Optional[str],
                    notes: list) -> str:
    """The backend of the job: a ``--use_<backend>`` flag, else the config file's ``distributed_type`` ("" if
    neither). A flag beats another backend named in the config file, with a note; two such flags are an error."""
    switches = [name for name in STRATEGY_ENV.values() if getattr(args, name, None)]
    if len(switches) > 1:
        raise CommandError(f"{' and '.join('--' + name for name in switches)} cannot be used together: a job trains "
                           "with one backend. Keep one of them.")
    kind = str(config.get("distributed_type") or "").upper() if config else ""
    if not switches:
        return kind
    flagged = next(key for key, name in STRATEGY_ENV.items() if name == switches[0])
    if kind in STRATEGY_ENV and kind != flagged:
        notes.append(f"hasten launch: --{switches[0]} overrides distributed_type: {kind} from {config_path}")
    return flagged


def _flag_text(name: str) -> str:
    return "--" + name


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _sentence(error) -> str:
    text = str(error).strip()
    return text if text.endswith(".") else text + "."


def _config_value(config: Mapping, path: tuple):
    value = config
    for index, part in enumerate(path):
        if not isinstance(value, Mapping):
            return None
        found = value.get(part)
        if found is None and index == len(path) - 1 and part.startswith("dynamo_"):
            found = value.get(part[len("dynamo_"):])  # dynamo_config may spell keys without the prefix
        value = found
    return value


def resolve_settings(args: argparse.Namespace, config: Optional[Mapping],
                     config_path: Optional[str]) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Each setting from its flag, else the config file, else its default: ``(values, sources, notes)``.

    A flag that contradicts the config file wins and adds a note saying so. A value that only repeats the
    parser's default is not a flag given (``launch_defaults``).
    """
    args = given_flags(args)
    values, sources, notes = {}, {}, []
    for setting in SETTINGS:
        raw_flag = getattr(args, setting.name, None)
        raw_file = _config_value(config, setting.config_key) if config and setting.config_key else None
        from_flag = from_file = None
        if raw_flag is not None:
            try:
                from_flag = setting.parse(raw_flag)
            except ValueError as error:
                raise CommandError(f"{_flag_text(setting.name)} {raw_flag!r}: {_sentence(error)}") from None
        if raw_file is not None:
            try:
                from_file = setting.parse(raw_file)
            except ValueError as error:
                key = ".".join(setting.config_key)
                raise CommandError(f"{key}: {raw_file!r} in the config file {config_path}: {_sentence(error)} "
                                   "Fix the file or pass the setting on the command line.") from None
        if from_flag is not None:
            values[setting.name], sources[setting.name] = from_flag, "flag"
            if from_file is not None and from_file != from_flag:
                shown = _flag_text(setting.name) + ("" if setting.is_switch else f" {_show(from_flag)}")
                notes.append(f"hasten launch: {shown} overrides {setting.config_key[-1]}: {_show(from_file)} "
                             f"from {config_path}")
        elif from_file is not None:
            values[setting.name], sources[setting.name] = from_file, "config file"
        else:
            values[setting.name], sources[setting.name] = DEFAULTS.get(setting.name), "default"
    return values, sources, notes


# ---------------------------------------------------------------------------------------------- checks
def check_backend_flags(args: argparse.Namespace) -> None:
    """A flag of a backend hasten does not have yet ends the launch here, before anything starts."""
    given = given_backend_options(args)
    if given:
        group, flags = given[0]
        raise backend_not_yet_supported(group.title, flags)


def _check_target(args) -> None:
    script = args.training_script
    if args.module and args.no_python:
        raise CommandError("--module and --no_python cannot be used together: -m runs a Python module, "
                           "--no_python runs an executable.")
    if args.module:
        top = script.split(".")[0]
        saved = list(sys.path)
        sys.path.insert(0, os.getcwd())  # the workers run `python -m` here, which puts the cwd first
        try:
            found = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path[:] = saved
        if not found:
            raise CommandError(f"-m {script}: no module named {top!r} can be imported from {os.getcwd()} "
                               "(or PYTHONPATH). Check the name, or run from the folder that contains it.")
    elif args.no_python:
        if shutil.which(script) is None:
            raise CommandError(f"--no_python {script}: no such executable (not a file, not on PATH).")
    elif not (Path(script).is_file() or (Path(script) / "__main__.py").is_file()):
        raise CommandError(f"the script {script!r} does not exist (looked from {os.getcwd()}). Pass the path of "
                           "a Python file, or -m package.module to run a module.")


_TEE = re.compile(r"^[0-3]$|^\d+:[0-3](,\d+:[0-3])*$")


def _check_values(values: dict) -> None:
    machines, total = values["num_machines"], values["num_processes"]
    if total % machines:
        raise CommandError(f"--num_processes {total} is the total over all machines and must be divisible by "
                           f"--num_machines {machines} (each machine runs num_processes // num_machines).")
    if values["machine_rank"] >= machines:
        raise CommandError(f"--machine_rank {values['machine_rank']} must be smaller than --num_machines "
                           f"{machines} (machines are numbered from 0).")
    if machines > 1 and not values["main_process_ip"]:
        raise CommandError(f"--num_machines {machines} needs --main_process_ip: the address of machine 0, which "
                           "every machine connects to.")
    if machines > 1 and values["main_process_port"] == 0:
        raise CommandError("--main_process_port 0 (pick a free port) only works on one machine: every machine "
                           f"must be given the same port, e.g. --main_process_port {DEFAULT_MULTI_MACHINE_PORT}.")
    if values["monitor_interval"] <= 0:
        raise CommandError(f"--monitor_interval must be positive (seconds), got {values['monitor_interval']}.")
    conf = values.get("rdzv_conf")
    if conf and any("=" not in item for item in conf.split(",")):
        raise CommandError(f"--rdzv_conf {conf!r}: write key=value pairs separated by commas, e.g. "
                           "'join_timeout=600,read_timeout=60'.")
    tee = values.get("tee")
    if tee and not _TEE.match(tee):
        raise CommandError(f"--tee {tee!r}: use 0 (none), 1 (stdout), 2 (stderr) or 3 (both), for all local "
                           "ranks, or per rank as 'RANK:N,RANK:N' (e.g. '0:3,1:2').")


# ---------------------------------------------------------------------------------------------- machines
def apply_slurm(values: dict, sources: dict, notes: list, layout: SlurmLayout, config_path: Optional[str],
                hostnames: Optional[Callable] = None) -> None:
    """Take the machine layout from the SLURM allocation (flag > SLURM > config file > default).

    A flag that contradicts the allocation is an error naming both; a config file value is overridden with a
    note. An elastic ``--num_machines MIN:MAX`` that admits the allocation's node count is kept.
    """
    job = f"SLURM job {layout.job_id}" if layout.job_id else "the SLURM allocation"
    facts = (("num_machines", MachineCount(layout.num_machines, layout.num_machines), layout.num_machines_from),
             ("machine_rank", layout.machine_rank, layout.machine_rank_from))
    for name, value, variable in facts:
        current = values[name]
        if sources[name] == "flag":
            fits = (current.minimum <= layout.num_machines <= current.maximum if name == "num_machines"
                    else current == value)
            if not fits:
                raise CommandError(f"--{name} {current} contradicts {variable}={value} of {job}. Drop --{name}: "
                                   "inside SLURM hasten launch reads the machine layout from the allocation.")
            continue
        if sources[name] == "config file" and current != value:
            notes.append(f"hasten launch: {variable}={value} ({job}) overrides {name}: {current} from {config_path}")
        values[name], sources[name] = value, "SLURM"
    if layout.num_machines > 1 and sources["main_process_ip"] != "flag":
        try:
            host = first_host(layout.nodelist, hostnames)
        except ValueError as error:
            raise CommandError(f"{layout.nodelist_from}: {_sentence(error)} Pass --main_process_ip.") from None
        if sources["main_process_ip"] == "config file" and values["main_process_ip"] != host:
            notes.append(f"hasten launch: {layout.nodelist_from} (first host {host}) overrides main_process_ip: "
                         f"{values['main_process_ip']} from {config_path}")
        values["main_process_ip"], sources["main_process_ip"] = host, "SLURM"
    if layout.num_machines > 1:
        notes.append(f"hasten launch: {job}: this is machine {values['machine_rank']} of {values['num_machines']}; "
                     f"machine 0 is {values['main_process_ip']}.")


def _elastic_rendezvous(values: dict, sources: dict, notes: list) -> None:
    """A range of machines needs a rendezvous that admits machines as they come: c10d unless one was chosen."""
    if values["min_machines"] == values["num_machines"]:
        return
    if values["rdzv_backend"] == "static":
        if sources["rdzv_backend"] != "default":
            raise CommandError(f"--num_machines {values['min_machines']}:{values['num_machines']} is an elastic job, "
                               "which the static rendezvous cannot form: use --rdzv_backend c10d.")
        values["rdzv_backend"] = "c10d"
        notes.append("hasten launch: an elastic --num_machines MIN:MAX uses the c10d rendezvous.")


# ---------------------------------------------------------------------------------------------- machine facts
def usable_cpu_count() -> int:
    """CPU cores this process may run on (respects taskset / cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def accelerator_count() -> int:
    """Accelerators (GPUs ...) torch can see; 0 on a CPU-only machine. Imports torch."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.xpu.device_count()
    return 0


def threads_per_process(cpu_count: int, processes_here: int) -> int:
    """Default OMP threads for each of ``processes_here`` processes sharing ``cpu_count`` cores."""
    return max(1, cpu_count // max(1, processes_here))


def choose_port(values: dict, find_free_port: Callable[[], int], is_port_in_use: Callable[[int, str], bool]) -> int:
    """The rendezvous port: a free one on a single machine unless one was given; 29500 across machines."""
    port = values["main_process_port"]
    single = values["num_machines"] == 1
    if single and not port:
        return find_free_port()
    if port is None:
        port = DEFAULT_MULTI_MACHINE_PORT
    if values["rdzv_backend"] == "static" and values["machine_rank"] == 0:
        host = values["main_process_ip"] if single and values["main_process_ip"] else "127.0.0.1"
        if is_port_in_use(port, host):
            raise CommandError(f"--main_process_port {port} is already in use on {host} (another job?). Pass "
                               "--main_process_port 0 to pick a free port, or another port number.")
    return port


def _restartable_rendezvous(values: dict) -> Optional[str]:
    """With ``--max_restarts`` the static rendezvous is replaced by c10d, which can form the group again.

    torchrun's static rendezvous keeps one store for every attempt, so restarted workers find the
    previous attempt's entries and hang or fail. On one machine hasten switches to a c10d rendezvous
    (``"localhost:0"`` when no port was given, else the endpoint); across machines it asks for it.
    Returns the c10d endpoint to use, or None to keep the configured backend.
    """
    if values["max_restarts"] == 0 or values["rdzv_backend"] != "static":
        return None
    if values["num_machines"] > 1:
        raise CommandError("--max_restarts across machines needs --rdzv_backend c10d: torchrun's static rendezvous "
                           "cannot form the group again after a failure.")
    if not values["main_process_port"]:
        return "localhost:0"
    return f"{values['main_process_ip'] or '127.0.0.1'}:{values['main_process_port']}"


def store_on_loopback(values: dict, restartable: Optional[str]) -> bool:
    """Whether the rendezvous store can listen on the loopback address only: a static one-machine job whose
    address is this machine's loopback (the default). Other jobs keep torch's store, on every interface."""
    return (restartable is None and values["rdzv_backend"] == "static" and values["num_machines"] == 1
            and values["min_machines"] == 1 and values["machine_rank"] == 0
            and is_loopback(values["main_process_ip"] or "127.0.0.1"))


def worker_env(values: dict, sources: dict, config: Optional[Mapping], config_path: Optional[str],
               environ: Mapping, cpu_count: int, per_machine: int, strategy: Optional[str] = None) -> dict:
    """The variables ``hasten launch`` adds to the workers' environment (``strategy``: the job's backend, see
    ``chosen_strategy``; by default the config file's). The DeepSpeed group's come from
    ``config/deepspeed_launch.py``."""
    env = {}
    for name, setting in SETTING_ENV.items():
        if sources[name] == "default":  # only what was given: a default must not contradict the script
            continue
        if sources[name] == "config file" and _show(values[name]) == _show(SCRIPT_DEFAULTS.get(name)):
            continue
        env[env_name(setting)] = _show(values[name])
    if config_path:
        env[env_name("config_file")] = str(config_path)
        env[env_name(APPLIED_SETTING)] = "true"  # its settings are in these variables: the workers do not reread it
        kind = str(config.get("distributed_type") or "").upper() if config else ""
        kind = kind if strategy is None else strategy
        env.update(backend_section_env(kind, config))  # FSDP / Megatron-LM's switch and section (flags win later)
    gpu_ids = values.get("gpu_ids")
    if gpu_ids and gpu_ids.strip().lower() != "all":
        env["CUDA_VISIBLE_DEVICES"] = gpu_ids.strip()
    if values["num_cpu_threads_per_process"] is not None:
        env["OMP_NUM_THREADS"] = str(values["num_cpu_threads_per_process"])
    elif "OMP_NUM_THREADS" not in environ:
        env["OMP_NUM_THREADS"] = str(threads_per_process(cpu_count, per_machine))
    if values["max_restarts"] > 0 and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in environ:
        # Workers that share the agent's store read the previous attempt's keys after a restart and
        # hang or fail (pytorch/pytorch#135712): give each attempt its own store.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def launch_values_win(env: Mapping, environ: Mapping, notes: list) -> dict:
    """The other names of each ``HASTEN_*`` variable this launch sets (``ACCELERATE_*``, bare ``FSDP_*`` ...) that
    the parent environment holds with another value, set to the launch's value: the workers would otherwise see
    two values for one setting and refuse both. One note per override."""
    from ..core.env_aliases import setting_variables

    follow = {}
    for name, value in env.items():
        if not name.startswith("HASTEN_"):
            continue
        for alias in setting_variables(name)[1:]:
            if alias in environ and environ[alias] != value:
                follow[alias] = value
                notes.append(f"hasten launch: this launch's {name}={value} overrides {alias}={environ[alias]!r} "
                             "inherited from the environment.")
    return follow


def other_backends_off(strategy: str, environ: Mapping, notes: list) -> dict:
    """The switches of the backends this launch did not choose (``HASTEN_USE_FSDP``, ``ACCELERATE_USE_DEEPSPEED``
    ...) that the parent environment turns on, set to ``false`` for the workers: the launch's own backend wins, as
    a launch flag wins over any inherited variable (a test suite that ran an FSDP test in-process, then launches
    ``--use_deepspeed``, would otherwise start workers that see both). One note per switch."""
    from ..core.env_aliases import setting_variables
    from ..core.env_vars import str_to_bool

    def turned_on(value) -> bool:  # a value that reads as no boolean is left for the workers to refuse
        try:
            return bool(str_to_bool(value))
        except ValueError:
            return False

    if strategy not in STRATEGY_ENV:
        return {}
    off = {}
    for kind, switch in STRATEGY_ENV.items():
        if kind == strategy:
            continue
        for name in setting_variables(switch):
            if name in environ and turned_on(environ[name]):
                off[name] = "false"
                notes.append(f"hasten launch: this launch trains with {strategy}; {name}={environ[name]!r} "
                             "inherited from the environment is set to false for the workers.")
    return off


def torchrun_arguments(args: argparse.Namespace, values: dict, per_machine: int, port: Optional[int],
                       restartable: Optional[str], rdzv_id: Optional[str] = None) -> list:
    """torchrun's command line: the layout, the rendezvous, then the runner (or executable) and its arguments."""
    address = values["main_process_ip"] or "127.0.0.1"
    backend = "c10d" if restartable else values["rdzv_backend"]
    machines = str(MachineCount(values["min_machines"], values["num_machines"]))
    torchrun = ["--nnodes", machines, "--nproc_per_node", str(per_machine),
                "--rdzv_backend", backend, "--max_restarts", str(values["max_restarts"]),
                "--monitor_interval", str(values["monitor_interval"])]
    if backend == "static":
        torchrun += ["--node_rank", str(values["machine_rank"]), "--master_addr", address, "--master_port", str(port)]
    elif restartable == "localhost:0":
        torchrun += ["--rdzv_endpoint", restartable, "--rdzv_id", f"hasten-{uuid.uuid4().hex[:12]}"]
    else:
        torchrun += ["--rdzv_endpoint", f"{address}:{port}"] + (["--rdzv_id", rdzv_id] if rdzv_id else [])
    for name in ("rdzv_conf", "tee", "log_dir", "role"):
        if values.get(name):
            torchrun += ["--" + name, str(values[name])]
    script_args = list(args.training_script_args or [])
    if args.no_python:
        return torchrun + ["--no_python", args.training_script, *script_args]
    mode = "module" if args.module else "path"
    return torchrun + ["--module", RUNNER_MODULE, mode, args.training_script, *script_args]


# ---------------------------------------------------------------------------------------------- the plan
def build_plan(args: argparse.Namespace, config: Optional[Mapping] = None, config_path: Optional[str] = None, *,
               environ: Optional[Mapping] = None, cpu_count: Optional[int] = None,
               count_accelerators: Callable[[], int] = accelerator_count,
               find_free_port: Optional[Callable[[], int]] = None,
               is_port_in_use: Optional[Callable[[int, str], bool]] = None,
               slurm_hostnames: Optional[Callable[[str], Optional[list]]] = None) -> LaunchPlan:
    """Validate everything and return the plan; raises ``CommandError`` (nothing started) on bad input.

    A flag of a backend hasten does not have yet raises ``NotYetSupportedError``. ``environ`` is where SLURM's
    variables are read; ``slurm_hostnames`` expands a node list (default: ``scontrol``, else parsed here).
    """
    args = given_flags(args)  # the parser's defaults are not flags given
    environ = os.environ if environ is None else environ
    if find_free_port is None or is_port_in_use is None:
        from ..core import network

        find_free_port = find_free_port or network.find_free_port
        is_port_in_use = is_port_in_use or network.is_port_in_use
    check_backend_flags(args)
    fp8 = fp8_env(args, config)  # another library's fp8 recipe stops the launch here, before anything starts
    values, sources, notes = resolve_settings(args, config, config_path)
    strategy = chosen_strategy(args, config, config_path, notes)
    try:
        layout = slurm_layout(environ)
    except ValueError as error:
        raise CommandError(str(error)) from None
    if layout is not None:
        apply_slurm(values, sources, notes, layout, config_path, slurm_hostnames)
    machines = values["num_machines"]
    values["min_machines"], values["num_machines"] = machines.minimum, machines.maximum
    _elastic_rendezvous(values, sources, notes)
    if values["num_processes"] is None:
        found = 0 if values["cpu"] else count_accelerators()
        values["num_processes"] = max(1, found) * values["num_machines"]
        if found > 1:
            notes.append(f"hasten launch: --num_processes not given; starting {found} processes per machine, one per "
                         "accelerator (pass -n to choose).")
    _check_values(values)
    deepspeed = resolve_deepspeed(args, config, config_path, strategy == DistributedType.DEEPSPEED.value,
                                  values, sources)
    notes.extend(deepspeed.notes)
    parallel_env, parallel_notes = parallelism_env(args, config, config_path, values["num_processes"])
    notes.extend(parallel_notes)
    if getattr(args, "training_script", None) is not None:  # env-only helpers build plans without a script
        _check_target(args)
    per_machine = values["num_processes"] // values["num_machines"]
    restartable = _restartable_rendezvous(values)
    if restartable == "localhost:0":
        port = None  # the c10d rendezvous store binds a free port itself
    else:
        port = choose_port(values, find_free_port, is_port_in_use)
    values["main_process_port"] = port

    env = worker_env(values, sources, config, config_path, environ,
                     usable_cpu_count() if cpu_count is None else cpu_count, per_machine, strategy)
    env.update(backend_env(args))
    env.update(fp8)
    env.update(deepspeed.env)
    env.update(parallel_env)
    if getattr(args, "as_accelerate", False):  # the workers' `import accelerate` is hasten (as_accelerate/)
        env["HASTEN_AS_ACCELERATE"] = "1"
    env.update(launch_values_win(env, environ, notes))
    env.update(other_backends_off(strategy, environ, notes))
    rdzv_id = f"slurm-{layout.job_id}" if layout is not None and layout.job_id else None
    torchrun = torchrun_arguments(args, values, per_machine, port, restartable, rdzv_id)
    runner = None
    if uses_runner(deepspeed, values["num_machines"]):
        runner = runner_command(args, deepspeed, values, port, env, RUNNER_MODULE)
    elif deepspeed.enabled and values["num_machines"] == 1 and any(
            deepspeed.sources.get(key) == "flag" for key in ("deepspeed_hostfile", "deepspeed_multinode_launcher")):
        notes.append("hasten launch: --deepspeed_hostfile / --deepspeed_multinode_launcher apply to several "
                     "machines only; this one-machine job is started by hasten launch itself.")
    hostfile = mpirun_hostfile(args, config)
    mpi = mpirun_command(args, values, hostfile, port, env) if hostfile and runner is None else None
    return LaunchPlan(torchrun_args=torchrun, env=env, notes=notes, settings=values,
                      config_path=str(config_path) if config_path else None, program=args.training_script,
                      sources=sources, loopback_store=store_on_loopback(values, restartable),
                      deepspeed_runner=runner, mpi_runner=mpi)
