// WAL framing (crc | length | type | payload) with torn tails, the batch payload encoder and
// decoder, and the WAL file names.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "reader/csrc/filename.h"
#include "reader/csrc/wal.h"
#include "reader/csrc/write_batch.h"

namespace recflash {
namespace {

class WalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("recflash_wal_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = WalFileName(dir_.string(), 7);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<std::string> Write(const std::vector<std::string>& payloads) {
    WalWriter w;
    EXPECT_TRUE(w.Open(path_).ok());
    for (const auto& p : payloads) EXPECT_TRUE(w.Append(kWalBatch, p).ok());
    EXPECT_TRUE(w.Sync().ok());
    return payloads;
  }
  std::vector<std::string> Read(bool* torn, bool point_in_time = false, WalReadEnd* out = nullptr) {
    std::vector<std::string> got;
    WalReadEnd end;
    Status s = ReadWalFile(
        path_,
        [&](uint8_t type, const std::string& p) {
          EXPECT_EQ(type, kWalBatch);
          got.push_back(p);
          return Status::OK();
        },
        &end, point_in_time);
    EXPECT_TRUE(s.ok()) << s.ToString();
    *torn = end.torn_tail;
    if (out) *out = end;
    return got;
  }
  void Poke(uint64_t at, char c) {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(c);
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(WalTest, RecordsRoundTrip) {
  const auto want = Write({"a", std::string(100000, 'x'), "", "last"});
  bool torn = true;
  EXPECT_EQ(Read(&torn), want);
  EXPECT_FALSE(torn);
}

TEST_F(WalTest, TornTailEndsReplayAtTheLastIntactRecord) {
  const auto want = Write({"first", "second", std::string(5000, 'z')});
  const auto size = std::filesystem::file_size(path_);
  // Cut inside the last record's payload, then inside its header.
  for (uint64_t cut : {size - 100, size - 5000 - 9 + 4}) {
    std::filesystem::resize_file(path_, cut);
    bool torn = false;
    EXPECT_EQ(Read(&torn), (std::vector<std::string>{"first", "second"}));
    EXPECT_TRUE(torn);
  }
}

// A damaged record with records after it is not a torn append: replaying up to it would drop
// the later ones (synced, perhaps) without a word, so it fails, naming the file and offset.
TEST_F(WalTest, DamagedRecordWithLaterRecordsIsCorruption) {
  Write({"first", "second", "third"});
  Poke(9 + 5 + 9 + 2, '#');  // a payload byte of "second"
  std::vector<std::string> got;
  WalReadEnd end;
  Status s = ReadWalFile(
      path_, [&](uint8_t, const std::string& p) { got.push_back(p); return Status::OK(); }, &end);
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.ToString();
  EXPECT_NE(s.ToString().find(path_), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find("byte 14"), std::string::npos) << s.ToString();
  EXPECT_EQ(got, std::vector<std::string>{"first"});
  // Point-in-time recovery replays up to it and says what it passed over.
  bool torn = true;
  WalReadEnd pit;
  EXPECT_EQ(Read(&torn, true, &pit), std::vector<std::string>{"first"});
  EXPECT_FALSE(torn);
  EXPECT_TRUE(pit.damaged);
  EXPECT_EQ(pit.dropped_bytes, std::filesystem::file_size(path_) - 14);
}

// The last record failing its checksum, or a bad record followed only by zeros (a file
// extended before its data arrived), is a torn tail.
TEST_F(WalTest, DamagedLastRecordOrZerosAfterItIsATornTail) {
  Write({"first", "second", "third"});
  const auto size = std::filesystem::file_size(path_);
  Poke(size - 1, '#');
  bool torn = false;
  EXPECT_EQ(Read(&torn), (std::vector<std::string>{"first", "second"}));
  EXPECT_TRUE(torn);
  std::filesystem::remove(path_);
  Write({"first", "second", std::string(5000, 'z')});
  const auto size2 = std::filesystem::file_size(path_);
  for (uint64_t at = size2 - 4000; at < size2; at++) Poke(at, '\0');
  torn = false;
  WalReadEnd end;
  EXPECT_EQ(Read(&torn, false, &end), (std::vector<std::string>{"first", "second"}));
  EXPECT_TRUE(torn);
  EXPECT_FALSE(end.damaged);
  EXPECT_EQ(end.dropped_bytes, 5000u + 9);
}

// A directory where a log file should be is damage, not an empty log.
TEST_F(WalTest, ADirectoryInPlaceOfALogIsCorruption) {
  std::filesystem::create_directories(path_);
  WalReadEnd end;
  Status s = ReadWalFile(path_, [](uint8_t, const std::string&) { return Status::OK(); }, &end);
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.ToString();
  EXPECT_FALSE(end.missing);
}

// So is a FIFO, and opening it must not wait for a writer to appear on its other end.
TEST_F(WalTest, AFifoInPlaceOfALogIsCorruptionWithoutBlocking) {
  ASSERT_EQ(::mkfifo(path_.c_str(), 0600), 0);
  WalReadEnd end;
  Status s = ReadWalFile(path_, [](uint8_t, const std::string&) { return Status::OK(); }, &end);
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("not a regular file"), std::string::npos) << s.ToString();
}

// A file that is not there (listed, then retired by a writer) is told apart from every other
// failure by end.missing, not by the message: the read-only open turns it into Stale.
TEST_F(WalTest, AMissingFileIsMarkedMissing) {
  WalReadEnd end;
  end.torn_tail = true;  // reset by the call
  int calls = 0;
  Status s = ReadWalFile(path_, [&](uint8_t, const std::string&) { calls++; return Status::OK(); }, &end);
  EXPECT_EQ(s.code(), Status::Code::kIOError) << s.ToString();
  EXPECT_EQ(s.sys_errno(), ENOENT);
  EXPECT_NE(s.message().find(path_), std::string::npos) << s.ToString();
  EXPECT_TRUE(end.missing);
  EXPECT_FALSE(end.torn_tail);
  EXPECT_EQ(calls, 0);
}

// The size comes from the opened descriptor; an empty log is read as holding nothing.
TEST_F(WalTest, FileBytesIsTheSizeAtTheOpen) {
  bool torn = false;
  WalReadEnd end;
  { std::ofstream(path_, std::ios::binary); }
  EXPECT_TRUE(Read(&torn, false, &end).empty());
  EXPECT_EQ(end.file_bytes, 0u);
  EXPECT_FALSE(torn);
  std::filesystem::remove(path_);
  Write({"abc", std::string(100, 'x')});
  EXPECT_EQ(Read(&torn, false, &end).size(), 2u);
  EXPECT_EQ(end.file_bytes, 2 * 9 + 3 + 100u);
  EXPECT_FALSE(end.missing);
}

TEST(WriteBatch, FixedWidthPutAndDeleteRoundTrip) {
  const uint64_t keys[] = {3, 1, 4};
  const float vals[] = {1.5f, 2.5f, 3.5f};
  const std::string put =
      EncodeBatch(kOpPut, 9, keys, 3, 4, reinterpret_cast<const uint8_t*>(vals), nullptr);
  DecodedBatch d;
  ASSERT_TRUE(DecodeBatch(put, "w", &d).ok());
  EXPECT_EQ(d.op, kOpPut);
  EXPECT_EQ(d.fid, 9u);
  EXPECT_EQ(d.width, 4u);
  EXPECT_EQ(d.keys, std::vector<uint64_t>(keys, keys + 3));
  EXPECT_EQ(std::memcmp(d.values, vals, sizeof vals), 0);
  EXPECT_FALSE(d.is_delete());
  const std::string del = EncodeBatch(kOpDelete, 2, keys, 2, 8, nullptr, nullptr);
  ASSERT_TRUE(DecodeBatch(del, "w", &d).ok());
  EXPECT_TRUE(d.is_delete());
  EXPECT_EQ(d.keys, (std::vector<uint64_t>{3, 1}));
  EXPECT_EQ(d.values, nullptr);
}

TEST(WriteBatch, VariableWidthPartsMatchTheEncoding) {
  const uint64_t keys[] = {10, 20};
  const uint8_t vals[] = {'x', 'a', 'b', 'c', 'd', 'e'};
  const int64_t offs[] = {1, 3, 6};  // values start at offsets[0]
  const std::string whole = EncodeBatch(kOpPut, 1, keys, 2, 0, vals, offs);
  uint8_t header[kBatchHeaderBytes];
  std::vector<uint32_t> lens;
  std::vector<iovec> parts;
  size_t bytes = 0;
  BatchParts(kOpPut, 1, keys, 2, 0, vals, offs, header, &lens, &parts, &bytes);
  std::string joined;
  for (const iovec& v : parts) joined.append(static_cast<const char*>(v.iov_base), v.iov_len);
  EXPECT_EQ(joined, whole);
  EXPECT_EQ(bytes, whole.size());
  DecodedBatch d;
  ASSERT_TRUE(DecodeBatch(whole, "w", &d).ok());
  EXPECT_EQ(d.offsets, (std::vector<int64_t>{0, 2, 5}));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(d.values), 5), "abcde");
}

