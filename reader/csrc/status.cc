#include "reader/csrc/status.h"

#include <cstring>

namespace recflash {

Status Status::FromErrno(const std::string& what, const std::string& path, int err) {
  return Status(Code::kIOError, what + " failed on '" + path + "': " + std::strerror(err) +
                                    " (errno " + std::to_string(err) + ")");
}

std::string Status::ToString() const {
  static const char* kNames[] = {"OK",          "UnknownFeature", "FeatureExists", "Schema",
                                 "InvalidArgument", "TooLarge",   "NotAStore",     "Corruption",
                                 "Locked",      "Closed",         "IOError"};
  return std::string(kNames[static_cast<int>(code_)]) + ": " + msg_;
}

}  // namespace recflash
