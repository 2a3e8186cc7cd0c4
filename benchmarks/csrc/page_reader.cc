// Feature reads for the `lsm` and `opt` strategies of benchmarks/compaction.py.
//
// Both strategies store fixed-size items (8-byte little-endian key + value) packed
// `ipp = page_size / item_bytes` to a page (no page header: the most favourable packing a
// baseline can get). A feature read is a list of extents, one per file holding items of the
// feature: (file, rank, first item, item count). The harness
//   1. reads the pages covering every extent with O_DIRECT through io_uring, the same way the
//      READER engine does (requests of at most --max-io bytes, --qd in flight, one request
//      per run of adjacent pages);
//   2. delivers the feature's valid items, keys ascending: a single extent is copied out as
//      its requests complete, in order, while the later ones are in flight (as the engine
//      overlaps decoding with its reads); several extents (the LSM strategy: one per live
//      file) are k-way merged by key with a loser tree once all are read, the extent with the
//      highest rank (the newest file) winning per key;
//   3. records per read: wall seconds (I/O + delivery), I/O seconds (until the last page is
//      in), bytes and pages read, items delivered and a checksum  sum(key *
//      0x9E3779B97F4A7C15 + first 8 value bytes) (mod 2^64), taken after the timer as the
//      engine's reads are checked, that the Python side compares with the expected contents.
//
// Usage: page_reader FILES.txt PLAN.bin OUT.bin [--qd N] [--max-io BYTES] [--inflight-bytes BYTES]
//                    [--io-only 1]
//   FILES.txt  one path per line (file index = line number)
//   PLAN.bin   header {char[4] "RFPR", u32 version=1, u32 page_size, u32 item_bytes, u64 n_ops}
//              per op {u32 feature, u32 n_ext} then n_ext x {u32 file, u32 rank, u64 first, u64 n}
//   OUT.bin    per op {f64 seconds, f64 io_seconds, u64 bytes_read, u64 pages_read, u64 items,
//              u64 checksum}
// Prints one JSON line of totals on stdout.
//
// --io-only 1 reads the pages and delivers nothing (items 0): the device's time for a page
// set, whatever the pages hold. benchmarks/compaction.py replays the pages of READER's reads
// this way, so each run shows what the same device reads cost with no CPU work at all.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <queue>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr uint64_t kMix = 0x9E3779B97F4A7C15ull;

struct Extent {
  uint32_t file, rank;
  uint64_t first, n;
};

struct OpResult {
  double seconds, io_seconds;
  uint64_t bytes_read, pages_read, items, checksum;
};

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "page_reader: %s\n", msg.c_str());
  std::exit(2);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Request {
  int fd;
  uint64_t off;
  uint32_t len;
  uint8_t* dst;
};

class Reader {
 public:
  // At most qd requests and (when inflight_bytes > 0) inflight_bytes of them in flight (one
  // request always may go): the engine's scans on one lane keep the same budget (StoreOptions
  // single_lane_inflight_bytes of read_inflight_bytes), since this disk completes a deep queue
  // in one burst and the delivery work then waits for the last read instead of overlapping
  // the rest.
  Reader(unsigned qd, uint64_t inflight_bytes) : qd_(qd), inflight_bytes_(inflight_bytes) {
    if (io_uring_queue_init(qd * 2, &ring_, 0) < 0) Die("io_uring_queue_init failed");
  }
  ~Reader() { io_uring_queue_exit(&ring_); }

  // Registers the read buffer with the kernel (io_uring_register_buffers), as the engine does
  // with its ring slots: reads into it then skip pinning its pages per request. Requests must
  // lie within it. Falls back to plain reads when the kernel refuses.
  void Register(uint8_t* p, size_t n) {
    if (registered_) io_uring_unregister_buffers(&ring_);
    iovec iov{p, n};
    registered_ = io_uring_register_buffers(&ring_, &iov, 1) == 0;
  }

