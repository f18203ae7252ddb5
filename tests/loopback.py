"""Free TCP ports on 127.0.0.1, for clusters of processes that reach each other over loopback."""

import socket


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nothing listens on now (bound once to let the kernel choose, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports
