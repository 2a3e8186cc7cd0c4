"""The NDP device server and DeviceClient: equal to the in-process engine, updates, durability,
access control, bad input, faults. Every test starts and stops its own server (a Unix socket in
a fresh private directory, or a loopback port)."""

from __future__ import annotations

import filecmp
import os
import shutil
import signal
import sys
import threading
import time

import numpy as np
import pytest
import torch

from ndputil import ServerProcess, make_store, socket_dir
from recflash.ndp import EmbeddingStore, SlsEngine, SlsRequest
from recflash.ndp.client import DeviceAuthError, DeviceClient, DeviceError, DeviceUnavailableError
from recflash.ndp.server import NdpServer, ServerConfigError
from recflash.reader import Store
from recflash.reader.errors import InvalidArgumentError, SchemaError, UnknownFeatureError

TIMEOUT = 20.0


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "s")
    return path, make_store(path)


@pytest.fixture
def server(store):
    path, weights = store
    sock = socket_dir()
    srv = NdpServer(path, f"unix:{sock}/ndp.sock", threads=4).start()
    yield srv, weights
    srv.stop()
    shutil.rmtree(sock, ignore_errors=True)


@pytest.fixture
def client(server):
    srv, weights = server
    with DeviceClient(srv.address, timeout=TIMEOUT) as c:
        yield c, weights


def _bags(rng, rows, batch, max_len):
    lengths = rng.integers(0, max_len + 1, batch)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return rng.integers(0, rows, int(lengths.sum())).astype(np.int64), offsets


def _reference(w, idx, off, mode="sum", psw=None):
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(w), mode=mode)
    return bag(torch.from_numpy(idx), torch.from_numpy(off),
               per_sample_weights=None if psw is None else torch.from_numpy(psw)).numpy()


