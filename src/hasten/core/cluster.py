"""Where this process sits in a job, read from the variables of whatever started it: one table for every engine.

A training script runs unchanged under ``hasten launch`` / ``torchrun``, a Kubeflow ``PyTorchJob``, Ray Train, a
plain ``python train.py`` per machine with the rank variables set, ``mpirun``, and ``srun`` under SLURM. Each of
them says the same five facts in its own words; ``ENGINES`` lists, in the order they are tried, which variables
announce an engine and which carry each fact. The first engine whose announcing variables are all set wins:
torch's own names first (torchrun and every engine that sets them: PyTorchJob, Ray Train, a user's own), then IBM
LSF's ``jsrun`` (before the MPI families, whose variables Spectrum MPI sets beside it), then the MPI families, then
SLURM's task variables (an ``srun`` job step started without a launcher).

``place_process`` reads them and checks them before any process group is touched: a rank that is not a whole
number or is missing, a rank not below the world size, a local rank not below the processes per machine, a port
that is not one; ``check_rendezvous``, before ``init_process_group`` without an ``init_method``, a job of several
processes without a main address or port. ``adopt_placement`` then writes torch's names
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) where they are
missing, which is what ``torch.distributed``'s ``env://`` initialisation and DeepSpeed read.

SLURM's main address is the first host of the step's node list (``core/slurm.py`` reads SLURM's host-list syntax);
its port, unless ``MASTER_PORT`` is set, is 15000 plus the job id's last four digits, so every task of a job
agrees without talking and two jobs on one node rarely collide (Lightning's rule too). The number of processes is
the job step's (``SLURM_STEP_NUM_TASKS``, which ``srun`` sets for each task it starts), not the job's
(``SLURM_NTASKS``): the batch script around the steps is a step of one task, so ``python train.py`` run there
directly trains alone instead of waiting for tasks that never come.

LSF's main address is the first compute host of the job's rank file (``LSB_DJOB_RANKFILE``: one host per line, the
first line the launch node, which runs no task), its port ``MASTER_PORT`` or 10000 plus the job id's last four
digits (Lightning's rule).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

__all__ = ["Engine", "ENGINES", "Placement", "place_process", "check_rendezvous", "adopt_placement",
           "slurm_tasks_on_node"]


@dataclass(frozen=True)
class Engine:
    """One row of the table: what announces the engine and where each fact is read (the first variable set wins).
    ``main_address`` / ``main_port`` may be functions of the environment for engines that do not name them."""

    name: str
    announced_by: tuple[str, ...]
    rank: tuple[str, ...]
    world_size: tuple[str, ...]
    local_rank: tuple[str, ...] = ()
    local_world_size: tuple[str, ...] = ()
    main_address: tuple[str, ...] = ("MASTER_ADDR",)
    main_port: tuple[str, ...] = ("MASTER_PORT",)
    #: functions of the environment for the facts an engine does not name: ``(value, where it came from)``, or None
    derive_address: Optional[Callable[[Mapping[str, str]], Optional[tuple[str, str]]]] = None
    derive_port: Optional[Callable[[Mapping[str, str]], Optional[tuple[int, str]]]] = None
    derive_local_world_size: Optional[Callable[[Mapping[str, str]], Optional[tuple[int, str]]]] = None


def _slurm_address(environ: Mapping[str, str]) -> Optional[tuple[str, str]]:
    from .slurm import first_host

    name = next((name for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                 if environ.get(name)), None)
    return (first_host(environ[name]), name) if name else None


def _port_from_job_id(variable: str, base: int) -> Callable[[Mapping[str, str]], Optional[tuple[int, str]]]:
    """``base`` plus the last four digits of the job id in ``variable``: the same port on every task of a job."""
    def derive(environ: Mapping[str, str]) -> Optional[tuple[int, str]]:
        digits = re.sub(r"\D", "", environ.get(variable, ""))
        return (base + int(digits[-4:]), variable) if digits else None

    return derive


def _lsf_address(environ: Mapping[str, str]) -> Optional[tuple[str, str]]:
    """The first compute host of LSF's rank file (its first line is the launch node, which runs no task)."""
    path = environ.get("LSB_DJOB_RANKFILE")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            hosts = list(dict.fromkeys(line.strip() for line in handle if line.strip()))
    except OSError as error:
        raise ValueError(f"LSB_DJOB_RANKFILE={path!r} (set by LSF) cannot be read ({error}): the main process's host "
                         "is unknown. Set MASTER_ADDR, or fix the variable.") from None
    compute = hosts[1:] or hosts
    return (compute[0], "LSB_DJOB_RANKFILE") if compute else None


