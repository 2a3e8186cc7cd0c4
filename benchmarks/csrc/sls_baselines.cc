// SLS baselines of the I/O methods study (thesis, seed 004 §4-5) for benchmarks/sls_io.py.
//
// The embedding tables live in one flat file: T tables one after the other, each N rows of
// D float32 (row-major), table t at byte t * N * D * 4. A trace file (ndp/traces.py,
// save_trace) holds batches; each batch has one request per table (bags of row ids). Every
// method runs the same SLS as recflash's engine (ndp/csrc/sls.cc): per request the ids are
// sorted with their positions and de-duplicated, each unique row is fetched once, then the
// bags are pooled (sum or mean) in index order. Only the way a row is fetched differs:
//
//   io_buf    fseeko + fread through a stdio buffer (--stdio-buf bytes, default 4096 — glibc's
//             default for this file system); buffered I/O through the page cache.
//   io_unbuf  one pread per row; O_DIRECT where the file system allows (the read covers the
//             row's logical blocks, 512 B when the device accepts it), else a buffered pread.
//   mmap      the file mapped (MAP_SHARED, default advice — page faults read around the faulting
//             page, up to the device's read_ahead_kb); rows copied from the mapping.
//             --madvise-random: MADV_RANDOM (one page per fault) instead.
//   ram       the whole file read into DRAM first (O_DIRECT, 8 MiB reads; timed separately).
//   ratio     the first --dram-fraction of every table preloaded in DRAM; other rows as io_unbuf.
//   opt       a profiling pass over --profile TRACE counts accesses per --chunk-bytes region;
//             the hottest regions (over all tables) up to --dram-fraction of the data are
//             preloaded; other rows as io_unbuf.
//   uring     reference, not in the thesis: the unique rows read with io_uring, O_DIRECT, one
//             logical-block-aligned read per row, --qd in flight (no merging).
//
// Usage: sls_baselines --file F --tables T --rows N --dim D --method M [options] TRACE...
//   --dram-fraction F   ratio/opt preload budget (fraction of the file)
//   --profile P         trace for opt's profiling pass     --chunk-bytes B  opt region size
//   --stdio-buf B       io_buf's stdio buffer               --qd Q           uring depth
//   --dev MAJ:MIN       block device for /proc/diskstats deltas
//   --madvise-random    mmap with MADV_RANDOM
//   --drop-caches       drop the page cache (and reopen / remap the file) before every batch, outside
//                       the timed region: every batch starts cold
//   --time-budget S     stop a trace after the batch that crosses S seconds (>= --min-batches)
//   --min-batches K     --max-batches K
//   --dump PATH         write the pooled outputs of the first batch of the first trace
// Prints one JSON document on stdout: the method, preload figures, and per trace ("point"):
// batches run, lookups, unique rows, rows served from DRAM / the file, batch latencies
// (mean, p50, p90, min, max), wall and CPU seconds, /proc/diskstats deltas of the device
// (read requests, merges, bytes; writes too, to expose other traffic), /proc/self/io
// read_bytes delta (this process's own storage reads), VmRSS / VmHWM, and a checksum.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "sls_baselines: %s\n", msg.c_str());
  std::exit(2);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

// ---------------------------------------------------------------------------------------
// Measurements

struct DiskStat {
  bool ok = false;
  uint64_t rd_ios = 0, rd_merges = 0, rd_sectors = 0, rd_ticks = 0, wr_ios = 0, wr_sectors = 0;
};

DiskStat ReadDiskstats(int major, int minor) {
  DiskStat d;
  if (major < 0) return d;
  std::ifstream f("/proc/diskstats");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    int ma, mi;
    std::string name;
    uint64_t v[11] = {};
    if (!(is >> ma >> mi >> name)) continue;
    for (auto& x : v) is >> x;
    if (ma == major && mi == minor) {
      d.ok = true;
      d.rd_ios = v[0];
      d.rd_merges = v[1];
      d.rd_sectors = v[2];
      d.rd_ticks = v[3];
      d.wr_ios = v[4];
      d.wr_sectors = v[6];
      break;
    }
  }
  return d;
}

uint64_t ProcReadBytes() {
  std::ifstream f("/proc/self/io");
  std::string k;
  uint64_t v;
  while (f >> k >> v)
    if (k == "read_bytes:") return v;
  return 0;
}