def test_generated_code_is_up_to_date(tmp_path):
    """The committed ndp_pb2*.py are what grpcio-tools makes of ndp/proto/ndp.proto."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ndp", "proto")
    sys.path.insert(0, root)
    try:
        import generate
    finally:
        sys.path.remove(root)
    for p in generate.generate(str(tmp_path)):
        assert filecmp.cmp(p, os.path.join(root, os.path.basename(p)), shallow=False), \
            f"{os.path.basename(p)} is stale: run python ndp/proto/generate.py"


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_sls_equals_in_process_engine(client, store, mode):
    c, weights = client
    rng = np.random.default_rng(1)
    ia, oa = _bags(rng, 5000, 64, 40)
    ib, ob = _bags(rng, 700, 17, 5)
    reqs = [SlsRequest("a", ia, oa, mode), SlsRequest("b", ib.astype(np.int32), ob, mode)]
    out = c.sls(reqs)
    assert all(isinstance(o, np.ndarray) and o.dtype == np.float32 for o in out)
    np.testing.assert_allclose(out[0], _reference(weights["a"], ia, oa, mode), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[1], _reference(weights["b"], ib, ob, mode), rtol=1e-5, atol=1e-5)
    assert c.last_stats["lookups"] == len(ia) + len(ib)
    with Store.open(store[0], read_only=True) as ro:  # the embedded engine on the same store
        local = SlsEngine(EmbeddingStore(ro)).sls(reqs)
    for got, want in zip(out, local):
        np.testing.assert_array_equal(got, want)
    assert c.last_stats["gather"]["device_bytes"] > 0
    # torch in, torch out; per-sample weights; include_last_offset
    psw = rng.random(len(ia)).astype(np.float32)
    off_last = np.append(oa, len(ia))
    t = c.sls([SlsRequest("a", torch.from_numpy(ia), torch.from_numpy(off_last), "sum", torch.from_numpy(psw),
                          include_last_offset=True)])[0]
    assert isinstance(t, torch.Tensor) and t.shape == (64, 32)
    np.testing.assert_allclose(t.numpy(), _reference(weights["a"], ia, oa, "sum", psw), rtol=1e-5, atol=1e-5)
    # the duck-typed embedded surface
    assert c.info("a").num_rows == 5000 and c.info("b").dim == 16
    assert set(c.tables()) == {"a", "b"}
    np.testing.assert_array_equal(c.read_rows("b", [3, 699, 3]), weights["b"][[3, 699, 3]])
    assert isinstance(c.cache_stats(), dict)


def test_update_rows_visible_and_durable_after_restart(store):
    path, weights = store
    sock = socket_dir()
    srv = ServerProcess(path, "--listen", f"unix:{sock}/ndp.sock", "--row-cache-mb", "1")
    try:
        with DeviceClient(srv.address, timeout=TIMEOUT).wait_ready(TIMEOUT) as c:
            idx = np.array([3, 17, 4999], np.int64)
            off = np.array([0], np.int64)
            before = c.sls([SlsRequest("a", idx, off)])[0]  # warms the row cache
            np.testing.assert_allclose(before[0], weights["a"][idx].sum(0), rtol=1e-5)
            assert c.update_rows("a", [17, 4999], np.full((2, 32), 2.0, np.float32)) == 2
            after = c.sls([SlsRequest("a", idx, off)])[0]
            np.testing.assert_allclose(after[0], weights["a"][3] + 4.0, rtol=1e-5)
        # kill -9 right after the acknowledgement: the update must survive
        assert srv.stop(signal.SIGKILL) == -signal.SIGKILL
        srv = ServerProcess(path, "--listen", f"unix:{sock}/ndp.sock")
        with DeviceClient(srv.address, timeout=TIMEOUT).wait_ready(TIMEOUT) as c:
            np.testing.assert_array_equal(c.read_rows("a", [17, 4999, 3])[:2], np.full((2, 32), 2.0, np.float32))
            np.testing.assert_array_equal(c.read_rows("a", [3]), weights["a"][[3]])
        assert srv.stop() == 0, "SIGTERM: graceful shutdown, exit status 0"
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
        shutil.rmtree(sock, ignore_errors=True)
    with Store.open(path) as s:  # closed cleanly: the store opens and has the update
        np.testing.assert_array_equal(EmbeddingStore(s).read_rows("a", [17]), np.full((1, 32), 2.0, np.float32))


def test_bad_input_gets_clear_errors_and_server_keeps_serving(client):
    c, weights = client
    good = [SlsRequest("a", np.array([1, 2]), np.array([0]))]
    expect = weights["a"][[1, 2]].sum(0)
    cases = [
        (UnknownFeatureError, "unknown embedding table 'nope'", lambda: c.sls([SlsRequest("nope", np.array([1]), np.array([0]))])),
        (InvalidArgumentError, "row id 5000 out of range for table 'a'", lambda: c.sls([SlsRequest("a", np.array([5000]), np.array([0]))])),
        (InvalidArgumentError, "indices must be int64 or int32, got float32",
         lambda: c.sls([SlsRequest("a", np.array([1.0], np.float32), np.array([0]))])),
        (InvalidArgumentError, "offsets decrease", lambda: c.sls([SlsRequest("a", np.array([1, 2, 3]), np.array([0, 2, 1]))])),
        (InvalidArgumentError, "indices must have 1 dimension", lambda: c.sls([SlsRequest("a", np.array([[1, 2]]), np.array([0]))])),
        (SchemaError, "rows of shape", lambda: c.update_rows("a", [1, 2], np.zeros((2, 31), np.float32))),
        (InvalidArgumentError, "out of range for table 'b'", lambda: c.read_rows("b", [700])),
        (UnknownFeatureError, "unknown model 'm'", lambda: c.forward("m", np.zeros((1, 3), np.float32), (["f"], [1], [0]))),
        (InvalidArgumentError, "mode", lambda: c.sls([SlsRequest("a", np.array([1]), np.array([0]), mode="max")])),
    ]
    for exc, match, call in cases:
        with pytest.raises(exc, match=match):
            call()
        np.testing.assert_allclose(c.sls(good)[0][0], expect, rtol=1e-5)
    # a message whose bytes do not match its shape (hand-built)
    from recflash.ndp.proto import ndp_pb2 as pb
    bad = pb.SlsRequest(bags=[pb.Bags(table="a", indices=pb.Tensor(dtype=pb.INT64, shape=[3], data=b"\0" * 8),
                                      offsets=pb.Tensor(dtype=pb.INT64, shape=[1], data=b"\0" * 8))])
    with pytest.raises(InvalidArgumentError, match=r"shape \[3\] of int64 needs 24 bytes, got 8"):
        c._call("Sls", bad)
    np.testing.assert_allclose(c.sls(good)[0][0], expect, rtol=1e-5)
    st = c.stats()["traffic"]["Sls"]
    assert st["errors"] >= 6 and st["calls"] > st["errors"]


def test_message_over_size_limit(store):
    path, _ = store
    sock = socket_dir()
    with NdpServer(path, f"unix:{sock}/ndp.sock", max_message_bytes=1 << 20) as srv:
        with DeviceClient(srv.address, timeout=TIMEOUT) as c:
            big = np.zeros(200_000, np.int64)  # 1.6 MB of ids
            with pytest.raises(DeviceError, match="over the size limit"):
                c.sls([SlsRequest("a", big, np.array([0]))])
            with pytest.raises(DeviceError, match="over the size limit"):  # a response too large
                c.read_rows("a", np.zeros(10_000, np.int64))
            assert c.sls([SlsRequest("a", np.array([4]), np.array([0]))])[0].shape == (1, 32)
    shutil.rmtree(sock, ignore_errors=True)


def test_unix_socket_is_private(store, monkeypatch):
    path, _ = store
    base = socket_dir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", base)
    with NdpServer(path) as srv:  # the default address
        sock = srv.address[len("unix:"):]
        assert os.path.dirname(os.path.dirname(sock)) == base
        assert os.stat(os.path.dirname(sock)).st_mode & 0o777 == 0o700
        assert os.stat(sock).st_mode & 0o777 == 0o600
        with DeviceClient(srv.address, timeout=TIMEOUT) as c:
            assert c.stats()["protocol"] == "recflash.ndp.v1"
    assert not os.path.exists(sock)
    os.chmod(os.path.dirname(sock), 0o755)  # a directory others can enter is refused
    with pytest.raises(ServerConfigError, match="mode 700"):
        NdpServer(path)
    shutil.rmtree(base, ignore_errors=True)


def _token_file(tmp_path, mode=0o600):
    p = tmp_path / "tokens"
    p.write_text("# role token\nread rrrrrrrrrrrrrrrrrrrr\nwrite wwwwwwwwwwwwwwwwwwww\n")
    os.chmod(p, mode)
    return str(p)


def test_tcp_token_roles(store, tmp_path):
    path, weights = store
    with pytest.raises(ServerConfigError, match="needs --token-file"):
        NdpServer(path, "127.0.0.1:0")
    with pytest.raises(ServerConfigError, match="accessible by group or others"):
        NdpServer(path, "127.0.0.1:0", token_file=_token_file(tmp_path, 0o644))
    with NdpServer(path, "127.0.0.1:0", token_file=_token_file(tmp_path)) as srv:
        assert srv.address.startswith("127.0.0.1:")
        req = [SlsRequest("b", np.array([5]), np.array([0]))]
        for token in (None, "x" * 20):
            with DeviceClient(srv.address, token, timeout=TIMEOUT) as c:
                with pytest.raises(DeviceAuthError, match="UNAUTHENTICATED"):
                    c.sls(req)
        with DeviceClient(srv.address, "r" * 20, timeout=TIMEOUT) as c:
            np.testing.assert_allclose(c.sls(req)[0][0], weights["b"][5], rtol=1e-6)
            with pytest.raises(DeviceAuthError, match="PERMISSION_DENIED.*needs a 'write' token"):
                c.update_rows("b", [5], np.zeros((1, 16), np.float32))
        with DeviceClient(srv.address, "w" * 20, timeout=TIMEOUT) as c:
            c.update_rows("b", [5], np.ones((1, 16), np.float32))
            np.testing.assert_allclose(c.sls(req)[0][0], np.ones(16), rtol=1e-6)


def test_client_deadline_when_server_is_killed(store):
    path, _ = store
    sock = socket_dir()
    srv = ServerProcess(path, "--listen", f"unix:{sock}/ndp.sock")
    try:
        c = DeviceClient(srv.address, timeout=5.0).wait_ready(TIMEOUT)
        assert c.read_rows("a", [1]).shape == (1, 32)
        srv.proc.send_signal(signal.SIGSTOP)  # hangs: the call must end at its deadline
        t0 = time.monotonic()
        with pytest.raises(DeviceUnavailableError, match="DEADLINE_EXCEEDED"):
            c.read_rows("a", [1])
        assert time.monotonic() - t0 < 5.0 + 3.0
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(TIMEOUT)
        t0 = time.monotonic()
        with pytest.raises(DeviceUnavailableError):
            c.read_rows("a", [1])
        fut = c.submit_sls([SlsRequest("a", np.array([1]), np.array([0]))])
        with pytest.raises(DeviceUnavailableError):
            fut.result(timeout=10)
        assert time.monotonic() - t0 < 5.0 + 3.0
        c.close()
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
        shutil.rmtree(sock, ignore_errors=True)


def test_concurrent_clients_and_pipelined_submits(server):
    srv, weights = server
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            with DeviceClient(srv.address, timeout=TIMEOUT) as c:
                pending = []
                for _ in range(10):
                    idx, off = _bags(rng, 5000, 16, 10)
                    pending.append((c.submit_sls([SlsRequest("a", idx, off)]), idx, off))
                for fut, idx, off in pending:
                    np.testing.assert_allclose(fut.result()[0], _reference(weights["a"], idx, off), rtol=1e-5, atol=1e-5)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    st = srv.traffic.snapshot()["Sls"]
    assert st["calls"] == 60 and st["errors"] == 0 and st["bytes_to_host"] >= 60 * 16 * 32 * 4


def test_client_disconnect_mid_request_does_not_disturb_server(server):
    srv, weights = server
    rng = np.random.default_rng(5)
    for _ in range(5):
        c = DeviceClient(srv.address, timeout=TIMEOUT)
        idx, off = _bags(rng, 5000, 256, 60)
        fut = c.submit_sls([SlsRequest("a", idx, off)])
        c.close()  # goes away with the request in flight
        with pytest.raises(Exception):
            fut.result(timeout=TIMEOUT)
    with DeviceClient(srv.address, timeout=TIMEOUT) as c:
        idx, off = _bags(rng, 5000, 8, 5)
        np.testing.assert_allclose(c.sls([SlsRequest("a", idx, off)])[0], _reference(weights["a"], idx, off),
                                   rtol=1e-5, atol=1e-5)


def test_sigterm_lets_in_flight_requests_finish_and_status_command(store):
    path, weights = store
    sock = socket_dir()
    srv = ServerProcess(path, "--listen", f"unix:{sock}/ndp.sock")
    try:
        exe = os.path.join(os.path.dirname(sys.executable), "recflash")
        import json
        import subprocess

        with DeviceClient(srv.address, timeout=TIMEOUT).wait_ready(TIMEOUT) as c:
            c.read_rows("a", [0])
            out = subprocess.run([exe, "ndp", "status", srv.address, "--json"], capture_output=True, text=True,
                                 timeout=120)
            assert out.returncode == 0, out.stderr
            st = json.loads(out.stdout)
            assert st["protocol"] == "recflash.ndp.v1" and st["tables"]["a"]["num_rows"] == 5000
            assert st["traffic"]["ReadRows"]["calls"] == 1 and st["traffic"]["ReadRows"]["bytes_to_host"] > 128
            rng = np.random.default_rng(9)
            batches = [_bags(rng, 5000, 256, 64) for _ in range(40)]
            futs = [c.submit_sls([SlsRequest("a", i, o)]) for i, o in batches]
            # SIGTERM only once the server holds a request: sent earlier, every request may still be on
            # its way and rightly refused, which says nothing about in-flight requests finishing.
            deadline = time.monotonic() + TIMEOUT
            while True:
                st = c.stats()
                if st["in_flight"] >= 1 or st["traffic"].get("Sls", {}).get("calls", 0) >= 1:
                    break
                assert time.monotonic() < deadline, "no Sls request reached the server"
                time.sleep(0.001)
            srv.proc.send_signal(signal.SIGTERM)
            answered = 0
            for f, (i, o) in zip(futs, batches):
                try:
                    got = f.result(timeout=TIMEOUT)
                except DeviceUnavailableError:  # arrived after the server stopped taking requests
                    continue
                np.testing.assert_allclose(got[0], _reference(weights["a"], i, o), rtol=1e-5, atol=1e-4)
                answered += 1
            assert answered >= 1
        assert srv.proc.wait(TIMEOUT) == 0
        assert "store closed" in srv.proc.stderr.read()
        bad = subprocess.run([exe, "ndp", "status", srv.address, "--timeout", "3"], capture_output=True, text=True,
                             timeout=120)
        assert bad.returncode != 0 and "UNAVAILABLE" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
        shutil.rmtree(sock, ignore_errors=True)