def slurm_tasks_on_node(tasks_per_node: str, node: int) -> Optional[int]:
    """How many tasks SLURM runs on node ``node``, from its compact count list (``"2(x3),1"``: 2 on each of the
    first three nodes, 1 on the fourth); None when the list does not reach that node or cannot be read."""
    counts: list[int] = []
    for item in filter(None, tasks_per_node.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            return None
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts[node] if 0 <= node < len(counts) else None


def _slurm_local_world_size(environ: Mapping[str, str]) -> Optional[tuple[int, str]]:
    listing = environ.get("SLURM_STEP_TASKS_PER_NODE")  # the step's, as the number of processes
    node = environ.get("SLURM_NODEID", "0")
    count = slurm_tasks_on_node(listing, int(node)) if listing and node.isdigit() else None
    return (count, "SLURM_STEP_TASKS_PER_NODE") if count is not None else None


#: the engines, in the order they are tried (see the module docstring)
ENGINES: tuple[Engine, ...] = (
    Engine("torchrun / PyTorchJob / Ray Train / plain variables", ("WORLD_SIZE",), ("RANK",), ("WORLD_SIZE",),
           ("LOCAL_RANK",), ("LOCAL_WORLD_SIZE",)),
    Engine("IBM LSF (jsrun)", ("JSM_NAMESPACE_RANK", "LSB_JOBID"), ("JSM_NAMESPACE_RANK",), ("JSM_NAMESPACE_SIZE",),
           ("JSM_NAMESPACE_LOCAL_RANK",), derive_address=_lsf_address,
           derive_port=_port_from_job_id("LSB_JOBID", 10000)),
    Engine("Open MPI", ("OMPI_COMM_WORLD_RANK",), ("OMPI_COMM_WORLD_RANK",), ("OMPI_COMM_WORLD_SIZE",),
           ("OMPI_COMM_WORLD_LOCAL_RANK",), ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    Engine("Intel MPI / MPICH", ("PMI_RANK",), ("PMI_RANK",), ("PMI_SIZE",), ("MPI_LOCALRANKID",),
           ("MPI_LOCALNRANKS",)),
    Engine("MVAPICH", ("MV2_COMM_WORLD_RANK",), ("MV2_COMM_WORLD_RANK",), ("MV2_COMM_WORLD_SIZE",),
           ("MV2_COMM_WORLD_LOCAL_RANK",), ("MV2_COMM_WORLD_LOCAL_SIZE",)),
    Engine("SLURM (srun)", ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"), ("SLURM_PROCID",), ("SLURM_STEP_NUM_TASKS",),
           ("SLURM_LOCALID",),
           derive_address=_slurm_address, derive_port=_port_from_job_id("SLURM_JOB_ID", 15000),
           derive_local_world_size=_slurm_local_world_size),
)


@dataclass(frozen=True)
class Placement:
    """This process's place in its job, with the engine that said so and the variable behind each fact."""

    engine: str
    rank: int
    world_size: int
    local_rank: int = 0
    local_world_size: Optional[int] = None
    main_address: Optional[str] = None
    main_port: Optional[int] = None
    sources: dict = field(default_factory=dict, compare=False)


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[Optional[str], Optional[str]]:
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            return name, value
    return None, None


def _whole(engine: str, name: str, value: str, minimum: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise ValueError(f"{name}={value!r} (set by {engine}) is not a whole number >= {minimum}: this process cannot "
                         "tell its place in the job. Fix the variable, or start the script with `hasten launch`.")
    return number


def place_process(environ: Optional[Mapping[str, str]] = None) -> Optional[Placement]:
    """This process's place, from the first engine of ``ENGINES`` whose variables are set; None when none is (a
    single process). Raises ``ValueError`` naming the variable for values that cannot be right."""
    environ = os.environ if environ is None else environ
    for engine in ENGINES:
        if not all(environ.get(name) not in (None, "") for name in engine.announced_by):
            continue
        sources: dict = {}

        def read(fact: str, names: tuple[str, ...], minimum: int) -> Optional[int]:
            name, value = _first(environ, names)
            if name is None:
                return None
            sources[fact] = name
            return _whole(engine.name, name, value, minimum)

        rank = read("rank", engine.rank, 0)
        world_size = read("world_size", engine.world_size, 1)
        if world_size is None:
            raise ValueError(f"{engine.name}: {sources['rank']} is set but none of {', '.join(engine.world_size)} is: "
                             "the job's number of processes is unknown.")
        if rank is None and world_size > 1:
            raise ValueError(f"{sources['world_size']}={world_size} is set (by {engine.name}) but "
                             f"{' / '.join(engine.rank)} is not: this process cannot tell which of them it is.")
        sources.setdefault("rank", engine.rank[0])
        rank = rank or 0
        local_rank = read("local_rank", engine.local_rank, 0) or 0
        local_world_size = read("local_world_size", engine.local_world_size, 1)
        if local_world_size is None and engine.derive_local_world_size is not None:
            local_world_size = _derived(engine.derive_local_world_size, environ, "local_world_size", sources)
        address_from, address = _first(environ, engine.main_address)
        if address is None and engine.derive_address is not None:
            address, address_from = engine.derive_address(environ) or (None, address_from)
        port = read("main_port", engine.main_port, 1)
        if port is None and engine.derive_port is not None:
            port = _derived(engine.derive_port, environ, "main_port", sources)
        if address is not None:
            sources["main_address"] = address_from
        placement = Placement(engine.name, rank, world_size, local_rank, local_world_size, address, port, sources)
        _check(placement)
        _check_pytorchjob_processes_per_pod(environ)
        return placement
    return None


def _derived(derive: Callable, environ: Mapping[str, str], fact: str, sources: dict):
    """An engine's derived fact (``derive(environ)``: ``(value, where)`` or None), its source noted when found."""
    found = derive(environ)
    if found is None:
        return None
    sources[fact] = found[1]
    return found[0]


def _check(place: Placement) -> None:
    """Refuse a place that cannot be right, naming the variables (before any process group is touched)."""
    said = place.sources
    if place.rank >= place.world_size:
        raise ValueError(f"{said['rank']}={place.rank} is not below {said['world_size']}={place.world_size} (set by "
                         f"{place.engine}): ranks run from 0 to the number of processes minus one.")
    if place.local_world_size is not None and place.local_rank >= place.local_world_size:
        raise ValueError(f"{said.get('local_rank', 'the local rank')}={place.local_rank} is not below "
                         f"{said.get('local_world_size', 'the processes per machine')}={place.local_world_size} "
                         f"(set by {place.engine}).")
    if place.local_world_size is not None and place.local_world_size > place.world_size:
        raise ValueError(f"{said.get('local_world_size')}={place.local_world_size} processes per machine is more than "
                         f"{said['world_size']}={place.world_size} in all (set by {place.engine}).")
    if place.main_port is not None and place.main_port > 65535:
        raise ValueError(f"{said.get('main_port', 'MASTER_PORT')}={place.main_port} is not a port (1-65535).")


def _check_pytorchjob_processes_per_pod(environ: Mapping[str, str]) -> None:
    """A PyTorchJob with ``nprocPerNode > 1`` counts every pod's processes in ``WORLD_SIZE`` and expects torchrun to
    start them (``PET_NPROC_PER_NODE``); a pod's plain ``python train.py`` would wait for processes never started."""
    per_pod = environ.get("PET_NPROC_PER_NODE", "")
    started_by_torchrun = any(name in environ for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID"))
    if per_pod.isdigit() and int(per_pod) > 1 and not started_by_torchrun:
        raise ValueError(f"PET_NPROC_PER_NODE={per_pod}: this PyTorchJob runs {per_pod} processes per pod and counts "
                         f"them in WORLD_SIZE={environ.get('WORLD_SIZE')}, but this process was not started by "
                         "torchrun. Make the pod's command `torchrun train.py` (or `hasten launch train.py`), which "
                         "reads the PET_* variables.")


def check_rendezvous(place: Placement) -> None:
    """Refuse a job of several processes that names no main address or port (``env://`` needs both): called before
    ``init_process_group`` when no ``init_method`` is given."""
    said = place.sources
    if place.world_size > 1 and not place.main_address:
        raise ValueError(f"{said['world_size']}={place.world_size} is set (by {place.engine}) but MASTER_ADDR is not: "
                         "the processes cannot find each other. Set MASTER_ADDR and MASTER_PORT to the main "
                         "process's host and a free port, or start the script with `hasten launch -n N script.py`.")
    if place.world_size > 1 and place.main_port is None:
        raise ValueError(f"{said['world_size']}={place.world_size} and MASTER_ADDR are set (by {place.engine}) but "
                         "MASTER_PORT is not: set it to a free port on the main process's host.")


def adopt_placement(environ: Optional[dict] = None) -> Optional[Placement]:
    """``place_process``, then torch's variables written where missing (``environ``: default ``os.environ``), so
    that ``torch.distributed`` and DeepSpeed find the same place. A job of one process needs no address."""
    environ = os.environ if environ is None else environ
    place = place_process(environ)
    if place is None:
        return None
    values = {"RANK": place.rank, "WORLD_SIZE": place.world_size, "LOCAL_RANK": place.local_rank,
              "LOCAL_WORLD_SIZE": place.local_world_size, "MASTER_ADDR": place.main_address,
              "MASTER_PORT": place.main_port}
    for name, value in values.items():
        if value is not None and environ.get(name) in (None, ""):
            environ[name] = str(value)
    return place
