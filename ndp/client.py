"""``DeviceClient``: the host side of the NDP device protocol.

The same surface as an embedded ``SlsEngine`` + ``EmbeddingStore`` (``sls``, ``tables``,
``info``, ``read_rows``, ``update_rows``, ``cache_stats``, ``last_stats``), so code written
for the embedded engine runs against a server; plus the device's own commands (``mlp``,
``forward``, ``load_model``, ``stats``) and an asynchronous form of each compute command
(``submit_sls``, ``submit_mlp``, ``submit_forward`` return ``concurrent.futures.Future``s) so a
caller keeps several batches in flight.

Every call carries a deadline (``timeout``, default 30 s): a server that died or hangs gives
:class:`DeviceUnavailableError` within it, never a hang. Errors the server reports come back as
the recflash exception it raised (``UnknownFeatureError``, ``InvalidArgumentError``,
``SchemaError`` ...) with its message.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from typing import Dict, List, Optional, Sequence, Union

import grpc
import numpy as np

from recflash.ndp import wire
from recflash.ndp.embedding import TableInfo
from recflash.ndp.proto import ndp_pb2 as pb
from recflash.ndp.proto import ndp_pb2_grpc as pb_grpc
from recflash.ndp.sls import SlsRequest
from recflash.ndp.traffic import Traffic
from recflash.reader import errors as rerr


class DeviceError(rerr.RecflashError):
    """A device command failed for a reason other than bad input (see the message)."""

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        super().__init__(message)
        self.code = code


class DeviceUnavailableError(DeviceError, ConnectionError):
    """No answer from the server within the deadline, or it is not reachable."""


class DeviceAuthError(DeviceError, PermissionError):
    """The server refused the token (UNAUTHENTICATED) or its role (PERMISSION_DENIED)."""


_ERRORS = {c.__name__: c for c in (rerr.UnknownFeatureError, rerr.InvalidArgumentError, rerr.SchemaError,
                                    rerr.ValueTooLargeError, rerr.CorruptionError, rerr.ReadOnlyError,
                                    rerr.StoreClosedError)}
_ERRORS["UnknownModelError"] = rerr.UnknownFeatureError
_ERRORS["ServerConfigError"] = rerr.InvalidArgumentError


def _kjt_parts(sparse):
    """(keys, lengths, values, weights or None) of a KeyedJaggedTensor or of a (keys, lengths,
    values[, weights]) tuple."""
    if hasattr(sparse, "keys") and hasattr(sparse, "lengths") and hasattr(sparse, "values") and callable(sparse.keys):
        weights = sparse.weights_or_none() if hasattr(sparse, "weights_or_none") else None
        return list(sparse.keys()), sparse.lengths(), sparse.values(), weights
    if not isinstance(sparse, (tuple, list)) or len(sparse) not in (3, 4):
        raise rerr.InvalidArgumentError("sparse features must be a KeyedJaggedTensor or a (keys, lengths, values"
                                        f"[, weights]) tuple, got {type(sparse).__name__}")
    keys, lengths, values, *weights = sparse
    return list(keys), lengths, values, (weights[0] if weights else None)


class DeviceClient:
    """Client of an ``recflash ndp serve`` process at `address` (``unix:PATH`` or ``HOST:PORT``).

    token: bearer token (needed on TCP); tls_ca: PEM file of the CA that signed the server's
    certificate (turns TLS on); timeout: the deadline of every call, seconds.
    engine_stats: ask for the engine's stats with each Sls (``last_stats``; about 60 bytes).
    """

    def __init__(self, address: str, token: Optional[str] = None, *, timeout: float = 30.0,
                 tls_ca: Optional[str] = None, tls_server_name: Optional[str] = None,
                 max_message_bytes: int = 1 << 30, engine_stats: bool = True):
        self.address = address
        self.timeout = float(timeout)
        self.engine_stats = engine_stats
        self.traffic = Traffic()
        self.last_stats: dict = {}
        self._tables: Optional[Dict[str, TableInfo]] = None
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        opts = [("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
                # a batch's ids arrive in one stream window instead of 64 KiB flow-control steps
                ("grpc.http2.lookahead_bytes", 16 << 20), ("grpc.http2.max_frame_size", (16 << 20) - 1)]
        if tls_ca:
            try:
                with open(tls_ca, "rb") as f:
                    creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            except OSError as e:
                raise rerr.InvalidArgumentError(f"TLS CA file '{tls_ca}': {e.strerror}") from None
            if tls_server_name:
                opts.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(address, creds, options=opts)
        else:
            self._channel = grpc.insecure_channel(address, options=opts)
        self._stub = pb_grpc.NdpDeviceStub(self._channel)

    # -- plumbing ------------------------------------------------------------------------
    def _error(self, command: str, e: grpc.RpcError) -> Exception:
        code, details = e.code(), e.details() or ""
        cls_name = dict(e.trailing_metadata() or ()).get("recflash-error") if hasattr(e, "trailing_metadata") else None
        if cls_name in _ERRORS:
            return _ERRORS[cls_name](f"{details} [device {self.address}]")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            return DeviceUnavailableError(f"{command} on device {self.address}: {code.name} ({details}); "
                                          f"deadline {self.timeout:g} s", code)
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return DeviceAuthError(f"{command} on device {self.address}: {code.name}: {details}", code)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return DeviceError(f"{command} on device {self.address}: message over the size limit ({details})", code)
        return DeviceError(f"{command} on device {self.address}: {code.name}: {details}", code)

    def _call(self, command: str, request, timeout: Optional[float] = None):
        t0 = time.perf_counter()
        try:
            resp = getattr(self._stub, command)(request, timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            self.traffic.add(command, request.ByteSize(), 0, time.perf_counter() - t0, error=True)
            raise self._error(command, e) from None
        self.traffic.add(command, request.ByteSize(), resp.ByteSize(), time.perf_counter() - t0)
        return resp

    def _submit(self, command: str, request, finish, timeout: Optional[float] = None) -> cf.Future:
        out: cf.Future = cf.Future()
        out.set_running_or_notify_cancel()
        t0 = time.perf_counter()
        size = request.ByteSize()
        call = getattr(self._stub, command).future(request, timeout=timeout or self.timeout, metadata=self._metadata)

        def done(f):
            try:
                resp = f.result()
            except grpc.RpcError as e:
                self.traffic.add(command, size, 0, time.perf_counter() - t0, error=True)
                out.set_exception(self._error(command, e))
                return
            except Exception as e:  # cancelled
                self.traffic.add(command, size, 0, time.perf_counter() - t0, error=True)
                out.set_exception(DeviceUnavailableError(f"{command} on device {self.address}: {e!r}"))
                return
            self.traffic.add(command, size, resp.ByteSize(), time.perf_counter() - t0)
            try:
                out.set_result(finish(resp))
            except Exception as e:
                out.set_exception(e)

        call.add_done_callback(done)
        return out

    def wait_ready(self, timeout: float = 10.0) -> "DeviceClient":
        """Blocks until the channel connects (a freshly started server); raises on timeout."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise DeviceUnavailableError(f"device {self.address}: not reachable within {timeout:g} s") from None
        return self

    # -- SLS -----------------------------------------------------------------------------
    def _sls_request(self, requests) -> "pb.SlsRequest":
        msg = pb.SlsRequest(want_stats=self.engine_stats)
        for r in requests:
            if not isinstance(r, SlsRequest):
                r = SlsRequest(*r)
            b = msg.bags.add(table=r.table, mode=r.mode, include_last_offset=r.include_last_offset)
            b.indices.CopyFrom(wire.ids_tensor(r.indices, f"sls on table '{r.table}': indices"))
            b.offsets.CopyFrom(wire.ids_tensor(r.offsets, f"sls on table '{r.table}': offsets"))
            if r.per_sample_weights is not None:
                wire.fill(b.per_sample_weights, r.per_sample_weights, np.float32)
        return msg

    def _sls_result(self, resp, as_torch):
        if resp.HasField("stats"):
            self.last_stats = _stats_dict(resp.stats)
        outs = [wire.decode(t, "pooled", wire.FLOATS, 2, copy=True) for t in resp.pooled]
        if any(as_torch):
            import torch

            return [torch.from_numpy(o) if t else o for o, t in zip(outs, as_torch)]
        return outs

    def sls(self, requests: Sequence[Union[SlsRequest, tuple]]) -> List:
        """Pooled [B, dim] float32 per request, as ``SlsEngine.sls`` (torch when the indices are)."""
        requests = list(requests)
        as_torch = [hasattr((r.indices if isinstance(r, SlsRequest) else r[1]), "detach") for r in requests]
        return self._sls_result(self._call("Sls", self._sls_request(requests)), as_torch)

    def submit_sls(self, requests) -> cf.Future:
        requests = list(requests)
        as_torch = [hasattr((r.indices if isinstance(r, SlsRequest) else r[1]), "detach") for r in requests]
        return self._submit("Sls", self._sls_request(requests), lambda resp: self._sls_result(resp, as_torch))

    # -- rows ----------------------------------------------------------------------------
    def read_rows(self, table: str, ids) -> np.ndarray:
        """Rows for ids as a [len(ids), dim] float32 array."""
        ids = wire.ids_tensor(np.asarray(wire.as_numpy(ids)).reshape(-1), f"read_rows on table '{table}': ids")
        resp = self._call("ReadRows", pb.ReadRowsRequest(table=table, ids=ids))
        return wire.decode(resp.rows, "rows", wire.FLOATS, 2, copy=True)

    def update_rows(self, table: str, ids, rows) -> int:
        """New versions of rows; durable and visible to every later call when this returns."""
        ids = wire.ids_tensor(np.asarray(wire.as_numpy(ids)).reshape(-1), f"update_rows on table '{table}': ids")
        rows = wire.as_numpy(rows)
        resp = self._call("UpdateRows", pb.UpdateRowsRequest(table=table, ids=ids,
                                                             rows=wire.tensor(rows, np.float32)))
        return int(resp.rows)

    # -- metadata ------------------------------------------------------------------------
    def stats(self) -> dict:
        """The server's view: protocol, tables, models, per-command traffic, cache stats."""
        r = self._call("Stats", pb.StatsRequest())
        self._tables = {t.name: TableInfo(name=t.name, num_rows=int(t.num_rows), dim=int(t.dim),
                                          dtype=t.dtype or "float32") for t in r.tables}
        return dict(
            protocol=r.protocol, version=r.version, store=r.store, uptime_s=r.uptime_s, in_flight=int(r.in_flight),
            tables={k: dict(num_rows=v.num_rows, dim=v.dim, dtype=v.dtype) for k, v in self._tables.items()},
            models={m.name: dict(config=json.loads(m.config_json), parameters=int(m.parameters)) for m in r.models},
            traffic={t.command: dict(calls=int(t.calls), errors=int(t.errors), bytes_to_device=int(t.bytes_to_device),
                                     bytes_to_host=int(t.bytes_to_host), seconds=t.seconds) for t in r.traffic},
            cache_stats=json.loads(r.cache_stats_json or "{}"),
            engine_options=json.loads(r.engine_options_json or "{}"),
        )

    def tables(self) -> Dict[str, TableInfo]:
        if self._tables is None:
            self.stats()
        return dict(self._tables)

    def info(self, table: str) -> TableInfo:
        t = self.tables().get(table)
        if t is None:
            t = (self.stats() and self._tables).get(table)  # a table created since the last look
        if t is None:
            raise rerr.UnknownFeatureError(f"unknown embedding table '{table}' on device {self.address} "
                                           f"(tables: {', '.join(sorted(self._tables)) or 'none'})")
        return t

    def cache_stats(self) -> dict:
        return self.stats()["cache_stats"]

    # -- models --------------------------------------------------------------------------
    def load_model(self, name: str, model, config: Optional[dict] = None,
                   table_map: Optional[Dict[str, str]] = None) -> dict:
        """Registers a DLRM's dense part under `name`: `model` is a torchrec ``DLRM`` (its config
        is read from it; `table_map` names the store table of each model table), or a state
        dict with `config` (see recflash.ndp.dense). Embedding tables are not sent."""
        from recflash.ndp.dense import dense_state_dict, dlrm_config

        if config is None:
            if not hasattr(model, "sparse_arch"):
                raise rerr.InvalidArgumentError(f"load_model('{name}'): pass a torchrec DLRM, or a state dict and config")
            config = dlrm_config(model, table_map)
        msg = pb.LoadModelRequest(name=name, config_json=json.dumps(config))
        for k, v in dense_state_dict(model).items():
            wire.fill(msg.state.add(name=k).tensor, v)
        r = self._call("LoadModel", msg)
        return dict(name=r.model.name, config=json.loads(r.model.config_json), parameters=int(r.model.parameters))

    def _mlp_request(self, model, which, x):
        return pb.MlpRequest(model=model, which=which, input=wire.tensor(x, np.float32))

    @staticmethod
    def _out(t, like, what):
        a = wire.decode(t, what, wire.FLOATS, copy=True)
        if hasattr(like, "detach"):
            import torch

            return torch.from_numpy(a)
        return a

    def mlp(self, model: str, which: str, x):
        """Runs model's "bottom" or "top" MLP on x [B, in] (torch in, torch out; numpy likewise)."""
        return self._out(self._call("Mlp", self._mlp_request(model, which, x)).output, x, "output")

    def submit_mlp(self, model: str, which: str, x) -> cf.Future:
        return self._submit("Mlp", self._mlp_request(model, which, x), lambda r: self._out(r.output, x, "output"))

    def _forward_request(self, model, dense, sparse, want_stats):
        keys, lengths, values, weights = _kjt_parts(sparse)
        what = f"forward on model '{model}'"
        msg = pb.ForwardRequest(model=model, dense=wire.tensor(dense, np.float32), keys=keys,
                                lengths=wire.ids_tensor(lengths, f"{what}: lengths"),
                                values=wire.ids_tensor(values, f"{what}: values"), want_stats=want_stats)
        if weights is not None:
            wire.fill(msg.weights, weights, np.float32)
        return msg

    def _forward_result(self, r, like):
        if r.HasField("stats"):
            self.last_stats = _stats_dict(r.stats)
        return self._out(r.scores, like, "scores")

    def forward(self, model: str, dense_features, sparse_features, want_stats: bool = False):
        """Scores [B, 1] (the DLRM's logits) of the whole model: dense features [B, n] and a
        KeyedJaggedTensor (or (keys, lengths, values)) in; MLPs and SLS run in the server."""
        r = self._call("Forward", self._forward_request(model, dense_features, sparse_features, want_stats))
        return self._forward_result(r, dense_features)

    def submit_forward(self, model: str, dense_features, sparse_features, want_stats: bool = False) -> cf.Future:
        msg = self._forward_request(model, dense_features, sparse_features, want_stats)
        return self._submit("Forward", msg, lambda r: self._forward_result(r, dense_features))

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "DeviceClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DeviceClient({self.address!r})"


def _stats_dict(s: "pb.EngineStats") -> dict:
    g = {f.name: getattr(s.gather, f.name) for f in pb.GatherStats.DESCRIPTOR.fields}
    return dict(lookups=int(s.lookups), unique_rows=int(s.unique_rows), seconds=s.seconds, gather=g)
