"""The machine layout of a SLURM allocation: how many machines, which one this is, and machine 0's address.

``hasten launch`` runs once per machine (``srun --ntasks-per-node=1 hasten launch ...``); inside an
allocation it reads the layout from SLURM's variables instead of asking for ``--num_machines``,
``--machine_rank`` and ``--main_process_ip``. A job step's own variables (``SLURM_STEP_*``) come first, as
``srun`` may use fewer nodes than the job has. ``srun python train.py`` without a launcher reads the main address
here too (``first_host``, through ``core/cluster.py``).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

__all__ = ["SlurmLayout", "slurm_layout", "expand_nodelist", "first_host"]

_NODES = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
_NODELIST = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


@dataclass(frozen=True)
class SlurmLayout:
    """This machine's place in the allocation, with the variable each fact came from (for messages)."""

    num_machines: int
    machine_rank: int
    nodelist: str
    job_id: Optional[str]
    num_machines_from: str  # e.g. "SLURM_JOB_NUM_NODES"
    machine_rank_from: str = "SLURM_NODEID"
    nodelist_from: str = "SLURM_JOB_NODELIST"


def _first(environ: Mapping, names) -> tuple:
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            return name, value
    return None, None


def _count(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a whole number; is this really a SLURM allocation?") from None


def slurm_layout(environ: Mapping) -> Optional[SlurmLayout]:
    """The layout when ``environ`` is inside a SLURM allocation that names its nodes; None otherwise.

    Raises ``ValueError`` when the variables contradict each other or several launchers run per node.
    """
    nodes_from, nodes = _first(environ, _NODES)
    list_from, nodelist = _first(environ, _NODELIST)
    if nodes is None or nodelist is None:
        return None
    num_machines = _count(nodes_from, nodes)
    rank = _count("SLURM_NODEID", environ.get("SLURM_NODEID", "0"))
    if not 0 <= rank < num_machines:
        raise ValueError(f"SLURM_NODEID={rank} is not below {nodes_from}={num_machines}.")
    tasks = environ.get("SLURM_STEP_NUM_TASKS")
    if tasks and nodes_from == "SLURM_STEP_NUM_NODES" and _count("SLURM_STEP_NUM_TASKS", tasks) > num_machines:
        raise ValueError(
            f"this job step runs {tasks} tasks on {num_machines} node(s), so several `hasten launch` would start on "
            "one machine. Start one per node: `srun --ntasks-per-node=1 hasten launch ...` (hasten launch starts the "
            "processes of its machine itself)."
        )
    return SlurmLayout(num_machines=num_machines, machine_rank=rank, nodelist=nodelist,
                       job_id=environ.get("SLURM_JOB_ID") or None, num_machines_from=nodes_from,
                       nodelist_from=list_from)


# ------------------------------------------------------------------------------------------ node lists
def _split_top_level(text: str) -> list:
    """Split on commas that are not inside brackets: ``"a[1,2],b"`` -> ``["a[1,2]", "b"]``."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _range_values(spec: str, nodelist: str) -> list:
    """``"01-03,07"`` -> ``["01", "02", "03", "07"]`` (zero padding kept)."""
    values = []
    for part in spec.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"cannot read the node list {nodelist!r}: {part!r} is not a number or a range")
        if not sep:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"cannot read the node list {nodelist!r}: the range {part!r} runs backwards")
        width = len(low) if low.startswith("0") else 0
        values.extend(str(number).zfill(width) for number in range(int(low), int(high) + 1))
    return values


_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def _expand_item(item: str, nodelist: str) -> list:
    match = _BRACKET.search(item)
    if match is None:
        if "[" in item or "]" in item:
            raise ValueError(f"cannot read the node list {nodelist!r}: unbalanced brackets in {item!r}")
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    return [head + value + rest for value in _range_values(match.group(1), nodelist)
            for rest in _expand_item(tail, nodelist)]


def expand_nodelist(nodelist: str) -> list:
    """SLURM's compact host list as host names: ``"node[01-03,07],gpu5"`` -> ``node01 node02 node03 node07 gpu5``."""
    hosts = [host for item in _split_top_level(nodelist) for host in _expand_item(item, nodelist)]
    if not hosts:
        raise ValueError(f"the node list {nodelist!r} names no host")
    return hosts


def _scontrol_hostnames(nodelist: str) -> Optional[list]:
    """``scontrol show hostnames`` when SLURM's tools are on PATH (they know every syntax); None otherwise."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        result = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                                timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    hosts = result.stdout.split()
    return hosts if result.returncode == 0 and hosts else None


def first_host(nodelist: str, hostnames: Optional[Callable[[str], Optional[list]]] = None) -> str:
    """The first host of ``nodelist`` (machine 0), from ``hostnames`` (default: ``scontrol`` when available), else
    parsed here."""
    hosts = (hostnames or _scontrol_hostnames)(nodelist) or expand_nodelist(nodelist)
    return hosts[0]
