"""The NDP device server: one process owns the store, its SLS engine and the dense models.

``NdpServer`` serves the ``recflash.ndp.v1.NdpDevice`` gRPC service (ndp/proto/ndp.proto):
hosts send ids and dense features, the server gathers and pools embedding rows next to the
data and, for registered DLRMs, runs the MLPs too — only pooled vectors or scores go back
(RecSSD, RM-SSD). The command line is ``recflash ndp serve`` (ndp/cli.py).

Pipelining (RM-SSD §IV-D): the gRPC worker threads run requests concurrently. The SLS
engine's ring pass and torch's MLP kernels both run without the GIL, so while one batch
waits for its rows another batch's MLPs compute; a client keeps k batches in flight with
``DeviceClient.submit_*``.

Access: the default address is a Unix socket in a directory only the owner can enter (0700,
socket 0600). TCP needs a token file (one ``ROLE TOKEN`` per line, role ``read`` or
``write``); ``read`` may call Sls/ReadRows/Mlp/Forward/Stats, ``write`` also
UpdateRows/LoadModel. A missing or unknown token is refused with UNAUTHENTICATED, a read
token calling a write command with PERMISSION_DENIED. TLS with a certificate and key.

Durability: UpdateRows answers after the store's sync(), so an acknowledged update survives
a crash of the server; SIGTERM lets in-flight requests finish and closes the store cleanly.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import socket
import stat
import tempfile
import threading
import time
from concurrent import futures
from typing import Dict, Optional, Tuple

import grpc
import numpy as np

import recflash
from recflash.ndp import wire
from recflash.ndp.embedding import EmbeddingStore, as_ids
from recflash.ndp.proto import ndp_pb2 as pb
from recflash.ndp.proto import ndp_pb2_grpc as pb_grpc
from recflash.ndp.sls import SlsEngine, SlsRequest
from recflash.ndp.traffic import Traffic
from recflash.reader import Store
from recflash.reader import errors as rerr

log = logging.getLogger("recflash.ndp.server")

PROTOCOL = "recflash.ndp.v1"
SERVICE = "recflash.ndp.v1.NdpDevice"
READ_COMMANDS = frozenset({"Sls", "ReadRows", "Mlp", "Forward", "Stats"})
WRITE_COMMANDS = frozenset({"UpdateRows", "LoadModel"})
ROLES = ("read", "write")
DEFAULT_MAX_MESSAGE = 64 << 20
ERROR_KEY = "recflash-error"  # trailing metadata: the recflash exception class

_CODES = [  # most specific first
    (rerr.UnknownFeatureError, grpc.StatusCode.NOT_FOUND),
    (rerr.ReadOnlyError, grpc.StatusCode.FAILED_PRECONDITION),
    (rerr.StoreClosedError, grpc.StatusCode.UNAVAILABLE),
    (rerr.CorruptionError, grpc.StatusCode.DATA_LOSS),
    ((rerr.InvalidArgumentError, rerr.SchemaError, rerr.ValueTooLargeError), grpc.StatusCode.INVALID_ARGUMENT),
]


class ServerConfigError(rerr.RecflashError, ValueError):
    """A server option that cannot work (address, token file, TLS files)."""


class UnknownModelError(rerr.UnknownFeatureError):
    """A model name that the server has not registered."""


# ---------------------------------------------------------------------------------------
# Addresses and tokens


def default_address(store_path: str) -> str:
    """``unix:`` socket for `store_path` in a private per-user directory."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    real = os.path.realpath(store_path)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(real) or "store")[:32]
    tag = hashlib.blake2b(real.encode(), digest_size=4).hexdigest()
    return f"unix:{os.path.join(base, f'recflash-ndp-{os.getuid()}', f'{name}-{tag}.sock')}"


