"""Baseline strategies and the shared workload of benchmarks/compaction.py: the paper's LSM
strategy (lsm.py), the read-optimal strategy (opt.py), real RocksDB through a C++ harness
(rocksdb.py, ../csrc/rocksdb_bench.cc) and the O_DIRECT page reader both lsm and opt read
with (../csrc/page_reader.cc)."""
