// IoRing's read slots are made by the first read, not with the ring, and IoRingPool hands
// idle rings with slots to readers and those without to write rings (io_ring.cc).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "reader/csrc/io_ring.h"

namespace recflash {
namespace {

constexpr uint32_t kPage = 4096;

class IoRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/io_ring_test.XXXXXX";
    fd_ = ::mkstemp(tmpl);
    ASSERT_GE(fd_, 0);
    path_ = tmpl;
    std::vector<uint8_t> page(kPage);
    for (uint32_t p = 0; p < 8; p++) {
      std::memset(page.data(), static_cast<int>('a' + p), kPage);
      ASSERT_EQ(::pwrite(fd_, page.data(), kPage, static_cast<off_t>(p) * kPage), static_cast<ssize_t>(kPage));
    }
  }
  void TearDown() override {
    ::close(fd_);
    ::unlink(path_.c_str());
  }

  // Reads pages 0..7 in two runs and checks their bytes.
  void ReadAll(IoRing* ring) {
    std::vector<char> seen;
    const Status s = ring->ReadRuns(fd_, path_, kPage, {{0, 4}, {4, 4}}, [&](const PageRun& run, const uint8_t* d) {
      for (uint32_t i = 0; i < run.count; i++) {
        EXPECT_EQ(d[i * kPage], 'a' + run.first + i);
        EXPECT_EQ(d[i * kPage + kPage - 1], 'a' + run.first + i);
        seen.push_back(static_cast<char>(d[i * kPage]));
      }
      return Status::OK();
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(seen.size(), 8u);
  }

  int fd_ = -1;
  std::string path_;
};

TEST_F(IoRingTest, SlotsAreMadeByTheFirstReadNotByTheRing) {
  std::unique_ptr<IoRing> ring;
  ASSERT_TRUE(IoRing::Create(4, 4 * kPage, &ring).ok());
  EXPECT_FALSE(ring->has_slots());
  // Writes come from the caller's buffers: no slots needed.
  void* buf = nullptr;
  ASSERT_EQ(posix_memalign(&buf, kPage, kPage), 0);
  std::memset(buf, 'z', kPage);
  ASSERT_TRUE(ring->WriteRuns(fd_, path_, kPage, {{9, 1}}, {static_cast<const uint8_t*>(buf)}).ok());
  std::free(buf);
  EXPECT_FALSE(ring->has_slots());
  ReadAll(ring.get());
  EXPECT_TRUE(ring->has_slots());
  ReadAll(ring.get());  // and they are reused
}

TEST_F(IoRingTest, PoolGivesReadersRingsWithSlotsAndWritersRingsWithout) {
  IoRingPool pool(4, 4 * kPage, 4);
  std::unique_ptr<IoRing> reader, writer;
  ASSERT_TRUE(pool.Acquire(&reader).ok());
  ASSERT_TRUE(pool.Acquire(&writer, /*reads=*/false).ok());
  ReadAll(reader.get());
  IoRing* const with_slots = reader.get();
  IoRing* const without = writer.get();
  // Released in either order, each kind goes back to a lease of its kind, whichever lease
  // comes first (the ring a lease prefers is never simply the last one released).
  for (int order = 0; order < 2; order++) {
    if (order == 0) {
      pool.Release(std::move(reader));
      pool.Release(std::move(writer));  // idle: [with slots, without]
      ASSERT_TRUE(pool.Acquire(&reader).ok());
      ASSERT_TRUE(pool.Acquire(&writer, /*reads=*/false).ok());
    } else {
      pool.Release(std::move(writer));
      pool.Release(std::move(reader));  // idle: [without, with slots]
      ASSERT_TRUE(pool.Acquire(&writer, /*reads=*/false).ok());
      ASSERT_TRUE(pool.Acquire(&reader).ok());
    }
    EXPECT_EQ(writer.get(), without) << "order " << order;
    EXPECT_EQ(reader.get(), with_slots) << "order " << order;
    EXPECT_TRUE(reader->has_slots());
    EXPECT_FALSE(writer->has_slots());
  }
  // With only the other kind idle, a lease still takes it rather than making a new ring.
  pool.Release(std::move(reader));
  ASSERT_TRUE(pool.Acquire(&reader, /*reads=*/false).ok());
  EXPECT_EQ(reader.get(), with_slots);
  ReadAll(writer.get());  // a write ring that reads makes its slots then
  EXPECT_TRUE(writer->has_slots());
}

}  // namespace
}  // namespace recflash
