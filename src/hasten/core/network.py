"""Network helpers for launching: free ports."""
from __future__ import annotations

import socket


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def is_port_in_use(port: int | None = None, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on ``host:port`` (default port 29500, torchrun's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((host, 29500 if port is None else int(port))) == 0


def get_free_port() -> int:
    """A TCP port that is free right now (the OS picks it)."""
    return find_free_port("")
