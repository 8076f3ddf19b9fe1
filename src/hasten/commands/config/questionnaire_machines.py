"""``hasten config``'s questions about the machines: how many, which one this is, where machine 0 listens,
and how many processes the job runs in total."""
from __future__ import annotations

import ipaddress
import re

from .questions import ask_bool, ask_choice, ask_int, ask_text

__all__ = ["ask_machines", "ask_num_processes", "RDZV_BACKENDS"]

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*$")


def _address(text: str) -> str:
    """An IPv4/IPv6 address or a host name that every machine can reach."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if not _HOSTNAME.match(text):
        raise ValueError(f"{text!r} is neither an IP address (e.g. 10.0.0.1) nor a host name (e.g. node-0).")
    return text


def ask_machines(config: dict) -> None:
    """``num_machines`` and, with several, ``machine_rank``, ``main_process_ip`` / ``_port``, ``same_network``
    and ``rdzv_backend`` into ``config``."""
    machines = ask_int("How many machines will you use (more than 1 for multi-node training)?", 1, minimum=1)
    config["num_machines"] = machines
    if machines == 1:
        return
    config["machine_rank"] = ask_int(f"What is the rank of this machine (0 for the main one, up to {machines - 1})?",
                                     0, minimum=0, maximum=machines - 1)
    config["main_process_ip"] = ask_text("What is the IP address (or host name) of the machine of rank 0?",
                                         check=_address)
    config["main_process_port"] = ask_int("Which port of that machine will the processes meet on?", 29500,
                                          minimum=1, maximum=65535)
    config["same_network"] = ask_bool("Are all the machines on the same local network?", default=True)
    if not config["same_network"]:
        config["rdzv_backend"] = ask_choice(
            "Which rendezvous backend will the machines use to find each other?",
            [("static (fixed ranks, machine 0 hosts the store)", "static"),
             ("c10d (torchrun's elastic rendezvous)", "c10d"), ("etcd", "etcd"), ("etcd-v2", "etcd-v2")])


def ask_num_processes(config: dict, what: str) -> int:
    """The total number of processes over all machines (a multiple of ``num_machines``); ``what`` names them
    (``GPUs``, ``processes``)."""
    machines = config.get("num_machines", 1)

    def divisible(value: int) -> None:
        if value % machines:
            raise ValueError(f"{value} cannot be split evenly over {machines} machines: give a multiple of "
                             f"{machines} (each machine runs the same number of processes).")

    minimum = 2 if machines == 1 else machines  # "multi": more than one process
    return ask_int(f"How many {what} in total (over all machines) should train, one process each?", 2 * machines,
                   minimum=minimum, check=divisible)