void ProcMem(uint64_t* rss, uint64_t* hwm) {
  std::ifstream f("/proc/self/status");
  std::string line;
  *rss = *hwm = 0;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) *rss = std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    if (line.rfind("VmHWM:", 0) == 0) *hwm = std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
}

// Drops clean page-cache pages (no sync: the table file is never written while measuring, and a
// sync would push other processes' dirty data out on this shared machine).
bool DropCaches() {
  int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd < 0) return false;
  bool ok = write(fd, "3\n", 2) == 2;
  close(fd);
  return ok;
}

// ---------------------------------------------------------------------------------------
// Traces

struct Req {
  uint32_t table = 0, mode = 0;
  std::vector<int64_t> offsets, indices;
};
using Batch = std::vector<Req>;

std::vector<Batch> LoadTrace(const std::string& path, uint32_t tables, uint64_t rows) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) Die("cannot open trace " + path + ": " + std::strerror(errno));
  auto rd = [&](void* p, size_t n) {
    if (n && std::fread(p, 1, n, f) != n) Die("truncated trace " + path);
  };
  char magic[8];
  uint32_t nb, nt;
  uint64_t reserved;
  rd(magic, 8);
  rd(&nb, 4);
  rd(&nt, 4);
  rd(&reserved, 8);
  if (std::memcmp(magic, "RFSLSTR1", 8) != 0) Die(path + " is not an SLS trace");
  std::vector<Batch> out(nb);
  for (auto& b : out) {
    b.resize(nt);
    for (auto& r : b) {
      uint64_t nbags, nidx;
      rd(&r.table, 4);
      rd(&r.mode, 4);
      rd(&nbags, 8);
      rd(&nidx, 8);
      r.offsets.resize(nbags);
      r.indices.resize(nidx);
      rd(r.offsets.data(), 8 * nbags);
      rd(r.indices.data(), 8 * nidx);
      if (r.table >= tables) Die("trace " + path + " names table " + std::to_string(r.table));
      for (int64_t x : r.indices)
        if (x < 0 || static_cast<uint64_t>(x) >= rows) Die("trace " + path + ": row id out of range");
      for (size_t i = 0; i < nbags; i++)
        if (r.offsets[i] < 0 || static_cast<uint64_t>(r.offsets[i]) > nidx || (i && r.offsets[i] < r.offsets[i - 1]))
          Die("trace " + path + ": bad offsets");
    }
  }
  std::fclose(f);
  return out;
}

// ---------------------------------------------------------------------------------------
// Row sources

struct Layout {
  std::string file;
  uint32_t tables = 0;
  uint64_t rows = 0;
  uint32_t dim = 0;
  uint64_t row_bytes() const { return 4ull * dim; }
  uint64_t table_bytes() const { return rows * row_bytes(); }
  uint64_t row_offset(uint32_t t, uint64_t r) const { return t * table_bytes() + r * row_bytes(); }
  uint64_t file_bytes() const { return tables * table_bytes(); }
};

struct Counters {
  uint64_t dram_rows = 0, file_rows = 0, reads = 0, read_bytes = 0;
};

void* AlignedAlloc(size_t bytes, size_t align = 4096) {
  void* p = nullptr;
  if (posix_memalign(&p, align, std::max<size_t>(bytes, align)) != 0) Die("out of memory");
  return p;
}

