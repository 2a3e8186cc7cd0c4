"""Bad input and operational edges of the NDP device server and engine: a live server's socket
is never taken over (a stale one is reused), weighted KeyedJaggedTensors through Forward, ids
that are not integers, the automatic hot-row profile, ``ndp status --tls-ca``, option and
address messages, the inference example's bad input. Every server is started and stopped by
its own test (Unix sockets in fresh private directories, or loopback)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ndputil import ServerProcess, make_store, socket_dir, tls_cert_and_tokens
from recflash.ndp import EmbeddingStore, SlsEngine, SlsRequest
from recflash.ndp.client import DeviceClient
from recflash.ndp.server import NdpServer, ServerConfigError
from recflash.reader import Store
from recflash.reader.errors import InvalidArgumentError

TIMEOUT = 20.0
REPO = Path(__file__).resolve().parents[1]
RECFLASH = os.path.join(os.path.dirname(sys.executable), "recflash")
ENV = dict(os.environ, OMP_NUM_THREADS="1")


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "s")
    return path, make_store(path, {"user": (100, 8), "item": (50, 4)})


@pytest.fixture
def sock():
    d = socket_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run(*args, timeout=60):
    return subprocess.run([RECFLASH, *args], capture_output=True, text=True, timeout=timeout, env=ENV)


# ---------------------------------------------------------------------------------------
# 1. the Unix socket of a live server


def test_second_server_refuses_a_live_socket_and_reuses_a_stale_one(tmp_path, store, sock):
    path_a, weights = store
    path_b = str(tmp_path / "b")
    make_store(path_b, {"other": (10, 4)})
    a = ServerProcess(path_a)
    try:
        s = a.address[len("unix:"):]
        r = _run("ndp", "serve", "--store", path_b, "--listen", a.address)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"socket {s} is in use by a running server" in r.stderr
        assert "Traceback" not in r.stderr
        with DeviceClient(a.address, timeout=TIMEOUT) as c:  # A still owns it
            assert set(c.stats()["tables"]) == {"user", "item"}
        # in-process too
        with pytest.raises(ServerConfigError, match="in use by a running server"):
            NdpServer(path_b, a.address)
    finally:
        assert a.stop() == 0
    assert not os.path.exists(a.address[len("unix:"):])

    # a stale socket (its server was killed with SIGKILL) is removed and reused
    a = ServerProcess(path_a, "--listen", f"unix:{sock}/s.sock")
    a.stop(signal.SIGKILL)
    assert os.path.exists(f"{sock}/s.sock")
    srv = NdpServer(path_b, f"unix:{sock}/s.sock").start()
    try:
        with DeviceClient(srv.address, timeout=TIMEOUT) as c:
            assert set(c.stats()["tables"]) == {"other"}
    finally:
        srv.stop()
    assert not os.path.exists(f"{sock}/s.sock")


def test_stop_leaves_a_socket_it_did_not_create(store, sock):
    path, _ = store
    s = f"{sock}/s.sock"
    srv = NdpServer(path, f"unix:{s}").start()
    # the path is replaced behind the server's back (an operator, another server)
    os.unlink(s)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(s)
    other.listen(1)
    try:
        srv.stop()
        assert os.path.exists(s), "stop() deleted a socket another process owns"
    finally:
        other.close()


@pytest.mark.parametrize("case", ["missing dir", "regular file", "directory"])
def test_unusable_socket_paths_are_named(store, sock, case):
    path, _ = store
    if case == "missing dir":
        target, want = f"{sock}/nodir/s.sock", f"directory '{sock}/nodir' does not exist"
    elif case == "regular file":
        target, want = f"{sock}/file", "exists and is a regular file"
        Path(target).write_text("keep me")
    else:
        target, want = f"{sock}/d", "exists and is a directory"
        os.mkdir(target)
    with pytest.raises(ServerConfigError, match=want):
        NdpServer(path, f"unix:{target}")
    r = _run("ndp", "serve", "--store", path, "--listen", f"unix:{target}")
    assert r.returncode == 2 and want in " ".join(r.stderr.split()), r.stderr
    assert "GRPC_VERBOSITY" not in r.stderr
    if case == "regular file":
        assert Path(target).read_text() == "keep me"


# ---------------------------------------------------------------------------------------
# 2. weighted KeyedJaggedTensors through Forward


def _dlrm(weighted: bool, pooling=None):
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    torch.manual_seed(0)
    p = pooling or PoolingType.SUM
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="user", embedding_dim=8, num_embeddings=100,
                                                            feature_names=["u"], pooling=p),
                                         EmbeddingBagConfig(name="item", embedding_dim=8, num_embeddings=50,
                                                            feature_names=["i", "h"], pooling=p)],
                                 is_weighted=weighted)
    with torch.no_grad():
        for prm in ebc.parameters():
            prm.uniform_(-1, 1)
    return DLRM(embedding_bag_collection=ebc, dense_in_features=5, dense_arch_layer_sizes=[16, 8],
                over_arch_layer_sizes=[8, 1]).eval()


def _serve_model(tmp_path, model):
    path = str(tmp_path / "m")
    with Store.open(path) as s:
        t = EmbeddingStore(s)
        for name, w in (("user", 100), ("item", 50)):
            t.create_table(name, w, 8)
            t.load_table(name, model.sparse_arch.embedding_bag_collection.embedding_bags[name].weight.detach(),
                         progress=False)
    return path


def _kjt(rng, B, weighted):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys, rows = ["u", "i", "h"], {"u": 100, "i": 50, "h": 50}
    lengths = rng.integers(0, 5, (3, B))
    values = np.concatenate([rng.integers(0, rows[k], int(lengths[j].sum())) for j, k in enumerate(keys)])
    weights = torch.from_numpy(rng.random(values.size).astype(np.float32) * 3) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.from_numpy(values.astype(np.int64)),
                                               lengths=torch.from_numpy(lengths.reshape(-1)), weights=weights)


def test_weighted_model_forward_equals_local_model(tmp_path, sock):
    model = _dlrm(weighted=True)
    path = _serve_model(tmp_path, model)
    rng = np.random.default_rng(5)
    with NdpServer(path, f"unix:{sock}/s.sock") as srv, DeviceClient(srv.address, timeout=TIMEOUT) as c:
        info = c.load_model("w", model)
        assert info["config"]["is_weighted"] is True
        for B in (1, 7, 32):
            dense = torch.from_numpy(rng.standard_normal((B, 5)).astype(np.float32))
            kjt = _kjt(rng, B, weighted=True)
            with torch.no_grad():
                want = model(dense, kjt)
            torch.testing.assert_close(c.forward("w", dense, kjt), want, rtol=1e-5, atol=1e-5)
            # a weighted model refuses a KJT without weights (torchrec would fail too)
            unweighted = (kjt.keys(), kjt.lengths(), kjt.values())
            with pytest.raises(InvalidArgumentError, match="weighted .*needs weights; it has none"):
                c.forward("w", dense, unweighted)
            # and the tuple form carries weights too
            tup = (kjt.keys(), kjt.lengths(), kjt.values(), kjt.weights())
            torch.testing.assert_close(c.forward("w", dense, tup), want, rtol=1e-5, atol=1e-5)
        bad = (["u", "i", "h"], np.array([1, 0, 0]), np.array([3]), np.array([1.0, 2.0], np.float32))
        with pytest.raises(Exception, match="weights has 2 entries for 1 values"):
            c.forward("w", torch.zeros(1, 5), bad)

        # an unweighted model ignores a KJT's weights, as torchrec's EBC does
        plain = _dlrm(weighted=False)
        c.load_model("p", plain)
        dense = torch.from_numpy(rng.standard_normal((4, 5)).astype(np.float32))
        kjt = _kjt(rng, 4, weighted=True)
        with torch.no_grad():
            torch.testing.assert_close(c.forward("p", dense, kjt), plain(dense, kjt), rtol=1e-5, atol=1e-5)


def test_weighted_model_with_mean_pooling_is_refused(tmp_path, sock):
    from torchrec.modules.embedding_configs import PoolingType

    model = _dlrm(weighted=True, pooling=PoolingType.MEAN)
    path = _serve_model(tmp_path, model)
    with NdpServer(path, f"unix:{sock}/s.sock") as srv, DeviceClient(srv.address, timeout=TIMEOUT) as c:
        with pytest.raises(InvalidArgumentError, match="pools by mean, but the model is weighted"):
            c.load_model("w", model)


# ---------------------------------------------------------------------------------------
# 3. ids must be integers, everywhere


def test_engine_and_row_calls_refuse_non_integer_ids(store):
    path, weights = store
    with Store.open(path) as s:
        es = EmbeddingStore(s)
        eng = SlsEngine(es)
        cases = [
            ("indices must be int64 or int32, got float64", np.array([1.7, 2.9]), np.array([0])),
            ("indices must be int64 or int32, got float32", torch.tensor([1.9]), torch.tensor([0])),
            ("indices must be int64 or int32, got bool", np.array([True, False]), np.array([0])),
            ("offsets must be int64 or int32, got float64", np.array([1, 2]), np.array([0.0])),
            ("offsets must have 1 dimension", np.array([1, 2]), np.array([[0]])),
            ("indices must have 1 dimension", np.array([[1, 2]]), np.array([0])),
        ]
        for match, idx, off in cases:
            with pytest.raises(InvalidArgumentError, match=f"sls on table 'user': {match}"):
                eng.sls([SlsRequest("user", idx, off)])
            with pytest.raises(InvalidArgumentError, match=f"table 'user': {match}"):
                eng.profile([SlsRequest("user", idx, off)])
        rows = np.zeros((1, 8), np.float32)
        for bad in (torch.tensor([1.9]), np.array([1.0]), np.array([True])):
            with pytest.raises(InvalidArgumentError, match="table 'user': ids must be int64 or int32"):
                es.update_rows("user", bad, rows)
            with pytest.raises(InvalidArgumentError, match="table 'user': ids must be int64 or int32"):
                es.read_rows("user", bad)
        np.testing.assert_array_equal(es.read_rows("user", [1]), weights["user"][[1]])  # row 1 untouched
        # what stays accepted: int32, uint8, lists, empty lists, torch ints
        want = weights["user"][[1, 2]].sum(0)
        for idx in (np.array([1, 2], np.int32), np.array([1, 2], np.uint8), [1, 2], torch.tensor([1, 2])):
            np.testing.assert_allclose(np.asarray(eng.sls([SlsRequest("user", idx, [0])])[0][0]), want, rtol=1e-6)
        assert eng.sls([SlsRequest("user", [], [0])])[0].shape == (1, 8)
        assert es.read_rows("user", []).shape == (0, 8)


def test_torchrec_backend_update_rows_refuses_float_ids(store):
    from recflash.torchrec_ext.backend import EmbeddedBackend

    path, weights = store
    b = EmbeddedBackend(path, writable=True, sls_options={})
    try:
        with pytest.raises(InvalidArgumentError, match="table 'user': ids must be int64 or int32, got float32"):
            b.update_rows("user", torch.tensor([1.9]), torch.zeros(1, 8))
        np.testing.assert_array_equal(b.read_rows("user", [1]), weights["user"][[1]])
    finally:
        b.close()


def test_client_refuses_non_integer_ids_and_names_the_table(store, sock):
    path, weights = store
    with NdpServer(path, f"unix:{sock}/s.sock") as srv, DeviceClient(srv.address, timeout=TIMEOUT) as c:
        with pytest.raises(InvalidArgumentError, match="table 'user': indices must be int64 or int32, got float64"):
            c.sls([SlsRequest("user", np.array([1.7, 2.9]), np.array([0]))])
        with pytest.raises(InvalidArgumentError, match="table 'user': indices must be int64 or int32, got bool"):
            c.sls([SlsRequest("user", np.array([True]), np.array([0]))])
        with pytest.raises(InvalidArgumentError, match="table 'user': ids must be int64 or int32, got float32"):
            c.update_rows("user", torch.tensor([1.9]), np.zeros((1, 8), np.float32))
        with pytest.raises(InvalidArgumentError, match="lengths must be int64 or int32, got float64"):
            c.forward("m", np.zeros((1, 5), np.float32), (["u"], np.array([1.0]), np.array([1])))
        np.testing.assert_array_equal(c.read_rows("user", [1]), weights["user"][[1]])


# ---------------------------------------------------------------------------------------
# 7. messages: offsets past the end, table names, uint64 ids as given


def test_messages_say_what_is_wrong_in_the_users_terms(store, sock):
    path, _ = store
    big = np.array([2 ** 63 + 5], np.uint64)
    with Store.open(path) as s:
        eng = SlsEngine(EmbeddingStore(s))
        with pytest.raises(InvalidArgumentError, match=r"^sls on table 'user': offset 5 \(bag 1\) is past the end "
                                                       r"of the 3 indices$"):
            eng.sls([SlsRequest("user", [1, 2, 3], [0, 5])])
        with pytest.raises(InvalidArgumentError, match=r"offsets decrease at bag 1 \(2 then 1\)"):
            eng.sls([SlsRequest("user", [1, 2, 3], [0, 2, 1])])
        with pytest.raises(InvalidArgumentError, match="the last offset is 2 but there are 3 indices"):
            eng.sls([SlsRequest("user", [1, 2, 3], [0, 2], include_last_offset=True)])
        with pytest.raises(InvalidArgumentError, match="offsets must start at 0, got 1"):
            eng.sls([SlsRequest("user", [1, 2, 3], [1])])
        with pytest.raises(InvalidArgumentError, match="row id 9223372036854775813 out of range for table 'user'"):
            eng.sls([SlsRequest("user", big, [0])])
        with pytest.raises(InvalidArgumentError, match="row id 9223372036854775813 out of range for table 'user'"):
            EmbeddingStore(s).read_rows("user", big)
    with NdpServer(path, f"unix:{sock}/s.sock") as srv, DeviceClient(srv.address, timeout=TIMEOUT) as c:
        for req, match in (([1, 2, 3], [0, 5]), "offset 5 (bag 1) is past the end of the 3 indices"), \
                          ((big, [0]), "row id 9223372036854775813 out of range"):
            with pytest.raises(InvalidArgumentError) as ei:
                c.sls([SlsRequest("user", *req)])
            assert match in str(ei.value) and "emb/" not in str(ei.value), str(ei.value)


def test_engine_errors_name_the_table_not_the_feature(store):
    from recflash.ndp.embedding import public_error
    from recflash.reader.errors import CorruptionError

    e = public_error(CorruptionError("sls on table 'emb/user': block checksum mismatch in feature 'emb/user'"))
    assert isinstance(e, CorruptionError) and str(e) == "sls on table 'user': block checksum mismatch in feature 'user'"


# ---------------------------------------------------------------------------------------
# 4. the hot-row partition fills itself from the lookups served


def test_hot_rows_fill_from_served_lookups(store, sock):
    path, weights = store
    w = weights["user"].copy()
    rng = np.random.default_rng(2)
    with Store.open(path) as s:
        es = EmbeddingStore(s)
        eng = SlsEngine(es, hot_rows_bytes=20 * (8 * 4 + 32), hot_rows_profile_ids=200)
        hot = np.arange(10)
        for _ in range(6):  # 6 x 64 ids: the profile happens in the 4th call
            idx = np.where(rng.random(64) < 0.8, rng.choice(hot, 64), rng.integers(0, 100, 64))
            out = eng.sls([SlsRequest("user", idx, np.arange(0, 64, 8))])[0]
            want = w[idx].reshape(8, 8, 8).sum(1)
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        hs = eng.cache_stats()["hot_rows"]
        assert 0 < hs["bytes"] <= hs["budget_bytes"] and hs["hits"] > 0, hs
        # updates of hot rows stay coherent
        es.update_rows("user", hot, np.ones((10, 8), np.float32))
        w[hot] = 1
        np.testing.assert_allclose(eng.sls([SlsRequest("user", hot, [0])])[0][0], w[hot].sum(0), rtol=1e-5)
        # hot_rows_profile_ids=0: only profile() fills it
        eng0 = SlsEngine(es, hot_rows_bytes=1 << 16, hot_rows_profile_ids=0)
        for _ in range(5):
            eng0.sls([SlsRequest("user", rng.choice(hot, 64), [0])])
        assert eng0.cache_stats()["hot_rows"]["bytes"] == 0

    # the server: --hot-rows-mb takes effect
    srv = ServerProcess(path, "--listen", f"unix:{sock}/s.sock", "--hot-rows-mb", "0.01",
                        "--hot-rows-profile-ids", "100")
    try:
        with DeviceClient(srv.address, timeout=TIMEOUT) as c:
            for _ in range(5):
                c.sls([SlsRequest("user", rng.choice(hot, 64), [0])])
            hs = c.cache_stats()["hot_rows"]
            assert hs["bytes"] > 0 and hs["hits"] > 0 and hs["budget_bytes"] == int(0.01 * (1 << 20)), hs
    finally:
        assert srv.stop() == 0


# ---------------------------------------------------------------------------------------
# 5. ndp status --tls-ca ; 7 (iv) flags named as typed


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_status_with_tls_ca(store, tmp_path):
    path, _ = store
    cert, key, tokens = tls_cert_and_tokens(tmp_path, "read " + "r" * 24)
    with NdpServer(path, "127.0.0.1:0", token_file=tokens, tls_cert=cert, tls_key=key) as srv:
        r = _run("ndp", "status", srv.address, "--token-file", tokens, "--tls-ca", cert, "--json")
        assert r.returncode == 0, r.stderr
        assert '"user"' in r.stdout and '"protocol": "recflash.ndp.v1"' in r.stdout
        r = _run("ndp", "status", srv.address, "--token-file", tokens, "--tls-ca", str(tmp_path / "nope.pem"))
        assert r.returncode == 2 and "TLS CA file" in r.stderr and "Traceback" not in r.stderr, r.stderr
        r = _run("ndp", "status", srv.address, "--token-file", str(tokens), "--timeout", "3")  # plain: refused
        assert r.returncode != 0 and "Traceback" not in r.stderr


@pytest.mark.parametrize("args, want", [
    (["--row-cache-mb", "-5"], "--row-cache-mb must be >= 0, got -5"),
    (["--hot-rows-mb", "nan"], "--hot-rows-mb must be >= 0, got nan"),
    (["--threads", "0"], "--threads must be between 1 and 4096, got 0"),
    (["--dense-page-rows", "-1"], "--dense-page-rows must be >= 0, got -1"),
    (["--max-message-mb", "0"], "--max-message-mb must be"),
    (["--hot-rows-mb", "1", "--hot-rows-profile-ids", "0"], "--hot-rows-profile-ids 0 would leave"),
])
def test_serve_options_are_named_as_typed(store, args, want):
    path, _ = store
    r = _run("ndp", "serve", "--store", path, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert want in " ".join(r.stderr.split()) and "row_cache_bytes" not in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------
# 6. the inference example


def test_example_bad_input_is_one_line():
    ex = str(REPO / "examples" / "dlrm_inference_ssd.py")
    r = subprocess.run([sys.executable, ex, "--quick", "--checkpoint", "/nonexistent/ck.pt"],
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 2 and "--checkpoint '/nonexistent/ck.pt': no such file" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_example_all_in_dram_and_cleanup(tmp_path):
    ex = str(REPO / "examples" / "dlrm_inference_ssd.py")
    env = dict(ENV, TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, ex, "--quick", "--budget-frac", "1.0", "--batches", "3"],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "no SSD table" in r.stdout and "equal within 1e-5" in r.stdout
    assert not list(tmp_path.glob("recflash-inference-*")), "the example left its temporary directory"
    # a store written at another scale: one line, exit 2
    store = str(tmp_path / "emb")
    r = subprocess.run([sys.executable, ex, "--quick", "--batches", "2", "--store", store, "--scale", "0.01",
                        "--checkpoint", str(_checkpoint(tmp_path, 0.01))],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([sys.executable, ex, "--quick", "--batches", "2", "--store", store, "--scale", "0.02",
                        "--checkpoint", str(_checkpoint(tmp_path, 0.02))],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 2 and "SchemaError" in r.stderr and "another --scale" in r.stderr
    assert "Traceback" not in r.stderr
    assert not list(tmp_path.glob("recflash-inference-*"))


def _checkpoint(tmp_path, scale):
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import dlrm_inference_ssd as ex
    finally:
        sys.path.remove(str(REPO / "examples"))
    p = tmp_path / f"ck{scale}.pt"
    torch.save(ex.build(scale, "cpu").state_dict(), p)
    return p


def test_embedding_store_leaves_a_data_store_as_it_is(tmp_path):
    """Opening a store for embedding tables (what `recflash ndp serve` does) adds nothing to a
    store that holds none: its catalog is created with the first table."""
    import numpy as np

    from recflash.ndp import EmbeddingStore
    from recflash.reader import Store

    with Store.open(str(tmp_path / "s")) as s:
        s.create_feature("rating", "float32")
        s.put("rating", np.arange(3, dtype=np.uint64), np.ones(3, np.float32))
        es = EmbeddingStore(s)
        assert es.tables() == {} and dict(s.features()) == {"rating": "float32"}
        es.create_table("user", 10, 4)
        assert set(dict(s.features())) == {"rating", "emb/__tables__", "emb/user"}
    with Store.open(str(tmp_path / "s")) as s:
        assert list(EmbeddingStore(s).tables()) == ["user"]


def test_tcp_port_in_use_is_named(store, tmp_path):
    """A TCP address that cannot be bound says why (gRPC alone says only "Failed to bind")."""
    import socket

    path, _ = store
    tokens = tmp_path / "tokens"
    tokens.write_text("read " + "r" * 24 + "\n")
    tokens.chmod(0o600)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServerConfigError, match="Address already in use"):
            NdpServer(path, f"127.0.0.1:{port}", token_file=str(tokens))
