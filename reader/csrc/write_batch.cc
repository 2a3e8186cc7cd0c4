#include "reader/csrc/write_batch.h"

#include <cstring>

namespace recflash {

namespace {

template <typename T>
void Append(std::string* s, const T& v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

std::string EncodeBatch(uint8_t op, uint32_t fid, const uint64_t* keys, size_t n, uint32_t width,
                        const uint8_t* values, const int64_t* offsets) {
  std::string p;
  p.reserve(kBatchHeaderBytes + 4 + n * 12 + (op == kOpPut ? (width ? n * width : offsets[n] - offsets[0]) : 0));
  Append(&p, op);
  Append(&p, fid);
  Append(&p, static_cast<uint32_t>(n));
  Append(&p, width);
  p.append(reinterpret_cast<const char*>(keys), n * 8);
  if (op == kOpPut) {
    if (width) {
      p.append(reinterpret_cast<const char*>(values), n * width);
    } else {
      for (size_t i = 0; i < n; i++) Append(&p, static_cast<uint32_t>(offsets[i + 1] - offsets[i]));
      p.append(reinterpret_cast<const char*>(values) + offsets[0], offsets[n] - offsets[0]);
    }
  }
  return p;
}

void BatchParts(uint8_t op, uint32_t fid, const uint64_t* keys, size_t n, uint32_t width, const uint8_t* values,
                const int64_t* offsets, uint8_t header[kBatchHeaderBytes], std::vector<uint32_t>* lens, std::vector<iovec>* parts,
                size_t* bytes) {
  const uint32_t n32 = static_cast<uint32_t>(n);
  header[0] = op;
  std::memcpy(header + 1, &fid, 4);
  std::memcpy(header + 5, &n32, 4);
  std::memcpy(header + 9, &width, 4);
  parts->clear();
  parts->push_back({header, kBatchHeaderBytes});
  parts->push_back({const_cast<uint64_t*>(keys), n * 8});
  if (op == kOpPut) {
    if (width) {
      parts->push_back({const_cast<uint8_t*>(values), n * width});
    } else {
      lens->resize(n);
      for (size_t i = 0; i < n; i++) (*lens)[i] = static_cast<uint32_t>(offsets[i + 1] - offsets[i]);
      parts->push_back({lens->data(), n * 4});
      parts->push_back({const_cast<uint8_t*>(values) + offsets[0], static_cast<size_t>(offsets[n] - offsets[0])});
    }
  }
  *bytes = 0;
  for (const iovec& v : *parts) *bytes += v.iov_len;
}

void EncodeBuffered(uint32_t fid, uint32_t width, const BufferedItems& b, std::vector<std::string>* out) {
  std::vector<uint64_t> pk, dk;
  std::vector<uint8_t> vals;
  std::vector<int64_t> offs{0};
  for (size_t i = 0; i < b.size(); i++) {
    if (b.tomb[i]) {
      dk.push_back(b.keys[i]);
      continue;
    }
    pk.push_back(b.keys[i]);
    vals.insert(vals.end(), b.value(i), b.value(i) + b.length(i));
    offs.push_back(static_cast<int64_t>(vals.size()));
  }
  if (!pk.empty()) out->push_back(EncodeBatch(kOpPut, fid, pk.data(), pk.size(), width, vals.data(), offs.data()));
  if (!dk.empty()) out->push_back(EncodeBatch(kOpDelete, fid, dk.data(), dk.size(), width, nullptr, nullptr));
}

Status DecodeBatch(const std::string& p, const std::string& where, DecodedBatch* out) {
  if (p.size() < kBatchHeaderBytes) return Status::Corruption("short WAL record in '" + where + "'");
  out->op = static_cast<uint8_t>(p[0]);
  std::memcpy(&out->fid, p.data() + 1, 4);
  std::memcpy(&out->n, p.data() + 5, 4);
  std::memcpy(&out->width, p.data() + 9, 4);
  if (out->op != kOpPut && out->op != kOpDelete)
    return Status::Corruption("WAL record in '" + where + "' has unknown op " + std::to_string(out->op));
  const uint32_t n = out->n;
  const auto truncated = [&] { return Status::Corruption("truncated WAL record in '" + where + "'"); };
  size_t pos = kBatchHeaderBytes;
  if (p.size() < pos + 8ull * n) return truncated();
  out->keys.resize(n);
  if (n) std::memcpy(out->keys.data(), p.data() + pos, 8ull * n);  // (empty: data() may be null)
  pos += 8ull * n;
  out->values = nullptr;
  out->offsets.clear();
  if (out->op == kOpDelete) return Status::OK();
  if (out->width) {
    if (p.size() < pos + static_cast<size_t>(n) * out->width) return truncated();
  } else {
    if (p.size() < pos + 4ull * n) return truncated();
    out->offsets.assign(n + 1, 0);
    for (uint32_t i = 0; i < n; i++) {
      uint32_t len;
      std::memcpy(&len, p.data() + pos + 4ull * i, 4);
      out->offsets[i + 1] = out->offsets[i] + len;
    }
    pos += 4ull * n;
    if (p.size() < pos + static_cast<size_t>(out->offsets[n])) return truncated();
  }
  out->values = reinterpret_cast<const uint8_t*>(p.data() + pos);
  return Status::OK();
}

}  // namespace recflash