// An fd opened with O_DIRECT when possible; reads of any range through an aligned bounce.
class DirectFile {
 public:
  void Open(const std::string& path) {
    fd_ = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    direct_ = fd_ >= 0;
    if (!direct_) fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) Die("cannot open " + path + ": " + std::strerror(errno));
    bounce_ = static_cast<uint8_t*>(AlignedAlloc(kBounce));
    block_ = 1;
    if (direct_) {
      // The smallest accepted alignment: 512 B where the device allows, else 4096.
      block_ = 4096;
      if (pread(fd_, bounce_, 512, 512) >= 0 || errno != EINVAL) block_ = 512;
    }
  }
  ~DirectFile() {
    if (fd_ >= 0) close(fd_);
    std::free(bounce_);
  }
  bool direct() const { return direct_; }
  uint32_t block() const { return block_; }
  int fd() const { return fd_; }

  // Reads [off, off + len) into dst (any alignment); returns the bytes requested from the file.
  uint64_t Read(uint64_t off, uint64_t len, uint8_t* dst, uint64_t* requests) {
    uint64_t asked = 0;
    while (len > 0) {
      const uint64_t lo = off / block_ * block_;
      const uint64_t hi = std::min<uint64_t>((off + len + block_ - 1) / block_ * block_, lo + kBounce);
      const uint64_t n = hi - lo;
      uint64_t got = 0;
      while (got < n) {
        ssize_t r = pread(fd_, bounce_ + got, n - got, lo + got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) Die(std::string("pread: ") + std::strerror(errno));
        (*requests)++;
        if (r == 0) break;
        got += r;
      }
      if (lo + got <= off) Die("read beyond the end of the file");
      const uint64_t take = std::min<uint64_t>(len, lo + got - off);
      std::memcpy(dst, bounce_ + (off - lo), take);
      asked += n;
      dst += take;
      off += take;
      len -= take;
    }
    return asked;
  }

 private:
  static constexpr uint64_t kBounce = 8ull << 20;
  int fd_ = -1;
  bool direct_ = false;
  uint32_t block_ = 512;
  uint8_t* bounce_ = nullptr;
};

class Source {
 public:
  virtual ~Source() = default;
  // Rows ids[0..n) (ascending, unique) of table t into out (n x dim floats).
  virtual void Gather(uint32_t t, const uint64_t* ids, size_t n, float* out, Counters* c) = 0;
  // Called before each batch when `drop` (a cold page cache is wanted), else once per trace.
  virtual bool Reset(bool drop) {
    return drop ? DropCaches() : false;
  }
  virtual std::string Extra() const { return ""; }
  double preload_seconds = 0;
  uint64_t preload_bytes = 0, preload_requests = 0;
};

class BufSource : public Source {
 public:
  BufSource(const Layout& l, size_t bufsz) : l_(l), bufsz_(bufsz) { Open(); }
  ~BufSource() override { Close(); }
  void Gather(uint32_t t, const uint64_t* ids, size_t n, float* out, Counters* c) override {
    const size_t rb = l_.row_bytes();
    for (size_t i = 0; i < n; i++) {
      if (fseeko(f_, static_cast<off_t>(l_.row_offset(t, ids[i])), SEEK_SET) != 0) Die("fseeko failed");
      if (std::fread(out + i * l_.dim, 1, rb, f_) != rb) Die("fread short");
    }
    c->file_rows += n;
  }
  bool Reset(bool drop) override {
    Close();  // drops the stdio buffer as well
    bool ok = drop ? DropCaches() : false;
    Open();
    return ok;
  }
  std::string Extra() const override { return "\"stdio_buffer_bytes\": " + std::to_string(bufsz_); }

 private:
  void Open() {
    f_ = std::fopen(l_.file.c_str(), "rb");
    if (!f_) Die("cannot open " + l_.file);
    buf_ = static_cast<char*>(std::malloc(bufsz_));
    if (setvbuf(f_, buf_, _IOFBF, bufsz_) != 0) Die("setvbuf failed");
  }
  void Close() {
    if (f_) std::fclose(f_);
    std::free(buf_);
    f_ = nullptr;
    buf_ = nullptr;
  }
  Layout l_;
  size_t bufsz_;
  FILE* f_ = nullptr;
  char* buf_ = nullptr;
};

class UnbufSource : public Source {
 public:
  explicit UnbufSource(const Layout& l) : l_(l) { df_.Open(l.file); }
  void Gather(uint32_t t, const uint64_t* ids, size_t n, float* out, Counters* c) override {
    for (size_t i = 0; i < n; i++) Row(t, ids[i], out + i * l_.dim, c);
    c->file_rows += n;
  }
  void Row(uint32_t t, uint64_t id, float* dst, Counters* c) {
    c->read_bytes += df_.Read(l_.row_offset(t, id), l_.row_bytes(), reinterpret_cast<uint8_t*>(dst), &c->reads);
  }
  std::string Extra() const override {
    return "\"o_direct\": " + std::string(df_.direct() ? "true" : "false") + ", \"direct_block\": " + std::to_string(df_.block());
  }
  DirectFile& file() { return df_; }

 protected:
  Layout l_;
  DirectFile df_;
};

