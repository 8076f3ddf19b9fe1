"""The rendezvous store of a one-machine job, listening on the loopback address only.

torchrun's static rendezvous starts a ``TCPStore`` server that listens on every interface (``::``), whatever
``--master_addr`` says: anyone who can reach the machine could read and write the job's keys. ``TCPStore``
accepts an already listening socket (``master_listen_fd``), so for a one-machine job hasten binds that
socket to the loopback address itself and hands it over. The rest is torchrun's static rendezvous,
registered under its own backend name so torch's registry keeps its ``static`` entry.
"""
from __future__ import annotations

import argparse
import functools
import ipaddress
import socket
from datetime import timedelta

__all__ = ["LOOPBACK_BACKEND", "is_loopback", "listening_socket", "loopback_backend", "launch_with_loopback_store"]

LOOPBACK_BACKEND = "hasten-static-loopback"


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP or a host name) is this machine's loopback address."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def listening_socket(address: str, port: int) -> socket.socket:
    """A TCP socket listening on ``address:port`` only."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", port) if address == "localhost"
                  else (address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def _store(address: str, port: int, world_size: int, timeout: timedelta):
    """The store's server, on a socket bound to ``address`` (the store takes the socket over)."""
    from torch.distributed import TCPStore

    sock = listening_socket(address, port)
    try:
        store = TCPStore(address, port, world_size, True, timeout, multi_tenant=True,
                         master_listen_fd=sock.fileno(), use_libuv=True)
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the file descriptor now
    return store


@functools.lru_cache(maxsize=None)
def _handler_class():
    from torch.distributed import PrefixStore
    from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    class LoopbackStaticRendezvous(StaticTCPRendezvous):
        """torchrun's static rendezvous of one machine, with its store's server on the loopback address."""

        def get_backend(self) -> str:
            return LOOPBACK_BACKEND

        def next_rendezvous(self):
            if self._store is None:
                self._store = _store(self.master_addr, self.master_port, self.world_size, self.timeout)
            return RendezvousInfo(PrefixStore(self.run_id, self._store), self.rank, self.world_size,
                                  RendezvousStoreInfo(self.master_addr, self.master_port))

    return LoopbackStaticRendezvous


def _create_handler(params):
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import create_rdzv_handler

    static = create_rdzv_handler(params)  # torch's own checks of the rank, the endpoint and the timeout
    if static.world_size != 1 or static.rank != 0 or not is_loopback(static.master_addr):
        raise ValueError(f"the {LOOPBACK_BACKEND} rendezvous is for one machine on a loopback address, "
                         f"got {static.master_addr}:{static.master_port} with {static.world_size} machine(s)")
    return _handler_class()(static.master_addr, static.master_port, static.rank, static.world_size,
                            static.run_id, int(static.timeout.total_seconds()))


def loopback_backend() -> str:
    """Register the loopback static rendezvous with torch (again: a no-op) and return its backend name."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(LOOPBACK_BACKEND, _create_handler)
    return LOOPBACK_BACKEND


def launch_with_loopback_store(parsed: argparse.Namespace) -> None:
    """What ``torch.distributed.run.run(parsed)`` does for a static one-machine job, with the loopback store."""
    from torch.distributed import run as torchrun
    from torch.distributed.launcher.api import elastic_launch

    config, entrypoint, arguments = torchrun.config_from_args(parsed)
    config.rdzv_backend = loopback_backend()
    elastic_launch(config=config, entrypoint=entrypoint)(*arguments)