  // Executes all requests, at most qd_ in flight; on_done(i) after request i completed (called
  // between completions, so the caller's work overlaps the requests still in flight).
  template <typename OnDone>
  void Run(const std::vector<Request>& reqs, OnDone&& on_done) {
    size_t next = 0, done = 0;
    unsigned inflight = 0;
    uint64_t bytes = 0;  // in flight
    uint64_t unqueued = 0;  // bytes of the requests not yet queued
    for (const Request& r : reqs) unqueued += r.len;
    auto queue = [&] {  // the next request into the submission queue
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) return false;
      const Request& r = reqs[next];
      if (registered_) io_uring_prep_read_fixed(sqe, r.fd, r.dst, r.len, r.off, 0);
      else io_uring_prep_read(sqe, r.fd, r.dst, r.len, r.off);
      io_uring_sqe_set_data64(sqe, next);
      next++;
      inflight++;
      bytes += r.len;
      unqueued -= r.len;
      return true;
    };
    // Queues requests up to qd_ (and the byte budget) in flight. As the engine does, the
    // budget tapers to 3/4 of what is left to read near the end, so the last window is small.
    auto fill = [&] {
      while (inflight < qd_ && next < reqs.size() &&
             (inflight_bytes_ == 0 || inflight == 0 ||
              bytes + reqs[next].len <= std::min(inflight_bytes_, (unqueued + bytes) / 4 * 3)))
        if (!queue()) break;
    };
    // As the engine does (IoRing::ReadRuns): the first request of a batch of three or more goes
    // to the kernel on its own, so the device reads it while the kernel prepares the rest.
    if (reqs.size() >= 3 && queue()) {
      const int rs = io_uring_submit(&ring_);
      if (rs < 0) Die("io_uring_submit: " + std::string(strerror(-rs)));
    }
    while (done < reqs.size()) {
      fill();
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0) Die("io_uring_submit_and_wait: " + std::string(strerror(-rc)));
      // Completions are collected first and handled after the queue is refilled below, so
      // the device stays busy while on_done works.
      io_uring_cqe* cqe;
      unsigned head, seen = 0;
      done_.clear();
      io_uring_for_each_cqe(&ring_, head, cqe) {
        const Request& r = reqs[io_uring_cqe_get_data64(cqe)];
        if (cqe->res < 0) Die("read failed: " + std::string(strerror(-cqe->res)));
        if (static_cast<uint32_t>(cqe->res) != r.len)
          Die("short read at offset " + std::to_string(r.off) + ": " + std::to_string(cqe->res) + " of " +
              std::to_string(r.len) + " bytes");
        done_.push_back(io_uring_cqe_get_data64(cqe));
        bytes -= r.len;
        seen++;
      }
      io_uring_cq_advance(&ring_, seen);
      inflight -= seen;
      done += seen;
      fill();
      if (io_uring_sq_ready(&ring_) > 0) {
        int rs = io_uring_submit(&ring_);
        if (rs < 0) Die("io_uring_submit: " + std::string(strerror(-rs)));
      }
      for (uint64_t i : done_) on_done(i);
    }
  }

 private:
  io_uring ring_;
  unsigned qd_;
  uint64_t inflight_bytes_;
  bool registered_ = false;
  std::vector<uint64_t> done_;
};