class MmapSource : public Source {
 public:
  MmapSource(const Layout& l, bool random) : l_(l), random_(random) { Map(); }
  ~MmapSource() override { Unmap(); }
  void Gather(uint32_t t, const uint64_t* ids, size_t n, float* out, Counters* c) override {
    const size_t rb = l_.row_bytes();
    for (size_t i = 0; i < n; i++) std::memcpy(out + i * l_.dim, base_ + l_.row_offset(t, ids[i]), rb);
    c->file_rows += n;
  }
  std::string Extra() const override { return std::string("\"madvise\": \"") + (random_ ? "random" : "normal") + "\""; }
  bool Reset(bool drop) override {
    Unmap();  // mapped pages cannot be dropped
    bool ok = drop ? DropCaches() : false;
    Map();
    return ok;
  }

 private:
  void Map() {
    fd_ = open(l_.file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) Die("cannot open " + l_.file);
    void* p = mmap(nullptr, l_.file_bytes(), PROT_READ, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) Die(std::string("mmap: ") + std::strerror(errno));
    if (random_ && madvise(p, l_.file_bytes(), MADV_RANDOM) != 0) Die(std::string("madvise: ") + std::strerror(errno));
    base_ = static_cast<const uint8_t*>(p);
  }
  void Unmap() {
    if (base_) munmap(const_cast<uint8_t*>(base_), l_.file_bytes());
    if (fd_ >= 0) close(fd_);
    base_ = nullptr;
    fd_ = -1;
  }
  Layout l_;
  bool random_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
};

class RamSource : public Source {
 public:
  explicit RamSource(const Layout& l) : l_(l) {
    DirectFile df;
    df.Open(l.file);
    const double t0 = Now();
    data_ = static_cast<uint8_t*>(AlignedAlloc(l.file_bytes()));
    preload_bytes = df.Read(0, l.file_bytes(), data_, &preload_requests);
    preload_seconds = Now() - t0;
  }
  ~RamSource() override { std::free(data_); }
  void Gather(uint32_t t, const uint64_t* ids, size_t n, float* out, Counters* c) override {
    const size_t rb = l_.row_bytes();
    for (size_t i = 0; i < n; i++) std::memcpy(out + i * l_.dim, data_ + l_.row_offset(t, ids[i]), rb);
    c->dram_rows += n;
  }

 private:
  Layout l_;
  uint8_t* data_ = nullptr;
};

// ratio and opt: preloaded regions (chunks of `chunk_rows` rows) in DRAM, the rest by pread.
class PartialSource : public UnbufSource {
 public:
  PartialSource(const Layout& l, uint64_t chunk_rows, const std::vector<std::vector<uint32_t>>& chunks, std::string what)
      : UnbufSource(l), chunk_rows_(chunk_rows), what_(std::move(what)) {
    const uint64_t nchunks = (l.rows + chunk_rows - 1) / chunk_rows;
    slot_.assign(l.tables, std::vector<int64_t>(nchunks, -1));
    uint64_t total_rows = 0;
    for (uint32_t t = 0; t < l.tables; t++)
      for (uint32_t c : chunks[t]) total_rows += std::min<uint64_t>(chunk_rows, l.rows - c * chunk_rows);
    const double t0 = Now();
    dram_ = static_cast<uint8_t*>(AlignedAlloc(total_rows * l.row_bytes() + 1));
    uint64_t at = 0;
    for (uint32_t t = 0; t < l.tables; t++) {
      std::vector<uint32_t> cs = chunks[t];
      std::sort(cs.begin(), cs.end());
      // Contiguous runs of chunks are read with one ranged read each.
      for (size_t i = 0; i < cs.size();) {
        size_t j = i;
        while (j + 1 < cs.size() && cs[j + 1] == cs[j] + 1) j++;
        const uint64_t r0 = cs[i] * chunk_rows, r1 = std::min<uint64_t>(l.rows, (cs[j] + 1) * chunk_rows);
        preload_bytes += df_.Read(l.row_offset(t, r0), (r1 - r0) * l.row_bytes(), dram_ + at * l.row_bytes(), &preload_requests);
        for (size_t k = i; k <= j; k++) slot_[t][cs[k]] = static_cast<int64_t>(at + (cs[k] - cs[i]) * chunk_rows);
        at += r1 - r0;
        i = j + 1;
      }
    }
    dram_rows_ = at;
    preload_seconds = Now() - t0;
  }
  ~PartialSource() override { std::free(dram_); }
  void Gather(uint32_t t, const uint64_t* ids, size_t n, float* out, Counters* c) override {
    const size_t rb = l_.row_bytes();
    for (size_t i = 0; i < n; i++) {
      const uint64_t ch = ids[i] / chunk_rows_;
      const int64_t s = slot_[t][ch];
      if (s >= 0) {
        std::memcpy(out + i * l_.dim, dram_ + (s + (ids[i] - ch * chunk_rows_)) * rb, rb);
        c->dram_rows++;
      } else {
        Row(t, ids[i], out + i * l_.dim, c);
        c->file_rows++;
      }
    }
  }
  std::string Extra() const override {
    return UnbufSource::Extra() + ", \"dram_rows\": " + std::to_string(dram_rows_) + ", \"dram_bytes\": " +
           std::to_string(dram_rows_ * l_.row_bytes()) + ", \"dram_fraction\": " +
           std::to_string(static_cast<double>(dram_rows_) / (static_cast<double>(l_.rows) * l_.tables)) +
           ", \"chunk_rows\": " + std::to_string(chunk_rows_) + ", \"selection\": \"" + what_ + "\"";
  }