def parse_address(address: str) -> Tuple[str, str, Optional[int]]:
    """('unix', path, None) or ('tcp', host, port)."""
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ServerConfigError(f"address '{address}': empty socket path")
        return "unix", path, None
    m = re.fullmatch(r"\[?([^\[\]]*?)\]?:(\d+)", address)
    if not m:
        raise ServerConfigError(f"address '{address}' is neither unix:PATH nor HOST:PORT")
    host, port = m.group(1) or "127.0.0.1", int(m.group(2))
    if port > 65535:
        raise ServerConfigError(f"address '{address}': port {port} out of range")
    return "tcp", host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_tokens(path: str) -> Dict[str, str]:
    """{token: role} from a file of ``ROLE TOKEN`` lines (# comments); the file must not be
    readable by group or others."""
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ServerConfigError(f"token file '{path}': {e.strerror}") from None
    if st.st_mode & 0o077:
        raise ServerConfigError(f"token file '{path}' is accessible by group or others "
                                f"(mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it")
    tokens = {}
    for no, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or parts[0] not in ROLES:
            raise ServerConfigError(f"token file '{path}', line {no}: expected 'read TOKEN' or 'write TOKEN'")
        if len(parts[1]) < 16:
            raise ServerConfigError(f"token file '{path}', line {no}: token shorter than 16 characters")
        tokens[parts[1]] = parts[0]
    if not tokens:
        raise ServerConfigError(f"token file '{path}' holds no token")
    return tokens


def _private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ServerConfigError(f"socket directory '{path}' must belong to uid {os.getuid()} with mode 700 "
                                f"(has uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")


