"""Helpers for the device-server tests: a store with tables, servers in-process or as a child."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from recflash.ndp import EmbeddingStore
from recflash.reader import Store, StoreOptions

TABLES = {"a": (5000, 32), "b": (700, 16)}


def make_store(path: str, tables=TABLES, seed: int = 0) -> dict:
    """Creates a store with random tables; returns {name: weights}."""
    rng = np.random.default_rng(seed)
    weights = {}
    with Store.open(path, StoreOptions(write_buffer_bytes=4 << 20)) as store:
        t = EmbeddingStore(store)
        for name, (rows, dim) in tables.items():
            w = rng.standard_normal((rows, dim)).astype(np.float32)
            t.create_table(name, rows, dim)
            t.load_table(name, w, progress=False)
            weights[name] = w
    return weights


def tls_cert_and_tokens(tmp_path, token_line: str) -> tuple[str, str, str]:
    """A self-signed certificate for localhost / 127.0.0.1 (the openssl command) and a 0600
    token file holding `token_line`: (cert, key, token file)."""
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    tokens = tmp_path / "tokens"
    tokens.write_text(token_line + "\n")
    tokens.chmod(0o600)
    return cert, key, str(tokens)


def socket_dir() -> str:
    """A short private directory for Unix sockets (pytest's tmp_path can pass the 107-byte limit)."""
    return tempfile.mkdtemp(prefix="rfndp")


class ServerProcess:
    """`recflash ndp serve` in a child process; the address is read from its first line."""

    def __init__(self, store: str, *args: str, env=None):
        exe = os.path.join(os.path.dirname(sys.executable), "recflash")
        cmd = [exe, "ndp", "serve", "--store", store, *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env or dict(os.environ, OMP_NUM_THREADS="1"))
        line = self.proc.stdout.readline()
        if " on " not in line:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {err}")
        self.address = line.rsplit(" on ", 1)[1].strip()

    def stop(self, sig=None, timeout: float = 60.0) -> int:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(sig or signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
