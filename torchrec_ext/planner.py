"""DRAM vs SSD per table, and a TorchRec ``ShardingPlan`` for it (``plan_offload``).

Tiering follows SDM (§2.2, §4): a table's *demanded bandwidth* is
``QPS x pooling factor x row bytes``, with rows rounded up to the 512-byte device block a
vector-grained read costs. DRAM is given to the tables that demand the most bandwidth per DRAM
byte, in that order, while the budget lasts (a table that does not fit is skipped and smaller
ones after it may still fit — greedy knapsack by density); the rest go to SSD. The plan then
reports what the SSD tables demand of the device — reads/s and bytes/s — against its measured
random-read IOPS.

Placement is TorchRec's own ``EmbeddingShardingPlanner`` with two estimators that know the SSD
kernel: SSD tables are charged to ``Storage.ssd`` (never to DDR; only the engine's caches are
DRAM), and their forward cost is the device reads they need at the device's IOPS. Every table
gets a constraint (TorchRec's enumerator would otherwise offer the custom kernel for any table).
"""

from __future__ import annotations

import dataclasses
import fractions
import json
import math
import os
import shutil
import subprocess
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import (KernelConfig, Perf, ShardEstimator, Storage, TopologyFactory,
                                                TrainerConfig)
from torchrec.distributed.types import ShardingPlan, ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from recflash.ndp.sls import DENSE_PAGE_ROWS
from recflash.reader.errors import InvalidArgumentError, UnknownFeatureError
from recflash.torchrec_ext.sharding import SSD_KERNEL, SsdEmbeddingBagCollectionSharder

DEVICE_BLOCK = 512
ROW_DTYPES = ("float32", "float16", "int8")  # what the store's embedding tables hold
FUSED_KERNEL = "fused"
DEFAULT_QPS = 1000.0


def stored_row_bytes(dim: int, dtype: str = "float32") -> int:
    """Bytes one row takes in the store (``EmbeddingStore``'s encoding padded to whole words):
    float32 4 x dim, float16 2 x dim, int8 dim + 4 (its float16 scale and bias first)."""
    from recflash.ndp.row_format import row_words

    if dtype not in ROW_DTYPES:
        raise InvalidArgumentError(f"row dtype {dtype!r}: use one of {', '.join(ROW_DTYPES)}")
    return 4 * row_words(dtype, dim)


def ssd_row_bytes(dim: int, dtype: str = "float32") -> int:
    """Bytes a vector-grained read of one row costs: the row rounded up to 512-byte blocks."""
    return DEVICE_BLOCK * math.ceil(stored_row_bytes(dim, dtype) / DEVICE_BLOCK)


PAGE_SIZE = 16384          # the store's default page
PAGE_HEADER_BYTES = 64     # what a packed page keeps besides its rows (an upper bound)
PAGES_PER_READ = 16        # adjacent pages one device request carries (256 KiB)


def _chain_requests(units: int, q: float, per_request: int, sparse: float = 0.0, sparse_cost: float = 0.0) -> float:
    """Expected requests for maximal chains of adjacent touched units (each touched with
    probability q, independently) among `units`: a chain of L units costs ceil(L / per_request)
    requests, unless all its units are `sparse` (probability sparse**L), when it costs
    L x sparse_cost."""
    reads = 0.0
    for L in range(1, units + 1):
        qL = q ** L
        if qL < 1e-12:
            break
        chains = qL if L == units else ((units - L - 1) * (1 - q) ** 2 + 2 * (1 - q)) * qL
        all_sparse = sparse ** L
        reads += chains * (all_sparse * L * sparse_cost + (1 - all_sparse) * math.ceil(L / per_request))
    return reads