TEST(WriteBatch, ShortAndTruncatedPayloadsAreCorruption) {
  const uint64_t keys[] = {1, 2};
  const int64_t offs[] = {0, 2, 4};
  const uint8_t vals[] = {1, 2, 3, 4};
  const std::string whole = EncodeBatch(kOpPut, 1, keys, 2, 0, vals, offs);
  DecodedBatch d;
  for (size_t n : {size_t{0}, size_t{12}, size_t{13 + 8}, whole.size() - 1}) {
    Status s = DecodeBatch(whole.substr(0, n), "wal/000001.log", &d);
    EXPECT_EQ(s.code(), Status::Code::kCorruption) << n;
    EXPECT_NE(s.message().find("wal/000001.log"), std::string::npos);
  }
  std::string bad = whole;
  bad[0] = 9;  // unknown op
  EXPECT_EQ(DecodeBatch(bad, "w", &d).code(), Status::Code::kCorruption);
}

// The run of WAL files from the metadata's first one on: consecutive, only the last empty.
TEST(WalSequence, ConsecutiveFilesWithAnEmptyLastOneHaveNoBreak) {
  using V = std::vector<WalFileInfo>;
  EXPECT_FALSE(FindWalSequenceBreak(V{}, 5).found);
  EXPECT_FALSE(FindWalSequenceBreak(V{{5, 0}}, 5).found);  // a session that wrote nothing
  EXPECT_FALSE(FindWalSequenceBreak(V{{5, 10}, {6, 20}, {7, 0}}, 5).found);
  // Below the first one: ignored (a commit's deletions not done yet), gaps and empty ones too.
  EXPECT_FALSE(FindWalSequenceBreak(V{{1, 0}, {3, 7}, {5, 10}, {6, 0}}, 5).found);
  // Whether the first one itself is there is the caller's check (wal_start_kept).
  EXPECT_FALSE(FindWalSequenceBreak(V{{6, 10}, {7, 0}}, 5).found);
}

