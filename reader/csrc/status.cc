#include "reader/csrc/status.h"

#include <cstring>

namespace recflash {

Status Status::FromErrno(const std::string& what, const std::string& path, int err) {
  Status s(Code::kIOError, what + " failed on '" + path + "': " + std::strerror(err) + " (errno " +
                               std::to_string(err) + ")");
  s.errno_ = err;
  return s;
}

std::string Status::CodeName(Code c) {
  switch (c) {
    case Code::kOk:
      return "OK";
#define RF_STATUS_NAME(name, py) \
  case Code::k##name:            \
    return #name;
    RECFLASH_STATUS_CODES(RF_STATUS_NAME)
#undef RF_STATUS_NAME
    default:
      return "Unknown(" + std::to_string(static_cast<int>(c)) + ")";
  }
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return CodeName(code_) + ": " + msg_;
}

const std::vector<Status::CodeInfo>& Status::Codes() {
  static const std::vector<CodeInfo> kCodes = [] {
    std::vector<CodeInfo> v;
#define RF_STATUS_INFO(name, py) v.push_back({static_cast<int>(Code::k##name), #name, py});
    RECFLASH_STATUS_CODES(RF_STATUS_INFO)
#undef RF_STATUS_INFO
    return v;
  }();
  return kCodes;
}

}  // namespace recflash