def _claim_socket_path(path: str) -> None:
    """Makes `path` free for a new Unix socket, or says why it cannot be used: its directory
    must exist; an existing socket that a process answers on belongs to a running server
    (refused); one nobody answers on is stale (a server killed with SIGKILL) and is removed;
    anything else at the path (a regular file, a directory) is refused, never removed."""
    d = os.path.dirname(path) or "."
    if not os.path.isdir(d):
        what = "is not a directory" if os.path.exists(d) else "does not exist"
        raise ServerConfigError(f"cannot listen on 'unix:{path}': directory '{d}' {what}")
    if not os.access(d, os.W_OK | os.X_OK):
        raise ServerConfigError(f"cannot listen on 'unix:{path}': no permission to create a socket in '{d}'")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a symbolic link" if stat.S_ISLNK(st.st_mode)
                else "a regular file" if stat.S_ISREG(st.st_mode) else "not a socket")
        raise ServerConfigError(f"cannot listen on 'unix:{path}': the path exists and is {kind}; choose another "
                                f"socket path (it is not removed)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        pass  # stale: nobody listens
    except socket.timeout:
        raise ServerConfigError(f"socket {path} is in use by a running server (it accepts connections but did "
                                f"not answer in time); stop it or choose another --listen path") from None
    except OSError as e:
        raise ServerConfigError(f"cannot listen on 'unix:{path}': probing the existing socket failed: "
                                f"{e.strerror}") from None
    else:
        raise ServerConfigError(f"socket {path} is in use by a running server; stop it first or choose "
                                f"another --listen path")
    finally:
        probe.close()
    try:
        os.unlink(path)
        log.info("removed stale socket %s (no server answered on it)", path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise ServerConfigError(f"cannot remove the stale socket '{path}': {e.strerror}") from None


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _tcp_bind_problem(host: str, port: int) -> Optional[str]:
    """Why binding host:port fails, in the OS's words (gRPC's own error only says "Failed to
    bind"): an unknown host, an address not on this machine, a port in use."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return f"cannot resolve host '{host}': {e.strerror}"
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            try:
                s.bind(addr)
            except OSError as e:
                return f"{e.strerror} (errno {e.errno})"
    return None


def _temp_socket_path(path: str) -> str:
    """A fresh name beside `path` (same directory, so it can be hard-linked there) to bind at;
    `path` itself when no such name fits the 107-byte limit."""
    tmp = os.path.join(os.path.dirname(path), f".rf{os.getpid()}-{os.urandom(3).hex()}.sock")
    return tmp if len(tmp.encode()) <= 107 else path


def _publish_socket(bind_path: str, path: str) -> Tuple[int, int]:
    """Gives the socket bound at `bind_path` its name `path` without replacing anything there
    (see _claim_socket_path); returns its (st_dev, st_ino)."""
    if bind_path != path:
        for attempt in range(3):
            try:
                os.link(bind_path, path)
                break
            except FileExistsError:
                if attempt == 2:
                    raise ServerConfigError(f"socket {path} is in use by a running server") from None
                _claim_socket_path(path)  # refuses a live server, removes a stale socket
            except OSError:  # a file system without hard links for sockets: rename (no atomic check)
                _claim_socket_path(path)
                try:
                    os.rename(bind_path, path)
                except OSError as e:
                    raise ServerConfigError(f"cannot listen on 'unix:{path}': {e.strerror}") from None
                break
        _unlink_quietly(bind_path)
    st = os.stat(path)
    return st.st_dev, st.st_ino


# ---------------------------------------------------------------------------------------
# The device: store + engine + models, numpy in and out


class NdpDevice:
    """What the server owns; usable without gRPC (the servicer is a thin layer over it)."""

    def __init__(self, store_path: str, *, vector_grained: bool = True, row_cache_bytes: int = 0,
                 hot_rows_bytes: int = 0, pooled_cache_bytes: int = 0, pooled_min_bag: int = 8,
                 device_cache_bytes: int = 0, hot_rows_profile_ids: int = 100_000, verify_tables: bool = True,
                 dense_threads: int = 8, dense_page_rows: Optional[int] = None):
        if not os.path.isdir(store_path):
            raise ServerConfigError(f"no store at '{store_path}' (serve an existing store; create its tables with "
                                    f"recflash.ndp.EmbeddingStore)")
        self.store_path = store_path
        self.store = Store.open(store_path)
        try:
            self.tables = EmbeddingStore(self.store)
            self.engine_options = dict(vector_grained=vector_grained, dense_page_rows=dense_page_rows,
                                       row_cache_bytes=row_cache_bytes,
                                       hot_rows_bytes=hot_rows_bytes, pooled_cache_bytes=pooled_cache_bytes,
                                       pooled_min_bag=pooled_min_bag, device_cache_bytes=device_cache_bytes,
                                       hot_rows_profile_ids=hot_rows_profile_ids)
            self.engine = SlsEngine(self.tables, **self.engine_options)
            self.engine_options["dense_page_rows"] = self.engine.dense_page_rows  # the default resolved, for status
            self.verified_pages = 0
            if verify_tables:  # warm-up: take each packed page's block checksums now, not on first lookups
                for name in self.tables.tables():
                    self.verified_pages += self.tables.verify_table(name)
        except BaseException:
            self.store.close()
            raise
        self.models: Dict[str, object] = {}
        self._dense_pool = futures.ThreadPoolExecutor(max_workers=dense_threads, thread_name_prefix="ndp-dense")
        self._write_lock = threading.Lock()  # the only writer of the store: one update at a time
        self._closed = False

    # -- embedding commands ---------------------------------------------------------------
    def sls(self, requests):
        pooled = self.engine.sls(requests)
        return pooled, self.engine.last_stats

    def read_rows(self, table: str, ids: np.ndarray) -> np.ndarray:
        return self.tables.read_rows(table, ids)

    def update_rows(self, table: str, ids: np.ndarray, rows: np.ndarray) -> int:
        with self._write_lock:
            self.tables.update_rows(table, ids, rows)
            self.store.sync()  # acknowledged means durable
        return int(len(ids))

    # -- models --------------------------------------------------------------------------
    def load_model(self, name: str, config: dict, state: dict):
        from recflash.ndp.dense import DlrmDense

        if not name or not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", name):
            raise rerr.InvalidArgumentError(f"model name {name!r}: use 1-128 letters, digits, '_', '.', '-'")
        model = DlrmDense(name, config, state)
        model.check_tables(self.tables.tables())
        self.models[name] = model  # replaces an older version atomically for new requests
        return model

    def model(self, name: str):
        m = self.models.get(name)
        if m is None:
            raise UnknownModelError(f"unknown model '{name}' (models: {', '.join(sorted(self.models)) or 'none'}; "
                                    f"register it with LoadModel)")
        return m

    def mlp(self, name: str, which: str, x: np.ndarray) -> np.ndarray:
        import torch

        m = self.model(name)
        if which not in ("bottom", "top"):
            raise rerr.InvalidArgumentError(f"Mlp on model '{name}': which must be 'bottom' or 'top', got {which!r}")
        t = torch.from_numpy(np.array(x, dtype=np.float32))
        out = m.bottom(t) if which == "bottom" else m.top(t)
        return out.numpy()

    def forward(self, name: str, dense: np.ndarray, keys, lengths: np.ndarray, values: np.ndarray,
                weights: Optional[np.ndarray] = None):
        """Scores of model `name`; `weights` are the KJT's per-value weights (float32 like
        values), used when the model is weighted (is_weighted) and ignored otherwise, as
        torchrec's EmbeddingBagCollection does."""
        import torch

        m = self.model(name)
        values = as_ids(values, f"Forward on model '{name}': values")
        lengths = as_ids(lengths, f"Forward on model '{name}': lengths")
        if m.is_weighted:
            if weights is None:
                raise rerr.InvalidArgumentError(
                    f"Forward on model '{name}': the model's embedding tables are weighted (is_weighted), "
                    f"so the KeyedJaggedTensor needs weights; it has none")
            if weights.size != values.size:
                raise rerr.SchemaError(f"Forward on model '{name}': weights has {weights.size} entries for "
                                       f"{values.size} values")
        else:
            weights = None
        if dense.ndim != 2 or dense.shape[1] != m.dense_in:
            raise rerr.SchemaError(f"Forward on model '{name}': dense features must be [B, {m.dense_in}], "
                                   f"got {list(dense.shape)}")
        B = dense.shape[0]
        keys = list(keys)
        if len(set(keys)) != len(keys):
            raise rerr.InvalidArgumentError(f"Forward on model '{name}': a key appears twice in {keys}")
        if lengths.size != len(keys) * B:
            raise rerr.SchemaError(f"Forward on model '{name}': lengths has {lengths.size} entries; {len(keys)} keys x "
                                   f"batch {B} need {len(keys) * B}")
        lengths = lengths.astype(np.int64, copy=False).reshape(len(keys), B)
        if lengths.size and lengths.min() < 0:
            raise rerr.InvalidArgumentError(f"Forward on model '{name}': negative length in lengths")
        per_key = lengths.sum(axis=1)
        if int(per_key.sum()) != values.size:
            raise rerr.SchemaError(f"Forward on model '{name}': lengths sum to {int(per_key.sum())}, "
                                   f"values has {values.size} ids")
        starts = np.concatenate([[0], np.cumsum(per_key)])
        pos = {k: i for i, k in enumerate(keys)}
        requests = []
        for feature, table, pooling in m.features:
            i = pos.get(feature)
            if i is None:
                raise rerr.InvalidArgumentError(f"Forward on model '{name}': sparse feature '{feature}' missing "
                                                f"(keys sent: {keys})")
            offsets = np.concatenate([[0], np.cumsum(lengths[i])])
            a, z = starts[i], starts[i + 1]
            requests.append(SlsRequest(table, values[a:z], offsets, pooling,
                                       None if weights is None else weights[a:z], include_last_offset=True))
        # RM-SSD runs the bottom MLP beside the embedding lookups: torch and the engine's ring
        # pass both run without the GIL, so the MLP computes while the rows are read.
        bottom = self._dense_pool.submit(m.bottom, torch.from_numpy(np.array(dense, dtype=np.float32)))
        try:
            pooled = self.engine.sls(requests)
            stats = self.engine.last_stats
        finally:
            embedded_dense = bottom.result()
        return m.interact_top(embedded_dense, pooled).numpy(), stats

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._dense_pool.shutdown(wait=True)
            with self._write_lock:
                self.store.close()


# ---------------------------------------------------------------------------------------
# gRPC layer


def _stats_msg(msg: "pb.EngineStats", st: dict) -> None:
    msg.lookups = int(st.get("lookups", 0))
    msg.unique_rows = int(st.get("unique_rows", 0))
    msg.seconds = float(st.get("seconds", 0.0))
    for k, v in (st.get("gather") or {}).items():
        if k in pb.GatherStats.DESCRIPTOR.fields_by_name:
            setattr(msg.gather, k, type(getattr(msg.gather, k))(v))


def _status_of(e: BaseException) -> grpc.StatusCode:
    for cls, code in _CODES:
        if isinstance(e, cls):
            return code
    return grpc.StatusCode.INTERNAL


class _Servicer(pb_grpc.NdpDeviceServicer):
    def __init__(self, device: NdpDevice, server: "NdpServer"):
        self.d = device
        self.srv = server
        self.traffic = Traffic()

    def _run(self, command: str, request, context, fn):
        t0 = time.perf_counter()
        with self.srv._flight_lock:
            self.srv._in_flight += 1
        try:
            resp = fn(request)
        except Exception as e:  # every failure becomes a status naming what was wrong
            code = _status_of(e)
            if code == grpc.StatusCode.INTERNAL:
                log.exception("%s failed", command)
                msg = f"{command}: internal error: {type(e).__name__}: {e}"
            else:
                msg = f"{command}: {e}"
            self.traffic.add(command, request.ByteSize(), 0, time.perf_counter() - t0, error=True)
            context.set_trailing_metadata(((ERROR_KEY, type(e).__name__),))
            context.abort(code, msg)
        finally:
            with self.srv._flight_lock:
                self.srv._in_flight -= 1
        self.traffic.add(command, request.ByteSize(), resp.ByteSize(), time.perf_counter() - t0)
        return resp

    # -- commands ------------------------------------------------------------------------
    def Sls(self, request, context):
        return self._run("Sls", request, context, self._sls)

    def _sls(self, request):
        reqs = []
        for i, b in enumerate(request.bags):
            what = f"bags[{i}] (table '{b.table}')"
            idx = wire.decode(b.indices, f"{what} indices", wire.IDS, 1)
            off = wire.decode(b.offsets, f"{what} offsets", wire.IDS, 1)
            w = wire.decode(b.per_sample_weights, f"{what} per_sample_weights", wire.FLOATS, 1) \
                if b.HasField("per_sample_weights") else None
            if w is not None and w.size != idx.size:
                raise rerr.SchemaError(f"{what}: per_sample_weights has {w.size} entries for {idx.size} indices")
            reqs.append(SlsRequest(b.table, idx, off, b.mode or "sum", w, b.include_last_offset))
        pooled, st = self.d.sls(reqs)
        resp = pb.SlsResponse()
        for p in pooled:
            wire.fill(resp.pooled.add(), p)
        if request.want_stats:
            _stats_msg(resp.stats, st)
        return resp

    def ReadRows(self, request, context):
        def fn(r):
            ids = wire.decode(r.ids, f"ReadRows ids (table '{r.table}')", wire.IDS, 1)
            return pb.ReadRowsResponse(rows=wire.tensor(self.d.read_rows(r.table, ids)))
        return self._run("ReadRows", request, context, fn)

    def UpdateRows(self, request, context):
        def fn(r):
            ids = wire.decode(r.ids, f"UpdateRows ids (table '{r.table}')", wire.IDS, 1)
            rows = wire.decode(r.rows, f"UpdateRows rows (table '{r.table}')", wire.FLOATS, 2)
            return pb.UpdateRowsResponse(rows=self.d.update_rows(r.table, ids, rows))
        return self._run("UpdateRows", request, context, fn)

    def LoadModel(self, request, context):
        def fn(r):
            try:
                config = json.loads(r.config_json)
            except ValueError as e:
                raise rerr.InvalidArgumentError(f"model '{r.name}': config_json is not JSON: {e}") from None
            state = {}
            for nt in r.state:
                a = wire.decode(nt.tensor, f"state '{nt.name}'", (pb.FLOAT32, pb.INT64, pb.INT32), copy=True)
                state[nt.name] = a
            m = self.d.load_model(r.name, config, state)
            return pb.LoadModelResponse(model=pb.ModelInfo(name=m.name, config_json=json.dumps(m.config),
                                                           parameters=m.parameters))
        return self._run("LoadModel", request, context, fn)

    def Mlp(self, request, context):
        def fn(r):
            x = wire.decode(r.input, f"Mlp input (model '{r.model}')", wire.FLOATS, 2)
            return pb.MlpResponse(output=wire.tensor(self.d.mlp(r.model, r.which, x)))
        return self._run("Mlp", request, context, fn)

    def Forward(self, request, context):
        def fn(r):
            what = f"Forward (model '{r.model}')"
            dense = wire.decode(r.dense, f"{what} dense", wire.FLOATS, 2)
            lengths = wire.decode(r.lengths, f"{what} lengths", wire.IDS, 1)
            values = wire.decode(r.values, f"{what} values", wire.IDS, 1)
            weights = wire.decode(r.weights, f"{what} weights", wire.FLOATS, 1) if r.HasField("weights") else None
            scores, st = self.d.forward(r.model, dense, r.keys, lengths, values, weights)
            resp = pb.ForwardResponse(scores=wire.tensor(scores))
            if r.want_stats:
                _stats_msg(resp.stats, st)
            return resp
        return self._run("Forward", request, context, fn)

    def Stats(self, request, context):
        def fn(r):
            d = self.d
            resp = pb.StatsResponse(protocol=PROTOCOL, version=recflash.__version__, store=d.store_path,
                                    uptime_s=time.monotonic() - self.srv._started,
                                    cache_stats_json=json.dumps(d.engine.cache_stats()),
                                    engine_options_json=json.dumps(d.engine_options),
                                    in_flight=max(0, self.srv._in_flight - 1))
            for t in d.tables.tables().values():
                resp.tables.add(name=t.name, num_rows=t.num_rows, dim=t.dim, dtype=t.dtype)
            for m in list(d.models.values()):
                resp.models.add(name=m.name, config_json=json.dumps(m.config), parameters=m.parameters)
            for cmd, c in self.traffic.snapshot().items():
                resp.traffic.add(command=cmd, **c)
            return resp
        return self._run("Stats", request, context, fn)


def _refuse(code: grpc.StatusCode, message: str):
    def handler(request, context):
        context.abort(code, message)
    return grpc.unary_unary_rpc_method_handler(handler)


class _TokenAuth(grpc.ServerInterceptor):
    """Bearer tokens with roles, checked before a command runs."""

    def __init__(self, tokens: Dict[str, str]):
        self._tokens = tokens

    def _role(self, presented: Optional[str]) -> Optional[str]:
        if presented is None:
            return None
        for token, role in self._tokens.items():  # constant time per comparison, no early exit on a prefix
            if hmac.compare_digest(token.encode(), presented.encode()):
                return role
        return None

    def intercept_service(self, continuation, details):
        command = details.method.rsplit("/", 1)[-1]
        presented = None
        for k, v in details.invocation_metadata or ():
            if k == "authorization" and isinstance(v, str) and v.startswith("Bearer "):
                presented = v[len("Bearer "):]
        role = self._role(presented)
        if role is None:
            why = "no token" if presented is None else "unknown token"
            return _refuse(grpc.StatusCode.UNAUTHENTICATED, f"{command}: {why}; this server needs a bearer token")
        if command in WRITE_COMMANDS and role != "write":
            return _refuse(grpc.StatusCode.PERMISSION_DENIED,
                           f"{command} needs a 'write' token; this token has role '{role}'")
        if command not in READ_COMMANDS | WRITE_COMMANDS and role != "write":
            return _refuse(grpc.StatusCode.PERMISSION_DENIED, f"{command}: not allowed for role '{role}'")
        return continuation(details)


class NdpServer:
    """gRPC server around an :class:`NdpDevice`.

    >>> srv = NdpServer("/data/store", listen="unix:/tmp/ndp/s.sock").start()
    >>> srv.address        # what DeviceClient connects to
    >>> srv.stop()         # in-flight requests finish, the store closes
    """

    def __init__(self, store_path: str, listen: Optional[str] = None, *, token_file: Optional[str] = None,
                 threads: int = 8, max_message_bytes: int = DEFAULT_MAX_MESSAGE,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None, **engine_options):
        self.listen = listen or default_address(store_path)
        kind, host, port = parse_address(self.listen)
        self._tokens = load_tokens(token_file) if token_file else None
        if kind == "tcp" and self._tokens is None:
            raise ServerConfigError(f"listening on TCP ({self.listen}) needs --token-file: anyone who can reach the "
                                    f"port could otherwise read and write the tables")
        if (tls_cert is None) != (tls_key is None):
            raise ServerConfigError("TLS needs both a certificate and a key (--tls-cert and --tls-key)")
        creds = None
        if tls_cert:
            try:
                with open(tls_cert, "rb") as f:
                    cert = f.read()
                with open(tls_key, "rb") as f:
                    key = f.read()
            except OSError as e:
                raise ServerConfigError(f"TLS file '{e.filename}': {e.strerror}") from None
            creds = grpc.ssl_server_credentials([(key, cert)])
        if kind == "tcp" and not is_loopback(host) and creds is None:
            log.warning("serving %s without TLS: tokens and data cross the network in clear text", self.listen)
        if kind == "unix":
            if len(host.encode()) > 107:
                raise ServerConfigError(f"socket path '{host}' is {len(host.encode())} bytes; Unix sockets allow 107")
            if listen is None:
                _private_dir(os.path.dirname(host))
            _claim_socket_path(host)
        if threads < 1:
            raise ServerConfigError(f"threads must be >= 1, got {threads}")
        self.device = NdpDevice(store_path, dense_threads=threads, **engine_options)
        self.max_message_bytes = int(max_message_bytes)
        self._in_flight = 0
        self._flight_lock = threading.Lock()
        self._started = time.monotonic()
        self._stopped = threading.Event()
        opts = [("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.so_reuseport", 0),
                # a batch's ids arrive in one stream window instead of 64 KiB flow-control steps
                ("grpc.http2.lookahead_bytes", 16 << 20), ("grpc.http2.max_frame_size", (16 << 20) - 1)]
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ndp"),
                                   interceptors=[_TokenAuth(self._tokens)] if self._tokens else [], options=opts)
        self.servicer = _Servicer(self.device, self)
        pb_grpc.add_NdpDeviceServicer_to_server(self.servicer, self._server)
        self._kind, self._socket = kind, host if kind == "unix" else None
        # A Unix socket is bound at a private temporary name and then hard-linked to its path:
        # link() fails when the path exists, so a server that started meanwhile is never
        # replaced; and gRPC, which unlinks the path it bound when it stops, only removes the
        # temporary name, so stop() removes the path only if it is still this server's socket.
        bind_path = _temp_socket_path(host) if kind == "unix" else None
        if kind == "unix":
            target = f"unix:{bind_path}"
        else:
            target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._socket_id = None  # (st_dev, st_ino) of the socket file this server created
        try:
            try:
                bound = self._server.add_secure_port(target, creds) if creds else self._server.add_insecure_port(target)
            except RuntimeError as e:
                why = _tcp_bind_problem(host, port) if kind == "tcp" else None
                raise ServerConfigError(f"cannot listen on '{self.listen}': {why or e}") from None
            if kind == "unix":
                self._socket_id = _publish_socket(bind_path, host)
        except BaseException:
            self._server.stop(None)
            self.device.close()
            if bind_path and bind_path != host:
                _unlink_quietly(bind_path)
            raise
        if kind == "tcp":
            self.address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        else:
            self.address = self.listen

    @property
    def traffic(self) -> Traffic:
        return self.servicer.traffic

    def start(self) -> "NdpServer":
        self._server.start()
        if self._socket:
            os.chmod(self._socket, 0o600)
        return self

    def stop(self, grace: float = 10.0) -> None:
        """Refuses new requests, lets in-flight ones finish (up to `grace` s), closes the store."""
        if self._stopped.is_set():
            return
        self._server.stop(grace).wait()
        self.device.close()
        if self._socket and self._socket_id is not None:
            # only the socket this server bound: a path taken over since (another server after
            # a restart) is left alone
            try:
                st = os.lstat(self._socket)
                if (st.st_dev, st.st_ino) == self._socket_id:
                    os.unlink(self._socket)
            except FileNotFoundError:
                pass
        self._stopped.set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._stopped.wait(timeout)

    def __enter__(self) -> "NdpServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