 private:
  uint64_t chunk_rows_;
  std::string what_;
  std::vector<std::vector<int64_t>> slot_;
  uint8_t* dram_ = nullptr;
  uint64_t dram_rows_ = 0;
};

class UringSource : public Source {
 public:
  UringSource(const Layout& l, unsigned qd) : l_(l), qd_(qd) {
    df_.Open(l.file);
    if (io_uring_queue_init(qd, &ring_, 0) < 0) Die("io_uring_queue_init failed");
    slot_bytes_ = std::max<uint32_t>(4096, static_cast<uint32_t>((l.row_bytes() + 2 * df_.block())));
    slots_ = static_cast<uint8_t*>(AlignedAlloc(static_cast<size_t>(qd) * slot_bytes_));
  }
  ~UringSource() override {
    io_uring_queue_exit(&ring_);
    std::free(slots_);
  }
  void Gather(uint32_t t, const uint64_t* ids, size_t n, float* out, Counters* c) override {
    const uint64_t bs = df_.block(), rb = l_.row_bytes();
    std::vector<unsigned> free_slots(qd_);
    std::iota(free_slots.begin(), free_slots.end(), 0u);
    std::vector<size_t> slot_row(qd_);
    size_t next = 0, inflight = 0;
    while (next < n || inflight) {
      while (next < n && !free_slots.empty()) {
        const unsigned s = free_slots.back();
        free_slots.pop_back();
        const uint64_t off = l_.row_offset(t, ids[next]);
        const uint64_t lo = off / bs * bs, hi = (off + rb + bs - 1) / bs * bs;
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        io_uring_prep_read(sqe, df_.fd(), slots_ + static_cast<size_t>(s) * slot_bytes_, hi - lo, lo);
        io_uring_sqe_set_data64(sqe, s);
        slot_row[s] = next++;
        inflight++;
        c->reads++;
        c->read_bytes += hi - lo;
      }
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR) Die(std::string("io_uring_submit: ") + std::strerror(-rc));
      io_uring_cqe* cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        seen++;
        const unsigned s = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
        const size_t i = slot_row[s];
        const uint64_t off = l_.row_offset(t, ids[i]);
        const uint64_t lo = off / bs * bs;
        if (cqe->res < static_cast<int>(off - lo + rb)) Die("io_uring read failed or short: " + std::to_string(cqe->res));
        std::memcpy(out + i * l_.dim, slots_ + static_cast<size_t>(s) * slot_bytes_ + (off - lo), rb);
        free_slots.push_back(s);
        inflight--;
      }
      io_uring_cq_advance(&ring_, seen);
    }
    c->file_rows += n;
  }
  std::string Extra() const override {
    return "\"o_direct\": " + std::string(df_.direct() ? "true" : "false") + ", \"direct_block\": " + std::to_string(df_.block()) +
           ", \"qd\": " + std::to_string(qd_);
  }

 private:
  Layout l_;
  unsigned qd_;
  DirectFile df_;
  io_uring ring_{};
  uint8_t* slots_ = nullptr;
  uint32_t slot_bytes_ = 4096;
};

// ---------------------------------------------------------------------------------------
// SLS (same sorted / de-duplicated / pooled logic as ndp/csrc/sls.cc)

