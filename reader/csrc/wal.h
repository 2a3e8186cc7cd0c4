// Write-ahead log. Every put/delete batch is appended as one record before it enters the
// write buffer; a record is
//
//   u32 crc32c(type..payload) | u32 payload length | u8 type | payload
//
// Log files are numbered (wal/000007.log). A flush starts a new file, re-logs the items the
// pinner keeps in DRAM into it, and — once the flushed pages and their metadata are durable —
// deletes the older files. Recovery replays every file from the number the metadata names.
// A torn record at the tail (a crash mid-append) ends replay of that file; it was never
// acknowledged as durable.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <sys/uio.h>

#include "reader/csrc/filename.h"  // WalFileName
#include "reader/csrc/status.h"

namespace recflash {

constexpr uint8_t kWalBatch = 1;

class WalWriter {
 public:
  ~WalWriter();
  Status Open(const std::string& path);
  Status Append(uint8_t type, const std::string& payload);
  // Appends one record whose payload is the concatenation of `parts`, written with writev
  // straight from the caller's buffers: a put's keys and values are not copied into a
  // payload string first (that copy, and the page faults of a fresh multi-MB buffer per put,
  // used to cost about as much as everything else on the put path).
  Status AppendParts(uint8_t type, const iovec* parts, size_t nparts);
  Status Sync();
  void Close();
  uint64_t bytes_written() const { return bytes_written_; }
  uint64_t file_bytes() const { return file_bytes_; }  // appended to the open file
  bool synced() const { return unsynced_ == 0; }

 private:
  int fd_ = -1;
  std::string path_;
  uint64_t bytes_written_ = 0;
  uint64_t file_bytes_ = 0;
  uint64_t unsynced_ = 0;
};

// How a WAL file's replay ended.
struct WalReadEnd {
  bool torn_tail = false;      // at a record the file ends inside: a crash mid-append
  bool damaged = false;        // at a damaged record (with point_in_time; else an error)
  bool missing = false;        // the file did not exist at its open (ENOENT): nothing read
  uint64_t file_bytes = 0;     // the file's size at its open
  uint64_t dropped_bytes = 0;  // not replayed: from that record to the end of the file
};

// Calls fn for each intact record of the file in order. A record the file ends inside (a
// crash mid-append: never acknowledged) ends replay: a torn tail. A record that fails its
// checksum with data after it is damage, not a torn append: records logged after it, some
// perhaps synced, would be lost, so it is a Corruption naming the file and offset — unless
// `point_in_time`, which replays up to it (RocksDB's kPointInTimeRecovery;
// StoreOptions::wal_recovery). Zeros after a bad record count as a torn tail (a filesystem may
// extend a file before the data reaches it). A damaged length field that points past the end
// of the file cannot be told from a torn append.
//
// The file is opened before anything else is asked of its path, and its type and size come
// from that descriptor: a file that does not exist is an IOError (ENOENT) with `end->missing`
// set, so a caller that listed the directory can tell "gone since the listing" (a read-only
// open racing the writer that retired the file) from any other failure without parsing the
// message. Anything but a regular file is a Corruption.
Status ReadWalFile(const std::string& path, const std::function<Status(uint8_t type, const std::string& payload)>& fn,
                   WalReadEnd* end, bool point_in_time = false);

// Numbers of the log files in dir, ascending.
Status ListWalFiles(const std::string& dir, std::vector<uint64_t>* numbers);

struct WalFileInfo {
  uint64_t number = 0;
  uint64_t bytes = 0;  // its size when listed
};
// The log files in dir with their sizes, ascending. A file gone between the directory read and
// its stat is an IOError (ENOENT) with *vanished set to its number, so a read-only open can
// tell a writer retiring it from other failures (as ReadWalFile's `missing`).
Status ListWalFilesWithSizes(const std::string& dir, std::vector<WalFileInfo>* files, uint64_t* vanished);

// Where the run of WAL files from the metadata's first one on stops being what writers leave.
// Writers keep those files consecutive (a file is created only as the successor of the newest
// one, only once that one holds records, and a commit deletes only files below its new first
// one), so among the files numbered `start` or more a number missing between two listed ones
// was deleted, and a file that is empty but not the last was cut to nothing: either way the
// records it held, synced ones among them, are gone. (Files below `start` are ignored; whether
// `start` itself is there is the caller's check.)
struct WalSequenceBreak {
  bool found = false;
  // The last listed file before the break: replay may go up to and including it.
  uint64_t last_good = 0;
  // true: last_good is empty although later files exist. false: the numbers last_good + 1 ..
  // next - 1 are missing.
  bool empty = false;
  uint64_t next = 0;  // the first listed file after the break
};
WalSequenceBreak FindWalSequenceBreak(const std::vector<WalFileInfo>& files, uint64_t start);

// fdatasync of a closed WAL file (opened read-only for it).
Status SyncWalFile(const std::string& path);

}  // namespace recflash
