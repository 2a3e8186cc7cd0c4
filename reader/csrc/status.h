// Status: the result of every engine operation that can fail (LevelDB/RocksDB style).
// The code picks the Python exception class; the message names what and where.
#pragma once
#include <string>
#include <utility>

namespace recflash {

class Status {
 public:
  enum class Code : int {
    kOk = 0,
    kUnknownFeature,
    kFeatureExists,
    kSchema,
    kInvalidArgument,
    kTooLarge,
    kNotAStore,
    kCorruption,
    kLocked,
    kClosed,
    kIOError,
    kReadOnly,  // a write on a store opened read-only
    kStale,     // a read-only handle's snapshot no longer matches the page file: reopen
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status UnknownFeature(std::string m) { return Status(Code::kUnknownFeature, std::move(m)); }
  static Status FeatureExists(std::string m) { return Status(Code::kFeatureExists, std::move(m)); }
  static Status Schema(std::string m) { return Status(Code::kSchema, std::move(m)); }
  static Status InvalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
  static Status TooLarge(std::string m) { return Status(Code::kTooLarge, std::move(m)); }
  static Status NotAStore(std::string m) { return Status(Code::kNotAStore, std::move(m)); }
  static Status Corruption(std::string m) { return Status(Code::kCorruption, std::move(m)); }
  static Status Locked(std::string m) { return Status(Code::kLocked, std::move(m)); }
  static Status Closed(std::string m) { return Status(Code::kClosed, std::move(m)); }
  static Status IOError(std::string m) { return Status(Code::kIOError, std::move(m)); }
  static Status ReadOnly(std::string m) { return Status(Code::kReadOnly, std::move(m)); }
  static Status Stale(std::string m) { return Status(Code::kStale, std::move(m)); }
  // An IOError from errno, naming the call and the path.
  static Status FromErrno(const std::string& what, const std::string& path, int err);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  // The errno of a FromErrno status (ENOSPC, EIO, ...), else 0.
  int sys_errno() const { return errno_; }
  std::string ToString() const;

 private:
  Status(Code c, std::string m) : code_(c), msg_(std::move(m)) {}
  Code code_ = Code::kOk;
  int errno_ = 0;
  std::string msg_;
};

#define RF_RETURN_IF_ERROR(expr)        \
  do {                                  \
    ::recflash::Status _s = (expr);     \
    if (!_s.ok()) return _s;            \
  } while (0)

}  // namespace recflash
