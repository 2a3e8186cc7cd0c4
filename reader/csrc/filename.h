// Every name the store gives a file or directory on disk, in one place (the LevelDB
// db/filename.h pattern). A store directory holds:
//
//   RECFLASH          marker: magic line, "format N", "page_size P" (written via RECFLASH.tmp)
//   LOCK              flock()ed by the one writer
//   pages.dat         the page file (fixed-size slots, O_DIRECT)
//   meta/             RocksDB: feature table, page table, persistent state
//   wal/NNNNNN.log    write-ahead log files, numbered
//   CHECKPOINT        derived state at the last clean close (via CHECKPOINT.tmp), consumed at open
//   BLOCKSUMS         crc32c sums of 512 B blocks of packed pages (a cache; may be absent)
//
// The Python side gets the same names from the native module (recflash._native.FILE_NAMES).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace recflash {

enum class FileKind { kMarker, kMarkerTemp, kLock, kPages, kMetaDir, kWalDir, kCheckpoint, kCheckpointTemp, kBlockSums };

// The bare name of a file of the store directory ("pages.dat").
const char* FileBaseName(FileKind kind);
// dir + "/" + FileBaseName(kind).
std::string StoreFileName(const std::string& dir, FileKind kind);
// (role, bare name) of every kind, for the Python side and for tools that list a store.
std::vector<std::pair<std::string, std::string>> StoreFileNames();

// wal/000007.log inside `wal_dir`.
std::string WalFileName(const std::string& wal_dir, uint64_t number);
// The number of a WAL file's bare name ("000007.log" -> 7); false for any other name.
bool ParseWalFileName(const std::string& name, uint64_t* number);

}  // namespace recflash