TEST(WalSequence, AMissingNumberIsABreakAfterTheFileBeforeIt) {
  using V = std::vector<WalFileInfo>;
  WalSequenceBreak b = FindWalSequenceBreak(V{{5, 10}, {6, 10}, {8, 10}, {9, 0}}, 5);
  ASSERT_TRUE(b.found);
  EXPECT_FALSE(b.empty);
  EXPECT_EQ(b.last_good, 6u);
  EXPECT_EQ(b.next, 8u);
  b = FindWalSequenceBreak(V{{5, 10}, {9, 10}, {11, 10}}, 5);  // several missing: the first gap
  ASSERT_TRUE(b.found);
  EXPECT_EQ(b.last_good, 5u);
  EXPECT_EQ(b.next, 9u);
}

TEST(WalSequence, AnEmptyFileBeforeTheLastIsABreakAtIt) {
  using V = std::vector<WalFileInfo>;
  WalSequenceBreak b = FindWalSequenceBreak(V{{5, 10}, {6, 0}, {7, 10}}, 5);
  ASSERT_TRUE(b.found);
  EXPECT_TRUE(b.empty);
  EXPECT_EQ(b.last_good, 6u);
  EXPECT_EQ(b.next, 7u);
  b = FindWalSequenceBreak(V{{5, 0}, {6, 0}}, 5);  // the first one cut too
  ASSERT_TRUE(b.found);
  EXPECT_TRUE(b.empty);
  EXPECT_EQ(b.last_good, 5u);
  // An empty file followed by a gap: the empty one comes first.
  b = FindWalSequenceBreak(V{{5, 10}, {6, 0}, {9, 10}}, 5);
  ASSERT_TRUE(b.found);
  EXPECT_TRUE(b.empty);
  EXPECT_EQ(b.last_good, 6u);
  EXPECT_EQ(b.next, 9u);
}

TEST_F(WalTest, ListingWithSizesSkipsOtherNames) {
  Write({"abc"});
  { std::ofstream(WalFileName(dir_.string(), 9)); }  // empty
  { std::ofstream(dir_ / "000008.log.tmp") << "x"; }
  std::vector<WalFileInfo> files;
  uint64_t vanished = 1;
  ASSERT_TRUE(ListWalFilesWithSizes(dir_.string(), &files, &vanished).ok());
  EXPECT_EQ(vanished, 0u);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].number, 7u);
  EXPECT_EQ(files[0].bytes, std::filesystem::file_size(path_));
  EXPECT_EQ(files[1].number, 9u);
  EXPECT_EQ(files[1].bytes, 0u);
  EXPECT_TRUE(SyncWalFile(path_).ok());
  EXPECT_EQ(SyncWalFile(WalFileName(dir_.string(), 8)).code(), Status::Code::kIOError);
}

TEST(FileNames, WalNamesParseBack) {
  EXPECT_EQ(WalFileName("/s/wal", 7), "/s/wal/000007.log");
  uint64_t n = 0;
  ASSERT_TRUE(ParseWalFileName("000007.log", &n));
  EXPECT_EQ(n, 7u);
  ASSERT_TRUE(ParseWalFileName("12345678.log", &n));
  EXPECT_EQ(n, 12345678u);
  EXPECT_FALSE(ParseWalFileName("abc.log", &n));
  EXPECT_FALSE(ParseWalFileName(".log", &n));
  EXPECT_FALSE(ParseWalFileName("000007.log.tmp", &n));
  EXPECT_EQ(std::string(FileBaseName(FileKind::kPages)), "pages.dat");
  EXPECT_EQ(StoreFileName("/s", FileKind::kMarker), "/s/RECFLASH");
}

}  // namespace
}  // namespace recflash