struct Scratch {
  std::vector<uint32_t> order, uid_of;
  std::vector<uint64_t> uids;
  std::vector<float> rows;
};

void RunRequest(Source* src, const Layout& l, const Req& r, float* out, Scratch* s, Counters* c, uint64_t* unique) {
  const size_t n = r.indices.size(), B = r.offsets.size(), dim = l.dim;
  s->order.resize(n);
  std::iota(s->order.begin(), s->order.end(), 0u);
  std::sort(s->order.begin(), s->order.end(), [&](uint32_t a, uint32_t b) { return r.indices[a] < r.indices[b]; });
  s->uids.clear();
  s->uid_of.resize(n);
  for (size_t k = 0; k < n; k++) {
    const uint64_t id = static_cast<uint64_t>(r.indices[s->order[k]]);
    if (s->uids.empty() || s->uids.back() != id) s->uids.push_back(id);
    s->uid_of[s->order[k]] = static_cast<uint32_t>(s->uids.size() - 1);
  }
  s->rows.resize(s->uids.size() * dim);
  src->Gather(r.table, s->uids.data(), s->uids.size(), s->rows.data(), c);
  *unique += s->uids.size();
  std::memset(out, 0, sizeof(float) * B * dim);
  for (size_t b = 0; b < B; b++) {
    float* acc = out + b * dim;
    const int64_t a = r.offsets[b], z = b + 1 < B ? r.offsets[b + 1] : static_cast<int64_t>(n);
    for (int64_t p = a; p < z; p++) {
      const float* row = s->rows.data() + static_cast<size_t>(s->uid_of[p]) * dim;
      for (size_t d = 0; d < dim; d++) acc[d] += row[d];
    }
    if (r.mode == 1 && z > a) {
      const float inv = 1.0f / static_cast<float>(z - a);
      for (size_t d = 0; d < dim; d++) acc[d] *= inv;
    }
  }
}

// ---------------------------------------------------------------------------------------

struct Args {
  Layout l;
  std::string method, profile, dump;
  double dram_fraction = 0.1, time_budget = 1e30;
  uint64_t chunk_bytes = 64 << 10, stdio_buf = 4096;
  unsigned qd = 128;
  int major = -1, minor = -1;
  bool drop = false, madv_random = false;
  size_t min_batches = 1, max_batches = SIZE_MAX;
  std::vector<std::string> traces;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i++) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + k);
      return argv[++i];
    };
    if (k == "--file") a.l.file = val();
    else if (k == "--tables") a.l.tables = std::stoul(val());
    else if (k == "--rows") a.l.rows = std::stoull(val());
    else if (k == "--dim") a.l.dim = std::stoul(val());
    else if (k == "--method") a.method = val();
    else if (k == "--dram-fraction") a.dram_fraction = std::stod(val());
    else if (k == "--profile") a.profile = val();
    else if (k == "--chunk-bytes") a.chunk_bytes = std::stoull(val());
    else if (k == "--stdio-buf") a.stdio_buf = std::stoull(val());
    else if (k == "--qd") a.qd = std::stoul(val());
    else if (k == "--dev") {
      std::string v = val();
      if (std::sscanf(v.c_str(), "%d:%d", &a.major, &a.minor) != 2) Die("--dev wants MAJ:MIN");
    } else if (k == "--drop-caches") a.drop = true;
    else if (k == "--madvise-random") a.madv_random = true;
    else if (k == "--time-budget") a.time_budget = std::stod(val());
    else if (k == "--min-batches") a.min_batches = std::stoull(val());
    else if (k == "--max-batches") a.max_batches = std::stoull(val());
    else if (k == "--dump") a.dump = val();
    else if (!k.empty() && k[0] == '-') Die("unknown option " + k);
    else a.traces.push_back(k);
  }
  if (a.l.file.empty() || !a.l.tables || !a.l.rows || !a.l.dim || a.method.empty()) Die("need --file --tables --rows --dim --method");
  struct stat st{};
  if (stat(a.l.file.c_str(), &st) != 0) Die("cannot stat " + a.l.file);
  if (static_cast<uint64_t>(st.st_size) < a.l.file_bytes()) Die(a.l.file + " is smaller than tables x rows x dim x 4");
  return a;
}