template <typename T>
T Get(std::ifstream& in) {
  T v;
  in.read(reinterpret_cast<char*>(&v), sizeof(T));
  if (!in) Die("truncated plan file");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4)
    Die("usage: page_reader FILES.txt PLAN.bin OUT.bin [--qd N] [--max-io BYTES] [--inflight-bytes BYTES] "
        "[--io-only 1]");
  unsigned qd = 32;
  uint64_t max_io = 256 << 10;
  uint64_t inflight_bytes = 0;
  bool io_only = false;
  for (int i = 4; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--qd") qd = std::stoul(argv[i + 1]);
    else if (a == "--max-io") max_io = std::stoull(argv[i + 1]);
    else if (a == "--inflight-bytes") inflight_bytes = std::stoull(argv[i + 1]);
    else if (a == "--io-only") io_only = std::stoul(argv[i + 1]) != 0;
    else Die("unknown option " + a);
  }
  std::vector<int> fds;
  {
    std::ifstream fl(argv[1]);
    std::string line;
    while (std::getline(fl, line)) {
      if (line.empty()) continue;
      int fd = open(line.c_str(), O_RDONLY | O_DIRECT);
      if (fd < 0) Die("open " + line + ": " + strerror(errno));
      fds.push_back(fd);
    }
  }
  std::ifstream plan(argv[2], std::ios::binary);
  if (!plan) Die(std::string("cannot open ") + argv[2]);
  char magic[4];
  plan.read(magic, 4);
  if (std::memcmp(magic, "RFPR", 4) != 0) Die("bad plan magic");
  const uint32_t version = Get<uint32_t>(plan);
  if (version != 1) Die("bad plan version");
  const uint32_t page = Get<uint32_t>(plan);
  const uint32_t item = Get<uint32_t>(plan);
  const uint64_t nops = Get<uint64_t>(plan);
  if (item < 16 || item > page) Die("item size must be in [16, page size]");
  if (page % 4096 != 0 || max_io % page != 0) Die("page size must be a multiple of 4096 dividing --max-io");
  const uint64_t ipp = page / item;
  const uint32_t vbytes = item - 8;

  Reader reader(qd, inflight_bytes);
  uint8_t* buf = nullptr;
  size_t buf_cap = 0;
  std::vector<uint64_t> out_keys;
  std::vector<uint8_t> out_vals;
  std::vector<OpResult> results;
  results.reserve(nops);
  std::vector<Extent> ext;
  std::vector<uint64_t> ext_buf_off, ext_first_page;
  std::vector<Request> reqs;
  double total_s = 0, total_io = 0;
  uint64_t total_bytes = 0, total_items = 0;

  for (uint64_t op = 0; op < nops; op++) {
    (void)Get<uint32_t>(plan);  // feature id (informational)
    const uint32_t next = Get<uint32_t>(plan);
    ext.resize(next);
    for (auto& e : ext) {
      e.file = Get<uint32_t>(plan);
      e.rank = Get<uint32_t>(plan);
      e.first = Get<uint64_t>(plan);
      e.n = Get<uint64_t>(plan);
      if (e.file >= fds.size()) Die("plan names file " + std::to_string(e.file) + " beyond FILES.txt");
    }
    // Layout of the pages in the buffer, and the requests.
    ext_buf_off.resize(next);
    ext_first_page.resize(next);
    uint64_t total = 0, pages = 0, items_in = 0;
    for (uint32_t i = 0; i < next; i++) {
      const uint64_t p0 = ext[i].first / ipp, p1 = (ext[i].first + ext[i].n - 1) / ipp;
      ext_first_page[i] = p0;
      ext_buf_off[i] = total;
      total += (p1 - p0 + 1) * page;
      pages += p1 - p0 + 1;
      items_in += ext[i].n;
    }
    if (total > buf_cap) {
      std::free(buf);
      buf_cap = std::max<size_t>(total, buf_cap * 2);
      // On 2 MiB transparent huge pages, as the engine's ring slots are (reader/csrc/io_ring.cc
      // AlignedBuffer): reads into 4 KiB pages took this virtual disk markedly longer.
      constexpr size_t kHuge = 2u << 20;
      buf_cap = (buf_cap + kHuge - 1) / kHuge * kHuge;
      buf = static_cast<uint8_t*>(std::aligned_alloc(kHuge, buf_cap));
      if (!buf) Die("out of memory");
      madvise(buf, buf_cap, MADV_HUGEPAGE);
      reader.Register(buf, buf_cap);
    }
    if (out_keys.size() < items_in) {
      out_keys.resize(items_in);
      out_vals.resize(items_in * vbytes);
    }

    const double t0 = Now();
    reqs.clear();
    for (uint32_t i = 0; i < next; i++) {
      const uint64_t off = ext_first_page[i] * page;
      const uint64_t len = (i + 1 < next ? ext_buf_off[i + 1] : total) - ext_buf_off[i];
      uint64_t done = 0;
      while (done < len) {
        const uint64_t l = std::min(max_io, len - done);
        reqs.push_back({fds[ext[i].file], off + done, static_cast<uint32_t>(l), buf + ext_buf_off[i] + done});
        done += l;
      }
    }
    // Delivery. One extent (OPT's packed layout, an LSM feature in one file) is delivered as
    // its requests complete, in order, overlapping the reads still in flight, as the engine
    // does; several extents need all their pages before the merge.
    auto item_ptr = [&](uint32_t e, uint64_t i) -> const uint8_t* {
      const uint64_t g = ext[e].first + i;
      return buf + ext_buf_off[e] + (g / ipp - ext_first_page[e]) * page + (g % ipp) * item;
    };
    uint64_t nout = 0, sum = 0;
    // Cursor over an extent's items in the buffer: advancing skips a page's tail padding.
    struct Cursor {
      const uint8_t* p;
      uint64_t left;          // items left in the extent
      uint64_t left_in_page;  // items left in the current page
    };
    const uint64_t pad = page - ipp * item;
    auto start = [&](uint32_t e) -> Cursor {
      return {item_ptr(e, 0), ext[e].n, ipp - ext[e].first % ipp};
    };
    auto advance = [&](Cursor& c) {
      c.left--;
      c.p += item;
      if (--c.left_in_page == 0) {
        c.p += pad;
        c.left_in_page = ipp;
      }
    };
    double t_io = t0;
    if (io_only) {
      reader.Run(reqs, [](uint64_t) {});
      t_io = Now();
    } else if (next == 1) {
      Cursor c = start(0);
      std::vector<uint8_t> ready(reqs.size(), 0);
      size_t prefix = 0;  // requests [0, prefix) complete and delivered up to their end
      reader.Run(reqs, [&](uint64_t r) {
        ready[r] = 1;
        if (r != prefix) return;
        while (prefix < reqs.size() && ready[prefix]) prefix++;
        const uint8_t* limit = reqs[prefix - 1].dst + reqs[prefix - 1].len;
        // A page's items at a time (requests end on page boundaries); 8-byte values, the
        // benchmark's default, with fixed-size copies the compiler inlines.
        while (c.left > 0 && c.p < limit) {
          const uint64_t m = std::min(c.left, c.left_in_page);
          auto copy = [&](auto vb) {  // vb: the value bytes, a constant for 8
            const uint8_t* p = c.p;
            uint64_t* ko = &out_keys[nout];
            uint8_t* vo = &out_vals[nout * vb];
            for (uint64_t j = 0; j < m; j++, p += 8 + vb) {
              std::memcpy(ko + j, p, 8);
              std::memcpy(vo + j * vb, p + 8, vb);
            }
          };
          if (vbytes == 8) {
            copy(std::integral_constant<uint32_t, 8>{});
          } else {
            copy(vbytes);
          }
          nout += m;
          c.left -= m;
          c.p += m * item;
          if ((c.left_in_page -= m) == 0) {
            c.p += pad;
            c.left_in_page = ipp;
          }
        }
      });
      t_io = Now();
    } else if (next > 1) {
      reader.Run(reqs, [](uint64_t) {});
      t_io = Now();
      // Loser tree over the extents: the winner is the smallest key, and among equal keys the
      // newest file (highest rank) — older versions of a key follow it and are skipped.
      // Each output item costs log2(k) comparisons, written branch-free.
      struct Node {
        uint64_t key;
        uint64_t prio;  // (rank << 32 | extent); larger wins a tie; 0 = exhausted run
      };
      // a beats b: smaller key, or same key and higher priority; exhausted runs carry key MAX
      // and priority 0 (generated keys are < 2^64 - 1, so MAX marks the end).
      auto beats = [](const Node& a, const Node& b) {
        return (a.key < b.key) | ((a.key == b.key) & (a.prio > b.prio));
      };
      uint32_t K = 1;
      while (K < next) K <<= 1;
      std::vector<Cursor> cur(next);
      for (uint32_t e = 0; e < next; e++) cur[e] = start(e);
      auto leaf = [&](uint32_t e) -> Node {
        if (e >= next || cur[e].left == 0) return {~0ull, 0};
        uint64_t k;
        std::memcpy(&k, cur[e].p, 8);
        return {k, (static_cast<uint64_t>(ext[e].rank) << 32 | e) + 1};
      };
      // Build: node n keeps the loser of its match (keys and priorities in separate arrays,
      // updated with masks so the hot loop has no data-dependent branches).
      std::vector<Node> win(2 * K);
      std::vector<uint64_t> tk(K), tp(K);
      for (uint32_t e = 0; e < K; e++) win[K + e] = leaf(e);
      for (uint32_t n = K - 1; n >= 1; n--) {
        const Node& a = win[2 * n];
        const Node& b = win[2 * n + 1];
        const bool ab = beats(a, b);
        win[n] = ab ? a : b;
        tk[n] = ab ? b.key : a.key;
        tp[n] = ab ? b.prio : a.prio;
      }
      uint64_t xk = win[1].key, xp = win[1].prio;
      bool have_last = false;
      uint64_t last = 0;
      while (xp != 0) {
        const uint32_t e = static_cast<uint32_t>((xp - 1) & 0xffffffffu);
        if (!have_last || xk != last) {
          const uint8_t* p = cur[e].p;
          out_keys[nout] = xk;
          std::memcpy(&out_vals[nout * vbytes], p + 8, vbytes);
          nout++;
          last = xk;
          have_last = true;
        }
        advance(cur[e]);
        const Node x = leaf(e);
        xk = x.key;
        xp = x.prio;
        for (uint32_t n = (K + e) >> 1; n >= 1; n >>= 1) {
          const uint64_t lk = tk[n], lp = tp[n];
          const uint64_t m = 0 - static_cast<uint64_t>((lk < xk) | ((lk == xk) & (lp > xp)));
          tk[n] = (lk & ~m) | (xk & m);
          tp[n] = (lp & ~m) | (xp & m);
          xk = (xk & ~m) | (lk & m);
          xp = (xp & ~m) | (lp & m);
        }
      }
    }
    const double t1 = Now();
    // The checksum that verifies the delivered items, outside the timed part (the engine's
    // reads are checked the same way, after their timer).
    for (uint64_t i = 0; i < nout; i++) {
      uint64_t v0;
      std::memcpy(&v0, &out_vals[i * vbytes], 8);
      sum += out_keys[i] * kMix + v0;
    }
    results.push_back({t1 - t0, t_io - t0, total, pages, nout, sum});
    total_s += t1 - t0;
    total_io += t_io - t0;
    total_bytes += total;
    total_items += nout;
  }
  FILE* out = std::fopen(argv[3], "wb");
  if (!out) Die(std::string("cannot write ") + argv[3]);
  if (!results.empty() && std::fwrite(results.data(), sizeof(OpResult), results.size(), out) != results.size())
    Die("write failed");
  std::fclose(out);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("{\"ops\": %llu, \"seconds\": %.6f, \"io_seconds\": %.6f, \"bytes_read\": %llu, \"items\": %llu, "
              "\"user_s\": %.3f, \"sys_s\": %.3f, \"maxrss_kb\": %ld}\n",
              (unsigned long long)nops, total_s, total_io, (unsigned long long)total_bytes,
              (unsigned long long)total_items, ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
              ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6, ru.ru_maxrss);
  for (int fd : fds) close(fd);
  std::free(buf);
  return 0;
}
