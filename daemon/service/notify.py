"""systemd's sd_notify protocol, spoken directly (it is one datagram).

Written here rather than taken from a library: the protocol is a few lines, and the
maintained Python packages either pull in C bindings to libsystemd or have been
unmaintained for years. With no NOTIFY_SOCKET (not under systemd) every call is a no-op.
"""

from __future__ import annotations

import contextlib
import os
import socket


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        addr = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        # Abstract-namespace sockets are written with a leading '@'.
        self.address = "\0" + addr[1:] if addr.startswith("@") else addr
        self.sock: socket.socket | None = None
        if self.address:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        # Ping twice per watchdog period, as sd_watchdog_enabled(3) recommends.
        self.watchdog_interval: float | None = None
        if usec.isdigit() and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6 / 2
        self._last_ping = float("-inf")

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def send(self, **fields: str | int) -> None:
        if self.sock is None:
            return
        # One field per line: a newline inside a value would smuggle in another field.
        msg = "\n".join(
            f"{k.upper()}={str(v).replace(chr(10), ' ').replace(chr(13), ' ')}"
            for k, v in fields.items()
        )
        # systemd may be restarting; a lost notification must never take the daemon down.
        with contextlib.suppress(OSError):
            self.sock.sendto(msg.encode("utf-8", "replace"), self.address)

    def ready(self, status: str) -> None:
        self.send(ready=1, status=status, mainpid=os.getpid())

    def status(self, status: str) -> None:
        self.send(status=status)

    def stopping(self) -> None:
        self.send(stopping=1)

    def reloading(self) -> None:
        self.send(reloading=1)

    def watchdog(self, now: float) -> None:
        if self.watchdog_interval is None or now - self._last_ping < self.watchdog_interval:
            return
        self._last_ping = now
        self.send(watchdog=1)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
