// Status: the result of every engine operation that can fail (LevelDB/RocksDB style).
// The code picks the Python exception class; the message names what and where.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace recflash {

// Every status code but OK, once: X(Name, python_class). The list generates the enum, the factory
// functions, ToString and the table the Python side maps to exception classes
// (recflash._native.STATUS_CODES, checked against recflash.reader.errors at import). A new
// code is one line here plus its class in reader/errors.py.
#define RECFLASH_STATUS_CODES(X)                                                            \
  X(UnknownFeature, "UnknownFeatureError")                                                  \
  X(FeatureExists, "FeatureExistsError")                                                    \
  X(Schema, "SchemaError")                                                                  \
  X(InvalidArgument, "InvalidArgumentError")                                                \
  X(TooLarge, "ValueTooLargeError")                                                         \
  X(NotAStore, "NotAStoreError")                                                            \
  X(Corruption, "CorruptionError")                                                          \
  X(Locked, "StoreLockedError")                                                             \
  X(Closed, "StoreClosedError")                                                             \
  X(IOError, "IOError_")                                                                    \
  X(ReadOnly, "ReadOnlyError")     /* a write on a store opened read-only */                \
  X(Stale, "StaleSnapshotError")   /* a read-only handle's snapshot no longer matches: reopen */

class Status {
 public:
#define RF_STATUS_ENUM(name, py) k##name,
  enum class Code : int { kOk = 0, RECFLASH_STATUS_CODES(RF_STATUS_ENUM) };
#undef RF_STATUS_ENUM

  Status() = default;
  static Status OK() { return Status(); }
#define RF_STATUS_FACTORY(name, py) \
  static Status name(std::string m) { return Status(Code::k##name, std::move(m)); }
  RECFLASH_STATUS_CODES(RF_STATUS_FACTORY)
#undef RF_STATUS_FACTORY
  // An IOError from errno, naming the call and the path.
  static Status FromErrno(const std::string& what, const std::string& path, int err);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  // The errno of a FromErrno status (ENOSPC, EIO, ...), else 0.
  int sys_errno() const { return errno_; }
  std::string ToString() const;
  // "Corruption", ...; "Unknown(<n>)" for a value outside the list.
  static std::string CodeName(Code c);
  // (code, name, Python exception class) of every code but OK, in code order.
  struct CodeInfo {
    int code;
    const char* name;
    const char* python_class;
  };
  static const std::vector<CodeInfo>& Codes();

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
