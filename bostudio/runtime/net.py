"""Local addresses and ports: is an address loopback, is a port free to bind, a free loopback port."""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Collection

from bostudio.errors import ConfigError, PortInUseError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def free_loopback_port(avoid: Collection[int] = ()) -> int:
    """A port on 127.0.0.1 that nothing listens on now (the OS picks it), and none of `avoid`: ports already
    handed to servers that may not have bound them yet, which the OS can pick again (a bench restart's
    fifth server was once given the first's port before that one had bound it)."""
    while (port := _os_pick()) in avoid:
        pass
    return port


def _os_pick() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUseError/ConfigError, with what to do, when `host:port` cannot be bound."""
    if not 0 < port < 65536:
        raise ConfigError(f"port {port} is out of range", "use a port between 1 and 65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(f"port {port} on {host} is already in use",
                                     "stop what is using it, or pick another port with --port P") from exc
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):
                raise ConfigError(f"cannot bind {host}: no such local address",
                                  "use --host 127.0.0.1 (default) or an address of this machine") from exc
            if exc.errno == errno.EACCES:
                raise PortInUseError(f"not allowed to bind port {port}", "use a port above 1024") from exc
            raise
