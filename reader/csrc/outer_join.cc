#include "reader/csrc/outer_join.h"

#include <algorithm>
#include <cstring>

namespace recflash {

namespace {

// Each input's rows in a union of n keys: none for an input holding all n (identical), else
// rows_of(input, out) writes one row per key.
template <typename RowsOf>
void FillRows(const std::vector<KeySpan>& in, size_t n, JoinedKeys* out, const RowsOf& rows_of) {
  for (size_t i = 0; i < in.size(); i++) {
    if (in[i].n == n) {
      out->identical[i] = 1;
      continue;
    }
    out->pos[i].resize(in[i].n);
    rows_of(in[i], out->pos[i].data());
  }
}

}  // namespace

void JoinKeys(const std::vector<KeySpan>& in, JoinedKeys* out) {
  const size_t m = in.size();
  out->keys.clear();
  out->pos.assign(m, HVec<int64_t>());
  out->identical.assign(m, 0);
  uint64_t kmin = UINT64_MAX, kmax = 0;
  size_t longest = 0;
  for (const KeySpan& s : in) {
    if (!s.n) continue;
    kmin = std::min(kmin, s.keys[0]);
    kmax = std::max(kmax, s.keys[s.n - 1]);
    longest = std::max(longest, s.n);
  }
  if (longest == 0) {
    for (size_t i = 0; i < m; i++) out->identical[i] = 1;
    return;
  }
  const uint64_t span_m1 = kmax - kmin;  // span - 1: no overflow for the whole key space
  if (span_m1 + 1 == longest && span_m1 < UINT64_MAX) {
    // One input holds every key of the span: the union is the run itself.
    out->keys.resize(longest);
    for (size_t r = 0; r < longest; r++) out->keys[r] = kmin + r;
    FillRows(in, longest, out, [&](const KeySpan& s, int64_t* p) {
      for (size_t r = 0; r < s.n; r++) p[r] = static_cast<int64_t>(s.keys[r] - kmin);
    });
    return;
  }
  if (span_m1 < 8ull * longest + 1024) {
    const size_t span = static_cast<size_t>(span_m1) + 1;
    std::vector<int64_t> rank(span, 0);  // 1 + the row of a present key, 0 for absent
    for (const KeySpan& s : in)
      for (size_t r = 0; r < s.n; r++) rank[s.keys[r] - kmin] = 1;
    size_t n = 0;
    for (size_t x = 0; x < span; x++)
      if (rank[x]) rank[x] = static_cast<int64_t>(++n);
    out->keys.resize(n);
    for (size_t x = 0; x < span; x++)
      if (rank[x]) out->keys[rank[x] - 1] = kmin + x;
    FillRows(in, n, out, [&](const KeySpan& s, int64_t* p) {
      for (size_t r = 0; r < s.n; r++) p[r] = rank[s.keys[r] - kmin] - 1;
    });
    return;
  }
  // Sparse keys: merge the inputs one by one into the union, then find each input's rows.
  HVec<uint64_t> u, tmp;
  for (const KeySpan& s : in) {
    tmp.resize(u.size() + s.n);
    tmp.resize(std::set_union(u.begin(), u.end(), s.keys, s.keys + s.n, tmp.begin()) - tmp.begin());
    u.swap(tmp);
  }
  FillRows(in, u.size(), out, [&](const KeySpan& s, int64_t* p) {
    size_t j = 0;
    for (size_t r = 0; r < s.n; r++) {
      while (u[j] < s.keys[r]) j++;  // every input key is in the union
      p[r] = static_cast<int64_t>(j);
    }
  });
  out->keys = std::move(u);
}

void SpreadFixed(const uint8_t* values, size_t count, uint32_t width, const int64_t* pos, size_t n, uint8_t* out,
                 uint8_t* validity) {
  std::memset(validity, 0, (n + 7) / 8);
  size_t next = 0;  // first row not written yet
  for (size_t r = 0; r < count; r++) {
    const size_t row = static_cast<size_t>(pos[r]);
    if (row > next) std::memset(out + next * width, 0, (row - next) * width);
    std::memcpy(out + row * width, values + r * width, width);
    validity[row >> 3] |= static_cast<uint8_t>(1u << (row & 7));
    next = row + 1;
  }
  if (n > next) std::memset(out + next * width, 0, (n - next) * width);
}

}  // namespace recflash
