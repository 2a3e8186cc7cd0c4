#include "reader/csrc/status.h"

#include <cstring>

namespace recflash {

Status Status::FromErrno(const std::string& what, const std::string& path, int err) {
  Status s(Code::kIOError, what + " failed on '" + path + "': " + std::strerror(err) + " (errno " +
                               std::to_string(err) + ")");
  s.errno_ = err;
  return s;
}

std::string Status::ToString() const {
  // One name per Code, in order; the static_assert catches a code added without its name.
  static const char* kNames[] = {"OK",       "UnknownFeature", "FeatureExists", "Schema",   "InvalidArgument",
                                 "TooLarge", "NotAStore",      "Corruption",    "Locked",   "Closed",
                                 "IOError",  "ReadOnly",       "Stale"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Code::kStale) + 1,
                "Status::ToString names every Code");
  const auto i = static_cast<size_t>(code_);
  const char* name = i < sizeof(kNames) / sizeof(kNames[0]) ? kNames[i] : "Unknown";
  return std::string(name) + ": " + msg_;
}

}  // namespace recflash