def expected_device_reads(rows: int, row_bytes: int, lookups: float, dense_page_rows: int = DENSE_PAGE_ROWS,
                          vector_grained: bool = True, page_size: int = PAGE_SIZE) -> float:
    """Device requests the SLS engine issues for one batch of ``lookups`` uniformly drawn ids
    of a packed table (``SlsEngine``'s read rule, caches off): ids de-duplicated; a page with
    ``dense_page_rows`` or more of the batch's rows is read whole, and so is every touched page
    in a chain of adjacent touched pages that holds such a page, in requests of up to
    ``PAGES_PER_READ`` pages; the other rows are 512-byte block reads, adjacent blocks merged
    up to 4 KiB. Rows per page (block) are Poisson (uniform ids); ``vector_grained=False``
    reads every touched page whole. Uniform ids are the worst case for page density, so skewed
    traces issue fewer requests than this."""
    if rows <= 0 or lookups <= 0:
        return 0.0
    unique = rows * -math.expm1(-lookups / rows)
    if vector_grained and dense_page_rows <= 0:  # block reads only
        unit = max(DEVICE_BLOCK, -(-row_bytes // DEVICE_BLOCK) * DEVICE_BLOCK)
        per_unit = max(1, DEVICE_BLOCK // max(1, row_bytes))
        units = math.ceil(rows / per_unit)
        return _chain_requests(units, -math.expm1(-unique / units), max(1, 4096 // unit))
    per_page = max(1, (page_size - PAGE_HEADER_BYTES) // max(1, row_bytes))
    pages = math.ceil(rows / per_page)
    lam = unique / pages                      # rows of the batch per page
    q = -math.expm1(-lam)                     # a page is touched
    if not vector_grained or q <= 0:
        return _chain_requests(pages, q, PAGES_PER_READ) if q > 0 else 0.0
    pk = [math.exp(-lam)]                     # Poisson(lam) at 0 .. dense_page_rows - 1
    for k in range(1, dense_page_rows):
        pk.append(pk[-1] * lam / k)
    sparse = sum(pk[1:]) / q                  # a touched page holds fewer than dense_page_rows
    rows_sparse = sum(k * pk[k] for k in range(1, dense_page_rows)) / max(1e-300, sum(pk[1:]))
    return _chain_requests(pages, q, PAGES_PER_READ, sparse, rows_sparse)


# What the engine keeps in DRAM for SSD tables, counted against ``dram_budget_bytes``:
READ_BUFFER_BYTES = 32 * (256 << 10) + 128 * 4096  # a read ring's slots (StoreOptions queue_depth x
                                                    # max_io_bytes) and the block-read ring's
BLOCK_SUM_PAGE_BYTES = 64  # a page's entry in the block-checksum map (hash node, seq, headers) besides its sums
MAX_GATHER_BYTES = 16 << 20  # the SSD kernel's bound on the rows one engine call holds (max_gather_bytes)


def ssd_resident_bytes(rows: int, dim: int, page_size: int = PAGE_SIZE, dtype: str = "float32") -> int:
    """DRAM the engine keeps for an SSD table once its pages have been read: a 4-byte checksum
    per 512-byte block of each page (vector-grained reads are verified against them) and the
    map entry holding them; about 1.2 % of the table's bytes. ``dtype``: the rows' type in the store."""
    per_page = max(1, (page_size - PAGE_HEADER_BYTES) // stored_row_bytes(dim, dtype))
    return math.ceil(rows / per_page) * (4 * (page_size // DEVICE_BLOCK) + BLOCK_SUM_PAGE_BYTES)


def _engine_share(t: "TableDemand", batch_size: int) -> tuple:
    """One SSD table's part of ``engine_dram_bytes``: (its block checksums, one call's rows).
    Exact (a Fraction of the pooling factor), so sums taken in any order, or kept running by
    subtraction (``tier_tables``), give the same bytes."""
    return (ssd_resident_bytes(t.rows, t.dim, dtype=t.dtype),
            2 * t.row_bytes * batch_size * fractions.Fraction(t.pooling_factor))


def _engine_total(resident: int, rows: float, max_gather_bytes: int = MAX_GATHER_BYTES) -> int:
    return int(READ_BUFFER_BYTES + resident + min(max_gather_bytes, rows))


def engine_dram_bytes(ssd: Sequence["TableDemand"], batch_size: int, max_gather_bytes: int = MAX_GATHER_BYTES) -> int:
    """DRAM the SLS engine needs to serve the SSD tables ``ssd`` at ``batch_size``: its read
    buffers, the tables' block checksums (``ssd_resident_bytes``) and one call's rows (the SSD
    kernel holds about 2 x ids x row bytes per call, at most ``max_gather_bytes``). 0 without
    SSD tables. The engine's caches (``cache_bytes``) come on top."""
    if not ssd:
        return 0
    shares = [_engine_share(t, batch_size) for t in ssd]
    return _engine_total(sum(r for r, _ in shares), sum(g for _, g in shares), max_gather_bytes)


@dataclasses.dataclass
class TableDemand:
    """One table's numbers in the tiering decision."""
    name: str
    rows: int
    dim: int
    pooling_factor: float        # ids per sample over all features of the table
    dram_bytes: int              # the rows in DRAM (a quantized model's: its int8 / float16 rows)
    ssd_row_bytes: int           # device bytes of one row read
    bandwidth: float             # demanded bytes/s if on SSD = qps x pooling x ssd_row_bytes
    tier: str = ""               # "dram" | "ssd"
    dtype: str = "float32"       # the rows' type in the store (an SSD table's reads, pages, buffers)

    @property
    def row_bytes(self) -> int:  # one row in the store
        return stored_row_bytes(self.dim, self.dtype)

    @property
    def density(self) -> float:  # demanded bandwidth per DRAM byte
        return self.bandwidth / max(1, self.dram_bytes)


@dataclasses.dataclass
class TieringReport:
    """What ``plan_offload`` decided and what it demands of the SSD."""
    qps: float
    dram_budget_bytes: Optional[int]
    tables: List[TableDemand]
    device_iops: Optional[float] = None   # measured 512 B random-read IOPS at deep queue, if known
    batch_size: Optional[int] = None      # the batch the plan is for (plan_offload's batch_size)
    engine_dram_counted: bool = False     # the budget paid for the engine's DRAM (tier_tables' engine_batch_size)

    @property
    def ssd_tables(self) -> List[str]:
        return [t.name for t in self.tables if t.tier == "ssd"]

    @property
    def dram_tables(self) -> List[str]:
        return [t.name for t in self.tables if t.tier == "dram"]

    @property
    def dram_bytes(self) -> int:
        return sum(t.dram_bytes for t in self.tables if t.tier == "dram")

    @property
    def engine_dram_bytes(self) -> int:
        """What the engine keeps in DRAM for the SSD tables at the plan's batch (``engine_dram_bytes``)."""
        return engine_dram_bytes([t for t in self.tables if t.tier == "ssd"], self.batch_size or 1)

    @property
    def over_budget_bytes(self) -> int:
        """How far DRAM tables (plus the engine's DRAM, when counted) pass the budget; 0 within it."""
        if self.dram_budget_bytes is None:
            return 0
        total = self.dram_bytes + (self.engine_dram_bytes if self.engine_dram_counted else 0)
        return max(0, total - self.dram_budget_bytes)

    @property
    def ssd_reads_per_sample(self) -> float:
        """Row reads per sample the SSD tables need (before de-duplication and caches)."""
        return sum(t.pooling_factor for t in self.tables if t.tier == "ssd")  # one read per row

    def ssd_device_reads_per_sample(self, batch_size: int, dense_page_rows: int = DENSE_PAGE_ROWS,
                                    vector_grained: bool = True) -> float:
        """Device requests per sample the SSD tables cost at ``batch_size`` with the engine's
        read rule (``expected_device_reads``): de-duplication within a batch and whole-page
        runs where a batch's rows are dense; uniform ids."""
        if batch_size <= 0:
            raise InvalidArgumentError(f"ssd_device_reads_per_sample: batch_size must be > 0, got {batch_size}")
        return sum(expected_device_reads(t.rows, t.row_bytes, batch_size * t.pooling_factor, dense_page_rows,
                                         vector_grained) for t in self.tables if t.tier == "ssd") / batch_size

    @property
    def ssd_reads_per_s(self) -> float:
        return self.qps * self.ssd_reads_per_sample

    @property
    def ssd_bytes_per_s(self) -> float:
        return sum(t.bandwidth for t in self.tables if t.tier == "ssd")

    @property
    def device_fraction(self) -> Optional[float]:
        """Demanded SSD reads/s as a fraction of the device's random-read IOPS."""
        return self.ssd_reads_per_s / self.device_iops if self.device_iops else None

    def to_dict(self) -> dict:
        return {"qps": self.qps, "dram_budget_bytes": self.dram_budget_bytes, "device_iops": self.device_iops,
                "dram_bytes": self.dram_bytes, "ssd_reads_per_sample": self.ssd_reads_per_sample,
                "ssd_reads_per_s": self.ssd_reads_per_s, "ssd_bytes_per_s": self.ssd_bytes_per_s,
                "device_fraction": self.device_fraction, "batch_size": self.batch_size,
                "engine_dram_bytes": self.engine_dram_bytes, "engine_dram_counted": self.engine_dram_counted,
                "over_budget_bytes": self.over_budget_bytes,
                "ssd_device_reads_per_sample": (self.ssd_device_reads_per_sample(self.batch_size)
                                                if self.batch_size else None),
                "tables": [dict(dataclasses.asdict(t), density=t.density) for t in self.tables]}

    def render(self, console=None) -> None:
        """Prints the decision as a table (rich)."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console(width=max(118, shutil.get_terminal_size((118, 24)).columns))
        title = f"recflash tiering at {self.qps:,.0f} samples/s"
        if self.dram_budget_bytes is not None:
            title += f", DRAM budget {_mib(self.dram_budget_bytes)}"
        tab = Table(title=title)
        for col in ("table", "rows x dim", "pooling", "DRAM bytes", "SSD row read", "demanded BW",
                    "BW per DRAM byte", "tier"):
            tab.add_column(col, justify="left" if col in ("table", "tier") else "right")
        for t in sorted(self.tables, key=lambda t: -t.density):
            shape = f"{t.rows:,} x {t.dim}" + ("" if t.dtype == "float32" else f" {t.dtype}")
            tab.add_row(t.name, shape, f"{t.pooling_factor:g}", _mib(t.dram_bytes),
                        f"{t.ssd_row_bytes} B", f"{t.bandwidth / 1e6:,.2f} MB/s", f"{t.density:.3g}/s",
                        "[green]DRAM[/]" if t.tier == "dram" else "[yellow]SSD[/]")
        console.print(tab)
        line = (f"DRAM tables: {_mib(self.dram_bytes)}; SSD tables demand {self.ssd_reads_per_s:,.0f} reads/s "
                f"({self.ssd_bytes_per_s / 1e6:,.1f} MB/s)")
        if self.device_iops:
            line += f" = {100 * self.device_fraction:.1f} % of the device's {self.device_iops:,.0f} random-read IOPS"
        else:
            line += " (device IOPS not measured: pass device_iops= or measure_device_iops(dir))"
        console.print(line)
        if self.ssd_tables:
            line = (f"The engine keeps about {_mib(self.engine_dram_bytes)} of DRAM for the SSD tables at batch "
                    f"{self.batch_size or 1} (read buffers, block checksums, one call's rows)")
            if self.dram_budget_bytes is not None and self.engine_dram_counted:
                line += (f"; with the DRAM tables {_mib(self.dram_bytes + self.engine_dram_bytes)} of the "
                         f"{_mib(self.dram_budget_bytes)} budget")
            console.print(line)
        if self.over_budget_bytes:
            console.print(f"[red]The budget is passed by {_mib(self.over_budget_bytes)}[/]: even with every table on SSD "
                          f"the engine needs more DRAM than the budget gives (a smaller batch_size needs less)")
        if self.batch_size and self.ssd_tables:
            per = self.ssd_device_reads_per_sample(self.batch_size)
            console.print(f"At batch {self.batch_size} the engine issues about {per:,.1f} device requests per sample "
                          f"({per * self.qps:,.0f}/s): batch de-duplication, dense pages read whole (uniform ids)")


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def tier_tables(demands: Sequence[TableDemand], dram_budget_bytes: int,
                engine_batch_size: Optional[int] = None) -> List[TableDemand]:
    """SDM's placement: DRAM to the highest bandwidth per DRAM byte first, until the budget is used.

    With ``engine_batch_size`` the budget also pays for what the engine keeps in DRAM for the
    tables left on SSD at that batch (``engine_dram_bytes``): a table goes to DRAM only if its
    rows plus the engine's share for the rest still fit. Without SSD tables there is no engine
    share; when even all tables on SSD do not fit, all go to SSD (the report says by how much
    the budget is passed)."""
    if sum(t.dram_bytes for t in demands) <= int(dram_budget_bytes):  # all in DRAM: no engine at all
        for t in demands:
            t.tier = "dram"
        return list(demands)
    # The engine's share of the tables still on SSD, kept as running sums (engine_dram_bytes
    # of the rest, without re-adding every remaining table for each candidate).
    shares = {id(t): _engine_share(t, engine_batch_size) if engine_batch_size else (0, 0) for t in demands}
    left, resident, rows = len(demands), sum(r for r, _ in shares.values()), sum(g for _, g in shares.values())
    used = 0
    for t in sorted(demands, key=lambda t: (-t.density, t.name)):
        r, g = shares[id(t)]
        engine = _engine_total(resident - r, rows - g) if engine_batch_size and left > 1 else 0
        if used + t.dram_bytes + engine <= int(dram_budget_bytes):
            t.tier = "dram"
            used += t.dram_bytes
            left, resident, rows = left - 1, resident - r, rows - g
        else:
            t.tier = "ssd"
    return list(demands)


# -- estimators -------------------------------------------------------------------------------

class _SsdAwareEstimator(ShardEstimator):
    """TorchRec's own estimator for every kernel but the SSD one, which ``estimate_ssd`` prices."""

    _default: ShardEstimator

    def estimate(self, sharding_options, sharder_data_map) -> None:
        rest = [so for so in sharding_options if so.compute_kernel != SSD_KERNEL]
        if rest:
            self._default.estimate(rest, sharder_data_map)
        for so in sharding_options:
            if so.compute_kernel == SSD_KERNEL:
                self.estimate_ssd(so)

    def estimate_ssd(self, so) -> None:
        raise NotImplementedError


class SsdPerfEstimator(_SsdAwareEstimator):
    """TorchRec's perf estimator, plus the SSD kernel: forward = device reads / device IOPS."""

    def __init__(self, topology: Topology, constraints: Optional[Dict[str, ParameterConstraints]] = None,
                 device_iops: Optional[float] = None) -> None:
        self._topology = topology
        self._constraints = constraints
        self._iops = device_iops or 80_000.0  # SPEC's measured 512 B random-read IOPS when none is given
        self._default = EmbeddingPerfEstimator(topology, constraints, is_inference=True)

    def estimate_ssd(self, so) -> None:
        reads = so.batch_size * sum(so.input_lengths) * self._topology.world_size  # whole global batch
        ms = 1e3 * reads / self._iops
        for shard in so.shards:
            shard.perf = Perf(fwd_compute=ms, fwd_comms=0.0, bwd_compute=0.0, bwd_comms=0.0)


class SsdStorageEstimator(_SsdAwareEstimator):
    """TorchRec's storage estimator, plus the SSD kernel: rows on ``Storage.ssd``, never DDR."""

    def __init__(self, topology: Topology, constraints: Optional[Dict[str, ParameterConstraints]] = None,
                 ssd_row_bytes_of: Optional[Dict[str, int]] = None, cache_bytes: int = 0) -> None:
        self._row_bytes = ssd_row_bytes_of or {}
        self._cache_bytes = int(cache_bytes)
        self._default = EmbeddingStorageEstimator(topology, constraints, is_inference=True)

    def estimate_ssd(self, so) -> None:
        rows, dim = so.tensor.shape
        row_bytes = self._row_bytes.get(so.name, 4 * dim)
        for shard in so.shards:
            # The SLS engine's caches are the only DRAM an SSD table uses.
            shard.storage = Storage(hbm=0, ddr=self._cache_bytes, ssd=int(rows * row_bytes))


# -- the public entry point -------------------------------------------------------------------

@dataclasses.dataclass
class OffloadPlan(ShardingPlan):
    """A TorchRec ``ShardingPlan`` plus the tiering decision behind it."""
    tiering: Optional[TieringReport] = None


def _is_quant_ebc(m: nn.Module) -> bool:
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection

    return isinstance(m, QuantEmbeddingBagCollection)


def _ebcs(model: nn.Module) -> Dict[str, EmbeddingBagCollection]:
    out = {fqn: m for fqn, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)}
    if not out:
        if any(_is_quant_ebc(m) for m in model.modules()):
            raise InvalidArgumentError("plan_offload: the model is quantized (QuantEmbeddingBagCollection): tier its "
                                       "tables with plan_quant_offload and shard it with shard_quant_model_with_ssd")
        raise InvalidArgumentError("plan_offload: the model has no EmbeddingBagCollection")
    return out


def _table_configs(modules, who: str) -> dict:
    """{table name: EmbeddingBagConfig} over the modules; a name in two of them is an error."""
    configs = {}
    for m in modules:
        for c in m.embedding_bag_configs():
            if c.name in configs:
                raise InvalidArgumentError(f"{who}: table name '{c.name}' appears in two embedding bag collections")
            configs[c.name] = c
    return configs


def _tier(who: str, configs: dict, dtypes: Dict[str, Tuple[str, str]], ssd_tables, dram_budget_bytes, qps: float,
          pooling_factors, batch_size: int, device_iops, count_engine_dram: bool) -> TieringReport:
    """The tiering decision over `configs`; dtypes: table -> (its rows' type in DRAM, in the store)."""
    pooling_factors = dict(pooling_factors or {})
    unknown = sorted(set(pooling_factors) - set(configs))
    if unknown:
        raise UnknownFeatureError(f"{who}: pooling_factors name unknown table(s) {', '.join(unknown)} "
                                  f"(tables: {', '.join(sorted(configs))})")
    demands = []
    for name, c in configs.items():
        pf = float(pooling_factors.get(name, len(c.feature_names)))
        in_dram, on_ssd = dtypes[name]
        rb = ssd_row_bytes(c.embedding_dim, on_ssd)
        demands.append(TableDemand(name=name, rows=c.num_embeddings, dim=c.embedding_dim, pooling_factor=pf,
                                   dram_bytes=c.num_embeddings * stored_row_bytes(c.embedding_dim, in_dram),
                                   ssd_row_bytes=rb, bandwidth=qps * pf * rb, dtype=on_ssd))
    if ssd_tables is not None:
        ssd_set = set(ssd_tables)
        missing = sorted(ssd_set - set(configs))
        if missing:
            raise UnknownFeatureError(f"{who}: ssd_tables name unknown table(s) {', '.join(missing)} "
                                      f"(the model's tables: {', '.join(sorted(configs))})")
        for t in demands:
            t.tier = "ssd" if t.name in ssd_set else "dram"
    else:
        if dram_budget_bytes < 0:
            raise InvalidArgumentError(f"{who}: dram_budget_bytes must be >= 0, got {dram_budget_bytes}")
        tier_tables(demands, dram_budget_bytes, batch_size if count_engine_dram else None)
    return TieringReport(qps=qps, dram_budget_bytes=dram_budget_bytes, tables=demands, device_iops=device_iops,
                         batch_size=batch_size, engine_dram_counted=bool(count_engine_dram))


def plan_offload(model: nn.Module, world_size: int, ssd_tables: Optional[Sequence[str]] = None,
                 dram_budget_bytes: Optional[int] = None, qps: float = DEFAULT_QPS,
                 pooling_factors: Optional[Dict[str, float]] = None, ssd_cap_bytes: Optional[int] = None,
                 batch_size: int = 512, device_iops: Optional[float] = None, store_path=None,
                 dram_sharding_type: str = ShardingType.TABLE_WISE.value, cache_bytes: int = 0,
                 print_table: bool = True, count_engine_dram: bool = True) -> OffloadPlan:
    """A TorchRec ``ShardingPlan`` with the SSD tables on recflash's kernel.

    Give either ``ssd_tables`` (names) or ``dram_budget_bytes`` (SDM tiering by demanded
    bandwidth per DRAM byte at ``qps`` samples/s with ``pooling_factors`` ids per sample per
    table, default 1 per feature). ``ssd_cap_bytes`` is each rank's SSD capacity (default: the
    free space of ``store_path``'s file system, else 2 TiB); ``device_iops`` the device's
    measured random-read IOPS (see ``measure_device_iops``). ``store_path``, when given, is
    checked to hold every SSD table with the model's shape. The returned plan's ``tiering``
    holds the decision; ``print_table`` prints it. With ``count_engine_dram`` (default) the
    budget also pays for what the engine keeps in DRAM for the SSD tables at ``batch_size``
    (read buffers, block checksums, one call's rows: ``engine_dram_bytes``), so DRAM tables
    plus the engine stay within it; the engine's caches (``cache_bytes``) are not part of it.
    """
    if (ssd_tables is None) == (dram_budget_bytes is None):
        raise InvalidArgumentError("plan_offload: give exactly one of ssd_tables= or dram_budget_bytes=")
    if world_size < 1:
        raise InvalidArgumentError(f"plan_offload: world_size must be >= 1, got {world_size}")
    configs = _table_configs(_ebcs(model).values(), "plan_offload")
    report = _tier("plan_offload", configs, {n: ("float32", "float32") for n in configs}, ssd_tables,
                   dram_budget_bytes, qps, pooling_factors, batch_size, device_iops, count_engine_dram)
    demands = report.tables

    if store_path is not None:
        _check_store(store_path, [t for t in demands if t.tier == "ssd"], world_size, "plan_offload")
    if ssd_cap_bytes is None:
        ssd_cap_bytes = (shutil.disk_usage(os.path.dirname(os.path.abspath(os.fspath(store_path)).replace("{rank}", "0"))).free
                         if store_path is not None and not str(store_path).startswith("unix:") else 2 << 40)
    constraints = {}
    for t in demands:
        c = configs[t.name]
        pfs = [t.pooling_factor / len(c.feature_names)] * len(c.feature_names)
        if t.tier == "ssd":
            constraints[t.name] = ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value],
                                                       compute_kernels=[SSD_KERNEL], pooling_factors=pfs)
        else:
            kernels = ["dense"] if dram_sharding_type == ShardingType.DATA_PARALLEL.value else [FUSED_KERNEL]
            constraints[t.name] = ParameterConstraints(sharding_types=[dram_sharding_type],
                                                       compute_kernels=kernels, pooling_factors=pfs)
    ddr_cap = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # the machine's DRAM
    topology = TopologyFactory.create_topology(
        TrainerConfig(world_size=world_size, local_world_size=world_size, ddr_cap_bytes=ddr_cap,
                      ssd_cap_bytes=int(ssd_cap_bytes)),
        kernel_config=KernelConfig(compute_device="cpu"))
    estimators = [SsdPerfEstimator(topology, constraints, device_iops),
                  SsdStorageEstimator(topology, constraints, {t.name: t.ssd_row_bytes for t in demands}, cache_bytes)]
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=batch_size, constraints=constraints,
                                     estimator=estimators)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch_size, constraints=constraints,
                                       enumerator=enumerator, debug=False)
    plan = planner.plan(model, [SsdEmbeddingBagCollectionSharder(None)])
    if print_table:
        report.render()
    return OffloadPlan(plan=plan.plan, tiering=report)


def _check_store(store_path, ssd: List[TableDemand], world_size: int, who: str, tables: Optional[dict] = None) -> None:
    """Every SSD table exists in the store with the model's shape (clear errors before sharding).
    ``tables``: the single store's tables when the caller has read them already (``_store_tables``)."""
    from recflash.torchrec_ext.backend import is_device_address

    if not ssd or is_device_address(store_path):
        return
    from recflash.ndp import EmbeddingStore
    from recflash.reader import Store
    from recflash.reader.errors import NotAStoreError, SchemaError

    paths = [os.fspath(store_path).replace("{rank}", str(r)) for r in range(world_size)] \
        if "{rank}" in os.fspath(store_path) else [os.fspath(store_path)]
    for p in paths:
        if not os.path.isdir(p):
            raise NotAStoreError(f"{who}: embedding store '{p}' does not exist")
        if tables is not None and len(paths) == 1:
            have = tables
        else:
            with Store.open(p, read_only=True) as s:
                have = EmbeddingStore(s).tables()
        if len(paths) > 1:
            continue  # per-rank stores hold only the tables their rank serves
        for t in ssd:
            if t.name not in have:
                raise UnknownFeatureError(f"{who}: table '{t.name}' is planned on SSD but the store '{p}' "
                                          f"has no such table (it has: {', '.join(sorted(have)) or 'none'})")
            h = have[t.name]
            if (h.num_rows, h.dim) != (t.rows, t.dim):
                raise SchemaError(f"{who}: table '{t.name}' is {t.rows} x {t.dim} in the model but "
                                  f"{h.num_rows} x {h.dim} in the store '{p}'")


def _store_tables(store_path) -> Optional[dict]:
    """{table: TableInfo} of the single store at `store_path`, or None (no store given, a device
    address, per-rank stores whose tables the ranks hold apart, or no store there yet)."""
    from recflash.torchrec_ext.backend import is_device_address

    if store_path is None or is_device_address(store_path) or "{rank}" in os.fspath(store_path) \
            or not os.path.isdir(os.fspath(store_path)):
        return None
    from recflash.ndp import EmbeddingStore
    from recflash.reader import Store

    with Store.open(os.fspath(store_path), read_only=True) as s:
        return EmbeddingStore(s).tables()


def plan_quant_offload(model: nn.Module, ssd_tables: Optional[Sequence[str]] = None,
                       dram_budget_bytes: Optional[int] = None, qps: float = DEFAULT_QPS,
                       pooling_factors: Optional[Dict[str, float]] = None, batch_size: int = 512,
                       device_iops: Optional[float] = None, store_path=None, world_size: int = 1,
                       count_engine_dram: bool = True, print_table: bool = True) -> TieringReport:
    """The DRAM/SSD tiering of a quantized model's tables, for ``shard_quant_model_with_ssd``::

        report = plan_quant_offload(qmodel, dram_budget_bytes=64 << 20, store_path="/data/emb_store")
        sharded, plan = shard_quant_model_with_ssd(qmodel, report.ssd_tables, "/data/emb_store")

    ``model`` is what ``quantize_inference_model`` returns. The decision is ``plan_offload``'s
    (SDM's bandwidth per DRAM byte, the engine's DRAM paid from the budget; the same
    arguments), with each table costed in the rows it really holds: a DRAM table its quantized
    rows (int8: dim + 4 bytes, its float16 scale and bias; float16: 2 x dim), an SSD table the
    rows the store at ``store_path`` holds for it (``export_quantized_tables`` writes the
    model's own rows, ``export_tables`` of the float model float32 ones), or the model's own
    rows when it is not there yet or no store is given. ``store_path``, when given, is checked
    to hold every SSD table with the model's shape.
    """
    from recflash.torchrec_ext.quant import _DTYPE_OF

    who = "plan_quant_offload"
    if (ssd_tables is None) == (dram_budget_bytes is None):
        raise InvalidArgumentError(f"{who}: give exactly one of ssd_tables= or dram_budget_bytes=")
    if world_size < 1:
        raise InvalidArgumentError(f"{who}: world_size must be >= 1, got {world_size}")
    quant = [m for m in model.modules() if _is_quant_ebc(m)]
    if not quant:
        raise InvalidArgumentError(f"{who}: the model has no QuantEmbeddingBagCollection (quantize it with "
                                   f"torchrec.inference.modules.quantize_inference_model; a float model is planned by "
                                   f"plan_offload)")
    configs = _table_configs(quant, who)
    in_store = _store_tables(store_path)  # read once: for the costing and the check below
    dtypes = {}
    for name, c in configs.items():
        dt = _DTYPE_OF.get(c.data_type)
        if dt is None:
            raise InvalidArgumentError(f"{who}: table '{name}' is {c.data_type}; the store holds int8, float16 or "
                                       f"float32 rows")
        dtypes[name] = (dt, in_store[name].dtype if in_store and name in in_store else dt)
    report = _tier(who, configs, dtypes, ssd_tables, dram_budget_bytes, qps, pooling_factors, batch_size,
                   device_iops, count_engine_dram)
    if store_path is not None:
        _check_store(store_path, [t for t in report.tables if t.tier == "ssd"], world_size, who, in_store)
    if print_table:
        report.render()
    return report


def measure_device_iops(directory, seconds: float = 3.0, block: int = 512, iodepth: int = 64,
                        file_mib: int = 512) -> float:
    """512 B random-read IOPS at deep queue on `directory`'s device (fio, io_uring, O_DIRECT).

    The probe file is fully written first (reads of holes never reach the device)."""
    fio = shutil.which("fio")
    if fio is None:
        raise RuntimeError("measure_device_iops needs fio (apt-get install fio)")
    with tempfile.TemporaryDirectory(dir=directory, prefix=".iops-") as d:
        f = os.path.join(d, "probe")
        subprocess.run([fio, "--name=fill", f"--filename={f}", f"--size={file_mib}M", "--rw=write", "--bs=1M",
                        "--direct=1", "--ioengine=psync", "--output-format=json"], check=True, capture_output=True)
        r = subprocess.run([fio, "--name=rr", f"--filename={f}", f"--size={file_mib}M", "--rw=randread",
                            f"--bs={block}", "--direct=1", "--ioengine=io_uring", f"--iodepth={iodepth}",
                            "--time_based", f"--runtime={seconds}", "--output-format=json"],
                           check=True, capture_output=True, text=True)
        return float(json.loads(r.stdout)["jobs"][0]["read"]["iops"])