std::unique_ptr<Source> MakeSource(const Args& a) {
  const Layout& l = a.l;
  if (a.method == "io_buf") return std::make_unique<BufSource>(l, a.stdio_buf);
  if (a.method == "io_unbuf") return std::make_unique<UnbufSource>(l);
  if (a.method == "mmap") return std::make_unique<MmapSource>(l, a.madv_random);
  if (a.method == "ram") return std::make_unique<RamSource>(l);
  if (a.method == "uring") return std::make_unique<UringSource>(l, a.qd);
  if (a.method == "ratio" || a.method == "opt") {
    const uint64_t chunk_rows = std::max<uint64_t>(1, a.chunk_bytes / l.row_bytes());
    const uint64_t nchunks = (l.rows + chunk_rows - 1) / chunk_rows;
    std::vector<std::vector<uint32_t>> chunks(l.tables);
    if (a.method == "ratio") {
      // The first fraction of every table (thesis: "ratio", a fixed share of each table).
      const uint64_t keep_rows = static_cast<uint64_t>(std::llround(a.dram_fraction * l.rows));
      const uint64_t keep = (keep_rows + chunk_rows - 1) / chunk_rows;
      for (uint32_t t = 0; t < l.tables; t++)
        for (uint64_t c = 0; c < std::min(keep, nchunks); c++) chunks[t].push_back(static_cast<uint32_t>(c));
      return std::make_unique<PartialSource>(l, chunk_rows, chunks, "leading fraction of each table");
    }
    if (a.profile.empty()) Die("opt needs --profile TRACE");
    // Profiling pass: accesses per region, over all tables; hottest regions first.
    std::vector<uint64_t> hits(static_cast<size_t>(l.tables) * nchunks, 0);
    for (const Batch& b : LoadTrace(a.profile, l.tables, l.rows))
      for (const Req& r : b)
        for (int64_t x : r.indices) hits[r.table * nchunks + static_cast<uint64_t>(x) / chunk_rows]++;
    std::vector<uint32_t> order(hits.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) { return hits[x] > hits[y]; });
    const uint64_t budget_rows = static_cast<uint64_t>(std::llround(a.dram_fraction * l.rows * l.tables));
    uint64_t took = 0;
    for (uint32_t k : order) {
      if (hits[k] == 0) break;
      const uint32_t t = k / nchunks, c = k % nchunks;
      const uint64_t rows = std::min<uint64_t>(chunk_rows, l.rows - c * chunk_rows);
      if (took + rows > budget_rows) break;
      chunks[t].push_back(c);
      took += rows;
    }
    return std::make_unique<PartialSource>(l, chunk_rows, chunks, "hottest regions of the profiling trace");
  }
  Die("unknown method " + a.method);
}

