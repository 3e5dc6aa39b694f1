"""A program run in its own session with a deadline, and its whole group killed past it.

A child started in a new session leads a process group of its own: whatever it starts
(LibreOffice's splash starting the office, a hook's script starting curl) belongs to that
group unless it leaves it on purpose, so killing the group on a deadline or on a stop
kills all of it, not just the program named. Its output (stdout and stderr together) is
read in a thread, as much as the caller keeps, and its stdin fed in a thread: neither a
chatty child nor one that does not read can block the caller past the deadline.

Used by the command hooks (daemon/service/hooks.py) and the LibreOffice conversion
(daemon/input/office.py). Standard library only: the daemon process runs hooks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import IO

# How long a killed group's leader is waited for, so that it does not stay a zombie.
REAP_SECONDS = 5.0


class SessionChild:
    """`argv` started in a session of its own (raises OSError when it cannot start).

    `stdin`: written to it from a thread and then closed (None: it reads /dev/null).
    `keep`: how many bytes of its output are kept (None: all); the rest is counted.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        stdin: bytes | None = None,
        keep: int | None = None,
    ) -> None:
        self.proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,  # its own process group, killed whole
            close_fds=True,
        )
        self._kept = bytearray()
        self._dropped = 0
        self._keep = keep
        assert self.proc.stdout is not None
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        ]
        if stdin is not None:
            assert self.proc.stdin is not None
            self._threads.append(
                threading.Thread(target=_write_all, args=(self.proc.stdin, stdin), daemon=True)
            )
        for thread in self._threads:
            thread.start()

    def wait(self, timeout: float) -> int | None:
        """Its exit status (negative: the signal that ended it), or None when it was
        still running after `timeout` seconds: then its whole group has been killed."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """Kill its whole process group now; safe from another thread and once it is gone."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(REAP_SECONDS)

    def output(self, grace: float | None) -> tuple[bytes, int]:
        """What it wrote (the bytes kept, and how many more were not), once its output
        has ended or after `grace` seconds (None: however long it takes): a child it left
        running may hold the pipe open after it exited."""
        for thread in self._threads:
            thread.join(grace)
        return bytes(self._kept), self._dropped

    def _read(self, stream: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := stream.read1(65536):  # type: ignore[attr-defined]
                room = len(chunk) if self._keep is None else self._keep - len(self._kept)
                self._kept.extend(chunk[:room])
                self._dropped += max(0, len(chunk) - room)


def _write_all(stream: IO[bytes], data: bytes) -> None:
    # A child that does not read its stdin closes it: that is its business.
    with contextlib.suppress(OSError, ValueError):
        stream.write(data)
        stream.close()
