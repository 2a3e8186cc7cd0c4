"""Bytes crossing the host <-> device boundary, per command (RM-SSD Table IV, measured).

Both ends of the device protocol keep a :class:`Traffic`: the server counts what it received
and sent, the client what it sent and received. A byte count is the serialized size of the
protobuf message (its payload: tensors as raw bytes plus field tags), which is exactly what
the gRPC message carries; HTTP/2 frame and header bytes are not included.
"""

from __future__ import annotations

import threading
from typing import Dict

FIELDS = ("calls", "errors", "bytes_to_device", "bytes_to_host", "seconds")


class Traffic:
    """Thread-safe per-command counters: calls, errors, bytes each way, seconds."""

    def __init__(self):
        self._lock = threading.Lock()
        self._c: Dict[str, list] = {}

    def add(self, command: str, to_device: int, to_host: int, seconds: float = 0.0, error: bool = False) -> None:
        with self._lock:
            c = self._c.setdefault(command, [0, 0, 0, 0, 0.0])
            c[0] += 1
            c[1] += int(error)
            c[2] += int(to_device)
            c[3] += int(to_host)
            c[4] += float(seconds)

    def snapshot(self) -> Dict[str, dict]:
        """{command: {calls, errors, bytes_to_device, bytes_to_host, seconds}}."""
        with self._lock:
            return {k: dict(zip(FIELDS, v)) for k, v in sorted(self._c.items())}

    def reset(self) -> None:
        with self._lock:
            self._c.clear()

    @staticmethod
    def total(snapshot: Dict[str, dict]) -> dict:
        out = dict.fromkeys(FIELDS, 0)
        for v in snapshot.values():
            for f in FIELDS:
                out[f] += v[f]
        return out