std::string Num(double x) {
  if (!std::isfinite(x)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", x);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = Parse(argc, argv);
  const Layout& l = a.l;
  uint64_t rss0, hwm0;
  ProcMem(&rss0, &hwm0);
  std::unique_ptr<Source> src = MakeSource(a);
  uint64_t rss_loaded, hwm_loaded;
  ProcMem(&rss_loaded, &hwm_loaded);
  std::string out = "{\"method\": \"" + a.method + "\", \"file\": \"" + l.file + "\", \"tables\": " + std::to_string(l.tables) +
                    ", \"rows\": " + std::to_string(l.rows) + ", \"dim\": " + std::to_string(l.dim) +
                    ", \"rss_start_bytes\": " + std::to_string(rss0) + ", \"rss_after_preload_bytes\": " + std::to_string(rss_loaded) +
                    ", \"preload\": {\"bytes\": " + std::to_string(src->preload_bytes) + ", \"requests\": " +
                    std::to_string(src->preload_requests) + ", \"seconds\": " + Num(src->preload_seconds) + "}";
  const std::string extra = src->Extra();
  if (!extra.empty()) out += ", " + extra;
  out += ", \"points\": [";
  Scratch scratch;
  std::vector<float> outbuf;
  bool dumped = a.dump.empty();
  for (size_t ti = 0; ti < a.traces.size(); ti++) {
    const std::vector<Batch> batches = LoadTrace(a.traces[ti], l.tables, l.rows);
    bool dropped = a.drop;
    Counters c;
    uint64_t lookups = 0, unique = 0;
    std::vector<double> lat;
    double checksum = 0;
    const DiskStat d0 = ReadDiskstats(a.major, a.minor);
    const uint64_t pr0 = ProcReadBytes();
    const double cpu0 = CpuSeconds(), w0 = Now();
    for (size_t bi = 0; bi < batches.size() && bi < a.max_batches; bi++) {
      if (bi >= a.min_batches && Now() - w0 >= a.time_budget) break;
      const Batch& b = batches[bi];
      if (a.drop) dropped = src->Reset(true) && dropped;
      size_t total = 0;
      for (const Req& r : b) total += r.offsets.size() * l.dim;
      outbuf.resize(total);
      const double t0 = Now();
      size_t at = 0;
      for (const Req& r : b) {
        RunRequest(src.get(), l, r, outbuf.data() + at, &scratch, &c, &unique);
        at += r.offsets.size() * l.dim;
        lookups += r.indices.size();
      }
      lat.push_back(Now() - t0);
      if (bi == 0) {
        for (float v : outbuf) checksum += v;
        if (!dumped) {
          FILE* f = std::fopen(a.dump.c_str(), "wb");
          if (!f || std::fwrite(outbuf.data(), sizeof(float), outbuf.size(), f) != outbuf.size()) Die("cannot write " + a.dump);
          std::fclose(f);
          dumped = true;
        }
      }
    }
    const double wall = Now() - w0, cpu = CpuSeconds() - cpu0;
    const DiskStat d1 = ReadDiskstats(a.major, a.minor);
    const uint64_t pr1 = ProcReadBytes();
    uint64_t rss, hwm;
    ProcMem(&rss, &hwm);
    std::vector<double> s = lat;
    std::sort(s.begin(), s.end());
    auto pct = [&](double q) { return s.empty() ? NAN : s[std::min(s.size() - 1, static_cast<size_t>(q * (s.size() - 1) + 0.5))]; };
    const double mean = s.empty() ? NAN : std::accumulate(s.begin(), s.end(), 0.0) / s.size();
    std::string p = "{\"trace\": \"" + a.traces[ti] + "\", \"batches\": " + std::to_string(lat.size()) +
                    ", \"batches_in_trace\": " + std::to_string(batches.size()) + ", \"page_cache_dropped\": " +
                    (dropped ? "true" : "false") + ", \"lookups\": " + std::to_string(lookups) + ", \"unique_rows\": " +
                    std::to_string(unique) + ", \"dram_rows\": " + std::to_string(c.dram_rows) + ", \"file_rows\": " +
                    std::to_string(c.file_rows) + ", \"syscall_reads\": " + std::to_string(c.reads) +
                    ", \"syscall_read_bytes\": " + std::to_string(c.read_bytes) + ", \"latency_s\": {\"mean\": " + Num(mean) +
                    ", \"p50\": " + Num(pct(0.5)) + ", \"p90\": " + Num(pct(0.9)) + ", \"min\": " + Num(s.empty() ? NAN : s.front()) +
                    ", \"max\": " + Num(s.empty() ? NAN : s.back()) + ", \"first\": " + Num(lat.empty() ? NAN : lat.front()) +
                    "}, \"wall_s\": " + Num(wall) + ", \"cpu_s\": " + Num(cpu) + ", \"proc_read_bytes\": " + std::to_string(pr1 - pr0);
    if (d0.ok && d1.ok) {
      p += ", \"disk\": {\"read_ios\": " + std::to_string(d1.rd_ios - d0.rd_ios) + ", \"read_merges\": " +
           std::to_string(d1.rd_merges - d0.rd_merges) + ", \"read_bytes\": " + std::to_string((d1.rd_sectors - d0.rd_sectors) * 512) +
           ", \"read_ticks_ms\": " + std::to_string(d1.rd_ticks - d0.rd_ticks) + ", \"write_ios\": " +
           std::to_string(d1.wr_ios - d0.wr_ios) + ", \"write_bytes\": " + std::to_string((d1.wr_sectors - d0.wr_sectors) * 512) + "}";
    } else {
      p += ", \"disk\": null";
    }
    p += ", \"rss_bytes\": " + std::to_string(rss) + ", \"hwm_bytes\": " + std::to_string(hwm) + ", \"checksum\": " + Num(checksum) + "}";
    out += (ti ? ", " : "") + p;
  }
  out += "]}";
  std::printf("%s\n", out.c_str());
  return 0;
}
