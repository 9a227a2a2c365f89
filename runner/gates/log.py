"""A gate's output, streamed from a pipe into a log file of bounded size.

A gate may print gigabytes; its log keeps the first ``HEAD_BYTES`` and the last ``TAIL_BYTES``
with one ``[... N bytes elided ...]`` line between them, so the disk cannot fill up and the
end of the output (where the error usually is) is always there. ``OutputPump`` drains the pipe
in a thread while the gate runs, so the gate never blocks on a full pipe; it stops at end of
file or when told to, so a process that escaped the gate's group and still holds the pipe open
cannot keep the runner waiting.
"""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path

HEAD_BYTES = 1 << 20
TAIL_BYTES = 1 << 20
_READ_CHUNK = 1 << 16
_POLL_S = 0.1
_DRAIN_LIMIT_S = 1.0  # after stop(): how long to keep reading what is still in the pipe


class CappedLog:
    """A log file that keeps the first ``head_bytes`` and the last ``tail_bytes`` written.

    Thread-safe. Write errors (a full disk) are counted, never raised: a log must not take
    the runner down. ``close`` writes the elision marker and the kept tail.
    """

    def __init__(self, path: Path, *, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES) -> None:
        self.path = Path(path)
        self.head_bytes = head_bytes
        self.tail_bytes = tail_bytes
        self.total = 0
        self.write_errors = 0
        self._head_written = 0
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._file = open(self.path, "wb", buffering=0)  # noqa: SIM115 - closed in close()

    @property
    def elided(self) -> int:
        """Bytes dropped from the middle so far (the tail buffer may still shrink)."""
        after_head = self.total - self._head_written
        return max(0, after_head - min(len(self._tail), self.tail_bytes))

    def write(self, data: bytes) -> None:
        with self._lock:
            self.total += len(data)
            room = self.head_bytes - self._head_written
            if room > 0 and not self._tail:
                head, data = data[:room], data[room:]
                self._write_file(head)
                self._head_written += len(head)
            if data:
                self._tail += data
                if len(self._tail) > 2 * self.tail_bytes:
                    del self._tail[: len(self._tail) - self.tail_bytes]

    def close(self) -> None:
        with self._lock:
            if self._file.closed:
                return
            tail = bytes(self._tail[-self.tail_bytes :]) if self._tail else b""
            elided = self.total - self._head_written - len(tail)
            if elided > 0:
                self._write_file(f"\n[... {elided} bytes elided ...]\n".encode())
            self._write_file(tail)
            self._tail.clear()
            self._file.close()

    def _write_file(self, data: bytes) -> None:
        if not data:
            return
        try:
            self._file.write(data)
        except OSError:
            self.write_errors += 1


class OutputPump:
    """Copies everything read from pipe ``fd`` into ``log`` on a background thread."""

    def __init__(self, fd: int, log: CappedLog) -> None:
        self.fd = fd
        self.log = log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runner-gate-output", daemon=True)

    def start(self) -> OutputPump:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Read what is left in the pipe (briefly), then stop and close the read end."""
        self._stop.set()
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            try:
                os.close(self.fd)
            except OSError:
                pass

    def _run(self) -> None:
        drain_until: float | None = None
        while True:
            if self._stop.is_set() and drain_until is None:
                drain_until = time.monotonic() + _DRAIN_LIMIT_S
            wait = 0.0 if drain_until is not None else _POLL_S
            try:
                ready, _, _ = select.select([self.fd], [], [], wait)
            except (OSError, ValueError):
                return
            if not ready:
                if drain_until is not None:
                    return  # told to stop and nothing more is waiting
                continue
            try:
                data = os.read(self.fd, _READ_CHUNK)
            except OSError:
                return
            if not data:
                return  # every writer closed the pipe
            self.log.write(data)
            if drain_until is not None and time.monotonic() > drain_until:
                return  # something outside the group keeps writing; stop anyway
