// Replay of the write-ahead log at open: the records of the WAL files from the committed
// wal_start on, which must be consecutive (only the last may be empty), checked and applied
// to the write buffer; how a damaged or torn record is treated is wal_recovery's choice.
#include "reader/csrc/store_impl.h"

#include "reader/csrc/fault_injection.h"
#include "reader/csrc/file_util.h"
#include "reader/csrc/store_internal.h"

#include <algorithm>
#include <filesystem>
#include <vector>

namespace recflash {

namespace fs = std::filesystem;
using namespace store_internal;


Status StoreImpl::ReplayWal(WalReplay* out) {
  RF_PAUSE_POINT("wal.replay.before_list");  // metadata read, wal/ not listed yet: tests move a writer on here
  std::vector<WalFileInfo> files;
  uint64_t vanished = 0;
  Status listed = ListWalFilesWithSizes(wal_dir_, &files, &vanished);
  if (vanished && o_.read_only)  // as a file gone at its open for replay (below)
    return Status::Stale("store '" + path_ + "': WAL file '" + WalFileName(wal_dir_, vanished) +
                         "' was listed by this read-only open but was gone when its size was read: a writer "
                         "retired it during the open; a reopen sees the newer state");
  RF_RETURN_IF_ERROR(listed);
  *out = WalReplay();
  const bool point_in_time = o_.wal_recovery == "point_in_time";
  std::vector<uint64_t> numbers;
  for (const WalFileInfo& f : files) numbers.push_back(f.number);
  out->start_listed = std::binary_search(numbers.begin(), numbers.end(), pstate_.wal_start);
  // The wal_start file is kept until a commit moves past it (made durable before that commit
  // names it), and a commit deletes only the files below its new wal_start. So it is never
  // legitimately missing: with later files there, the metadata is older than the WAL, i.e. it
  // lost commits (a truncated RocksDB log), whose items were in the deleted files — replaying
  // the later ones onto the old state would mix two states, and a writer would then reuse the
  // slots of the lost commits' pages; without, the file was deleted with what it logged.
  if (pstate_.wal_start_kept && !out->start_listed) {
    const bool later = !numbers.empty() && numbers.back() > pstate_.wal_start;
    const std::string msg = "store '" + path_ + "': the metadata names WAL file " +
                            WalFileName(wal_dir_, pstate_.wal_start) + " as the first to replay, but it is missing" +
                            (later ? " while later WAL files exist" : "");
    if (o_.read_only && WriterMovedOn())  // it may have committed past the snapshot's state since: retry
      return Status::Stale(msg + " (a writer moved on, or the metadata lost commits); reopen");
    return Status::Corruption(msg + (later ? ": the metadata database lost commits (its log damaged or truncated)"
                                           : ": it was deleted, and with it what was logged since the last flush"));
  }
  // The files from wal_start on are consecutive and only the last may be empty (writers keep
  // them so: FindWalSequenceBreak). A missing number was deleted, an empty file before the
  // last was cut to nothing; either way records are gone, synced ones among them, and
  // replaying the later files without them would apply writes on top of a state that never
  // existed. Stores whose last commit predates the rule may have gaps (their writers unlinked
  // empty files at open): they open as before.
  uint64_t replay_to = UINT64_MAX;  // no file numbered above it is replayed (point_in_time)
  const auto name = [&](uint64_t no) {  // a WAL file's path, quoted
    std::string q(1, '\'');  // (not "'" + string: GCC 12 warns on that, -Wrestrict)
    q += WalFileName(wal_dir_, no);
    q += '\'';
    return q;
  };
  const WalSequenceBreak brk = FindWalSequenceBreak(files, pstate_.wal_start);
  if (brk.found && pstate_.wal_files_consecutive) {
    std::string what;
    if (brk.empty)
      what = "WAL file " + name(brk.last_good) + " is empty although a later one, " + name(brk.next) +
             ", exists: only the newest WAL file can be empty, so it was cut to zero bytes";
    else if (brk.next == brk.last_good + 2)
      what = "WAL file " + name(brk.last_good + 1) + " is missing between " + name(brk.last_good) + " and " +
             name(brk.next);
    else
      what = "WAL files " + name(brk.last_good + 1) + " to " + name(brk.next - 1) + " are missing between " +
             name(brk.last_good) + " and " + name(brk.next);
    const std::string msg = "store '" + path_ + "': " + what + " (the WAL files from the first one the metadata names, " +
                            name(pstate_.wal_start) + ", on are consecutive)";
    // A read-only open takes no lock: a writer's commit deletes the files below its new
    // wal_start while this open lists them, so its snapshot may name files being retired.
    if (o_.read_only && WriterMovedOn())
      return Status::Stale(msg + ": a writer holds the store's LOCK or committed since this read-only open read "
                                 "its metadata, and may have retired WAL files under that snapshot; reopen");
    if (!point_in_time)
      return Status::Corruption(msg + ": the records it held are lost, synced writes among them, and replaying the "
                                      "later WAL files without them would mix states. Restore it, or open with "
                                      "StoreOptions(wal_recovery='point_in_time') to open the store as of the WAL files up to " +
                                      name(brk.last_good) + " (a writable open then deletes the later ones)");
    replay_to = brk.last_good;
  }
  // The newest files: a session commits its file as the newest (wal_last) before it logs a
  // record there, so files missing up to it were deleted with what they logged, synced writes
  // among them. Without this, nothing after them in the directory would say they existed.
  const uint64_t newest = numbers.empty() ? 0 : numbers.back();
  if (replay_to == UINT64_MAX && pstate_.wal_last > std::max(newest, pstate_.wal_start - 1)) {
    const uint64_t first = std::max(newest + 1, pstate_.wal_start);
    const std::string gone = first == pstate_.wal_last
                                 ? "WAL file " + name(first) + " is missing"
                                 : "WAL files " + name(first) + " to " + name(pstate_.wal_last) + " are missing";
    const std::string there =
        newest >= pstate_.wal_start ? "the last one there is " + name(newest) : "none from the first one it names is there";
    const std::string msg = "store '" + path_ + "': " + gone + " (the metadata records " + name(pstate_.wal_last) +
                            " as the newest file a session logged to; " + there + ")";
    if (o_.read_only && WriterMovedOn())
      return Status::Stale(msg + ": a writer holds the store's LOCK or committed since this read-only open read its "
                                 "metadata; reopen");
    if (!point_in_time)
      return Status::Corruption(msg + ": deleted, and with it the records logged there, synced writes among them. "
                                      "Restore it, or open with StoreOptions(wal_recovery='point_in_time') to open the "
                                      "store as of the WAL files that are there (a writable open then records that as "
                                      "the store's state)");
  }
  out->consecutive = !brk.found || replay_to != UINT64_MAX;  // point_in_time: the later files go below
  std::vector<uint64_t> skipped, replayed;  // from wal_start on: passed over (point_in_time) / read
  uint64_t cut_at = 0;                      // with a damaged record (point_in_time): its offset in replay_to
  bool damaged = false;
  for (const WalFileInfo& f : files) {
    const uint64_t no = f.number;
    const std::string name = WalFileName(wal_dir_, no);
    if (no < pstate_.wal_start) {
      if (!o_.read_only) ::unlink(name.c_str());  // its items are in committed pages
      continue;
    }
    if (no > replay_to) {
      skipped.push_back(no);
      wal_bytes_dropped_ += f.bytes;
      continue;
    }
    RF_PAUSE_POINT("wal.replay.before_open");  // listed, not yet opened: tests retire it here
    WalReadEnd end;
    Status read = ReadWalFile(
        name,
        [&](uint8_t type, const std::string& p) RF_REQUIRES(write_mu_) -> Status {
          if (type != kWalBatch) return Status::Corruption("unknown WAL record type in '" + name + "'");
          DecodedBatch d;
          RF_RETURN_IF_ERROR(DecodeBatch(p, name, &d));
          if (!features_.Get(d.fid))
            return Status::Corruption("WAL record in '" + name + "' names unknown feature id " + std::to_string(d.fid));
          MutexLock l(&mu_);
          buffer_.feature(d.fid).Append(d.keys.data(), d.n, d.values, d.offsets.empty() ? nullptr : d.offsets.data(),
                                        d.width, d.is_delete());
          recovered_wal_records_++;
          return Status::OK();
        },
        &end, point_in_time);
    // Listed above, gone at its open. A read-only open takes no lock: the writer committed a
    // flush past this file since the metadata snapshot was taken and deleted it. The snapshot
    // is stale, not damaged; Store::Open reopens, and the reopen judges the state it finds (a
    // wal_start file missing with no writer is still Corruption above). A writable open holds
    // the LOCK, so nobody may retire its files: the IOError stands.
    if (end.missing && o_.read_only)
      return Status::Stale("store '" + path_ + "': WAL file '" + name + "' was listed by this read-only open but "
                           "was gone when it was opened for replay: a writer retired it during the open (the "
                           "store moved past the metadata this open read); a reopen sees the newer state");
    RF_RETURN_IF_ERROR(read);
    // An empty file (the fresh file of a session that wrote nothing) stays: the session reuses
    // it when it is the last, and before the last one it is a break (above).
    if (end.file_bytes == 0) continue;
    replayed.push_back(no);
    wal_bytes_dropped_ += end.dropped_bytes;
    // Point in time: nothing logged after the damage is replayed, later files included (a torn
    // tail is different: the file's writer died there, and the next session wrote the next file).
    if (end.damaged) {
      damaged = true;
      cut_at = end.file_bytes - end.dropped_bytes;
      replay_to = no;
    }
  }
  if (replay_to != UINT64_MAX) {
    out->last_number = replay_to;
    for (const WalFileInfo& f : files)
      if (f.number == replay_to) out->last_empty = damaged ? cut_at == 0 : f.bytes == 0;
  } else if (!files.empty() && files.back().number >= pstate_.wal_start) {
    out->last_number = files.back().number;
    out->last_empty = files.back().bytes == 0;
  }
  if (o_.read_only) return Status::OK();
  // A writable point_in_time open makes the point it opened at the store's state before this
  // session logs anything: the later files are deleted (the directory synced), then the
  // damaged record and what follows it cut from its file. Otherwise this session's file would
  // follow them, and the next open would replay them again (or, with point_in_time, drop this
  // session's writes with them). In that order, a crash part way leaves the break (or the
  // damage) for the next open to refuse, never a cut file followed by the dropped ones.
  for (uint64_t no : skipped) {
    const std::string name = WalFileName(wal_dir_, no);
    if (::unlink(name.c_str()) != 0 && errno != ENOENT) return Status::FromErrno("unlink", name, errno);
  }
  if (!skipped.empty()) RF_RETURN_IF_ERROR(SyncDir(wal_dir_));
  if (damaged) {
    const std::string name = WalFileName(wal_dir_, replay_to);
    if (::truncate(name.c_str(), static_cast<off_t>(cut_at)) != 0) return Status::FromErrno("truncate", name, errno);
    RF_RETURN_IF_ERROR(SyncWalFile(name));
  }
  // The session's file follows the last one only once what that holds is durable: a process
  // killed before syncing its appends leaves them in the page cache, and a power loss after
  // this open created its file could then cut the last file to nothing behind it (an empty file
  // before the last, which the next open refuses). Earlier files were synced before their
  // successor was made.
  if (!out->last_empty)
    for (uint64_t no : replayed) RF_RETURN_IF_ERROR(SyncWalFile(WalFileName(wal_dir_, no)));
  return Status::OK();
}

}  // namespace recflash
