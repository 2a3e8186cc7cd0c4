"""Dense models in the device server: LoadModel, Mlp and whole-model Forward against a
torchrec DLRM, pipelined submits, TLS. Each test starts and stops its own server."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ndputil import socket_dir, tls_cert_and_tokens
from recflash.ndp import EmbeddingStore
from recflash.ndp.client import DeviceClient
from recflash.ndp.server import NdpServer
from recflash.reader import Store, StoreOptions
from recflash.reader.errors import InvalidArgumentError, SchemaError, UnknownFeatureError

TIMEOUT = 30.0
D = 16
TABLES = [("t0", 1000, ["f0"], PoolingType.SUM), ("t1", 400, ["f1", "f2"], PoolingType.SUM),
          ("t2", 3000, ["f3"], PoolingType.MEAN)]


def _model(seed=0):
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=D, num_embeddings=r, feature_names=f,
                                                            pooling=p) for n, r, f, p in TABLES])
    return DLRM(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[32, D],
                over_arch_layer_sizes=[24, 8, 1]).eval()


def _export_tables(model, path):
    with Store.open(path, StoreOptions(write_buffer_bytes=4 << 20)) as s:
        t = EmbeddingStore(s)
        for name, rows, _, _ in TABLES:
            t.create_table(name, rows, D)
            t.load_table(name, model.sparse_arch.embedding_bag_collection.embedding_bags[name].weight.detach(),
                         progress=False)


def _batch(rng, B, max_len=6):
    keys = ["f3", "f1", "f0", "f2"]  # not the model's order: features are matched by name
    rows = {"f0": 1000, "f1": 400, "f2": 400, "f3": 3000}
    lengths = rng.integers(0, max_len + 1, (len(keys), B))
    values = np.concatenate([rng.integers(0, rows[k], int(lengths[i].sum())) for i, k in enumerate(keys)])
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.from_numpy(values.astype(np.int64)),
                                              lengths=torch.from_numpy(lengths.reshape(-1).astype(np.int32)))
    return torch.from_numpy(rng.standard_normal((B, 13)).astype(np.float32)), kjt


@pytest.fixture
def served_model(tmp_path):
    model = _model()
    path = str(tmp_path / "s")
    _export_tables(model, path)
    sock = socket_dir()
    srv = NdpServer(path, f"unix:{sock}/ndp.sock").start()
    c = DeviceClient(srv.address, timeout=TIMEOUT)
    info = c.load_model("dlrm", model)
    yield model, c, srv, info
    c.close()
    srv.stop()
    shutil.rmtree(sock, ignore_errors=True)


def test_forward_and_mlps_equal_torchrec_dlrm(served_model):
    model, c, srv, info = served_model
    assert info["parameters"] == sum(p.numel() for k, p in model.named_parameters() if not k.startswith("sparse_arch"))
    assert c.stats()["models"]["dlrm"]["config"]["over_arch_layer_sizes"] == [24, 8, 1]
    rng = np.random.default_rng(0)
    for B in (1, 7, 64):
        dense, kjt = _batch(rng, B)
        with torch.no_grad():
            want = model(dense, kjt)
        got = c.forward("dlrm", dense, kjt)
        assert isinstance(got, torch.Tensor) and got.shape == (B, 1)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        # the same through numpy and a (keys, lengths, values) tuple
        got_np = c.forward("dlrm", dense.numpy(), (kjt.keys(), kjt.lengths().numpy(), kjt.values().numpy()))
        np.testing.assert_allclose(got_np, want.numpy(), rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            bottom = model.dense_arch(dense)
            top_in = torch.randn(B, 16 + 6 + 4)
            top = model.over_arch(top_in)
        torch.testing.assert_close(c.mlp("dlrm", "bottom", dense), bottom, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c.mlp("dlrm", "top", top_in), top, rtol=1e-5, atol=1e-5)
    # device SLS + host MLPs is the same function (what the benchmark's device_sls runs)
    dense, kjt = _batch(rng, 32)
    pooled = c.forward("dlrm", dense, kjt, want_stats=True)
    assert c.last_stats["lookups"] == int(kjt.lengths().sum())
    traffic = c.traffic.snapshot()["Forward"]
    assert traffic["bytes_to_host"] < traffic["bytes_to_device"], "scores out are smaller than ids in"


def test_pipelined_forward_and_update_while_serving(served_model):
    model, c, srv, _ = served_model
    rng = np.random.default_rng(1)
    batches = [_batch(rng, 16) for _ in range(12)]
    futs = [c.submit_forward("dlrm", d, k) for d, k in batches]  # 12 batches in flight
    for (d, k), f in zip(batches, futs):
        with torch.no_grad():
            torch.testing.assert_close(f.result(timeout=TIMEOUT), model(d, k), rtol=1e-5, atol=1e-5)
    # a model update through the server is seen by the next Forward
    ebc = model.sparse_arch.embedding_bag_collection
    new = torch.randn(400, D)
    c.update_rows("t1", np.arange(400), new.numpy())
    with torch.no_grad():
        ebc.embedding_bags["t1"].weight.copy_(new)
        d, k = batches[0]
        torch.testing.assert_close(c.forward("dlrm", d, k), model(d, k), rtol=1e-5, atol=1e-5)


def test_model_bad_input(served_model):
    model, c, srv, _ = served_model
    rng = np.random.default_rng(2)
    dense, kjt = _batch(rng, 4)
    with pytest.raises(SchemaError, match=r"dense features must be \[B, 13\], got \[4, 12\]"):
        c.forward("dlrm", dense[:, :12], kjt)
    with pytest.raises(InvalidArgumentError, match="sparse feature 'f0' missing"):
        c.forward("dlrm", dense, (["f1", "f2", "f3"], np.ones(12, np.int64), np.zeros(12, np.int64)))
    with pytest.raises(SchemaError, match="lengths sum to 8, values has 7"):
        c.forward("dlrm", dense, (["f0", "f1", "f2", "f3"], np.eye(1, 16, 0, dtype=np.int64).ravel() * 8, np.zeros(7, np.int64)))
    with pytest.raises(InvalidArgumentError, match="out of range for table 't2'"):
        c.forward("dlrm", dense, (["f0", "f1", "f2", "f3"], np.ones(16, np.int64), np.repeat([0, 0, 0, 3000], 4)))
    with pytest.raises(UnknownFeatureError, match="unknown model 'other'"):
        c.mlp("other", "top", np.zeros((1, 26), np.float32))
    with pytest.raises(InvalidArgumentError, match="which must be 'bottom' or 'top'"):
        c.mlp("dlrm", "middle", np.zeros((1, 13), np.float32))
    with pytest.raises(SchemaError, match=r"top MLP input must be \[B, 26\]"):
        c.mlp("dlrm", "top", np.zeros((1, 25), np.float32))
    sd = {k: v for k, v in model.state_dict().items() if not k.startswith("sparse_arch")}
    from recflash.ndp.dense import dlrm_config

    cfg = dlrm_config(model)
    with pytest.raises(SchemaError, match="state dict does not match its config"):
        c.load_model("bad", {k: v for k, v in list(sd.items())[:-1]}, config=cfg)
    with pytest.raises(InvalidArgumentError, match="needs store table 'nope'"):
        c.load_model("bad", model, table_map={"t0": "nope"})
    with pytest.raises(SchemaError, match="has 1000000 embeddings in the model but 400 rows in the store"):
        c.load_model("bad", sd, config=dict(cfg, tables=[dict(t, num_embeddings=10**6) if t["name"] == "t1" else t
                                                          for t in cfg["tables"]]))
    assert set(c.stats()["models"]) == {"dlrm"}
    torch.testing.assert_close(c.forward("dlrm", dense, kjt), model(dense, kjt), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls_with_token(tmp_path):
    path = str(tmp_path / "s")
    model = _model()
    _export_tables(model, path)
    cert, key, tokens = tls_cert_and_tokens(tmp_path, "write " + "k" * 24)
    with NdpServer(path, "127.0.0.1:0", token_file=tokens, tls_cert=cert, tls_key=key) as srv:
        with DeviceClient(srv.address, "k" * 24, tls_ca=cert, timeout=TIMEOUT) as c:
            c.load_model("m", model)
            dense, kjt = _batch(np.random.default_rng(3), 8)
            torch.testing.assert_close(c.forward("m", dense, kjt), model(dense, kjt), rtol=1e-5, atol=1e-5)
        from recflash.ndp.client import DeviceUnavailableError

        with DeviceClient(srv.address, "k" * 24, timeout=5) as plain:  # no TLS against a TLS port
            with pytest.raises(DeviceUnavailableError):
                plain.stats()
