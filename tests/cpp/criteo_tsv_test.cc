// The Criteo block parser's fast path (64-byte windows, SWAR fields) against its byte-at-a-time
// reference: on random well-formed blocks the columns are equal; on blocks with one byte
// changed (any byte value, anywhere: fields, separators, the scalar-parsed tail) both refuse
// or both produce the same columns. Plus the values themselves for the field shapes the fast
// path special-cases (8-digit ids, 9..16-digit ids, 1..8- and 9..18-digit integers, signs).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "ingest/csrc/criteo_tsv.h"

namespace recflash::ingest {
namespace {

struct Parsed {
  bool ok;
  CriteoColumns cols;
};

Parsed Parse(const std::string& s, bool has_label, bool scalar) {
  Parsed p;
  p.ok = ParseCriteoColumns(reinterpret_cast<const uint8_t*>(s.data()), s.size(), has_label, scalar, &p.cols);
  return p;
}

void ExpectSame(const std::string& s, bool has_label) {
  const Parsed a = Parse(s, has_label, false), b = Parse(s, has_label, true);
  ASSERT_EQ(a.ok, b.ok);
  if (!a.ok) return;
  ASSERT_EQ(a.cols.rows, b.cols.rows);
  ASSERT_EQ(a.cols.values, b.cols.values);
  ASSERT_EQ(a.cols.present, b.cols.present);
}

std::string Digits(std::mt19937_64& rng, int n, const char* alphabet, int size) {
  std::string s;
  for (int i = 0; i < n; i++) s += alphabet[rng() % size];
  return s;
}

std::string RandomBlock(std::mt19937_64& rng, int lines, bool has_label, bool last_newline) {
  std::string s;
  for (int l = 0; l < lines; l++) {
    if (has_label) s += std::to_string(rng() % 2) + "\t";
    for (int i = 0; i < kCriteoInts; i++) {
      if (rng() % 4) {
        if (rng() % 8 == 0) s += "-";
        s += Digits(rng, 1 + static_cast<int>(rng() % (rng() % 8 ? 6 : 18)), "0123456789", 10);
      }
      s += "\t";
    }
    for (int i = 0; i < kCriteoCats; i++) {
      if (rng() % 3) {
        const int len = rng() % 6 ? 8 : 1 + static_cast<int>(rng() % 16);
        s += Digits(rng, len, "0123456789abcdefABCDEF", 22);
      }
      s += i + 1 < kCriteoCats ? "\t" : "\n";
    }
  }
  if (!last_newline && !s.empty()) s.pop_back();
  return s;
}

TEST(CriteoTsv, FastPathEqualsTheReferenceOnWellFormedBlocks) {
  std::mt19937_64 rng(11);
  for (int t = 0; t < 200; t++) {
    const bool has_label = t % 2 == 0;
    const std::string s = RandomBlock(rng, 1 + static_cast<int>(rng() % 40), has_label, t % 3 != 0);
    const Parsed a = Parse(s, has_label, false);
    ASSERT_TRUE(a.ok) << s;
    ExpectSame(s, has_label);
  }
}

TEST(CriteoTsv, FastPathAndReferenceAgreeOnDamagedBlocks) {
  std::mt19937_64 rng(12);
  const char* interesting = "\t\n\r -+0123456789aAfFgG:/@`G\x80\xff";
  for (int t = 0; t < 3000; t++) {
    const bool has_label = t % 2 == 1;
    std::string s = RandomBlock(rng, 1 + static_cast<int>(rng() % 12), has_label, true);
    const size_t at = rng() % s.size();
    if (rng() % 2) {
      s[at] = static_cast<char>(rng() % 256);
    } else {
      s[at] = interesting[rng() % std::strlen(interesting)];
    }
    if (rng() % 4 == 0) s.insert(at, 1, s[rng() % s.size()]);
    ExpectSame(s, has_label);
  }
}

TEST(CriteoTsv, FieldValues) {
  const std::string ints = "-17\t007\t123456789012345678\t-99999999\t99999999\t0\t-0\t1\t\t\t\t\t12345678";
  const std::string cats = "68fd1e64\tFFFFFFFF\t1\tabc\t0123456789abcdef\tffffffffffffffff\t123456789\t"
                           "7fffffffffffffff";
  std::string line = "1\t" + ints + "\t" + cats + std::string(kCriteoCats - 8, '\t') + "\n";
  std::string block;
  for (int i = 0; i < 4; i++) block += line;  // lines past the 128-byte tail take the fast path
  for (bool scalar : {false, true}) {
    const Parsed p = Parse(block, true, scalar);
    ASSERT_TRUE(p.ok);
    ASSERT_EQ(p.cols.rows, 4u);
    const auto& v = p.cols.values;
    EXPECT_EQ(v[1][0], -17);
    EXPECT_EQ(v[2][0], 7);
    EXPECT_EQ(v[3][0], 123456789012345678);
    EXPECT_EQ(v[4][0], -99999999);
    EXPECT_EQ(v[5][0], 99999999);
    EXPECT_EQ(v[6][0], 0);
    EXPECT_EQ(v[7][0], 0);
    EXPECT_EQ(v[8][0], 1);
    EXPECT_TRUE(v[9].empty());
    EXPECT_EQ(p.cols.present[9], std::vector<uint8_t>(4, 0));
    EXPECT_EQ(v[13][0], 12345678);
    EXPECT_EQ(v[14][0], 0x68fd1e64);
    EXPECT_EQ(v[15][0], 0xFFFFFFFF);
    EXPECT_EQ(v[16][0], 1);
    EXPECT_EQ(v[17][0], 0xabc);
    EXPECT_EQ(v[18][0], 0x0123456789abcdef);
    EXPECT_EQ(v[19][0], -1);  // 16 digits above 2^63 wrap, as the reference does
    EXPECT_EQ(v[20][0], 0x123456789);
    EXPECT_EQ(v[21][0], 0x7fffffffffffffff);
  }
  for (const char* bad : {"-", "--1", "1-", "12a", "1234567890123456789", "+1", " 1"}) {
    std::string b = block;
    b.replace(b.find("007"), 3, bad);
    EXPECT_FALSE(Parse(b, true, false).ok) << bad;
    EXPECT_FALSE(Parse(b, true, true).ok) << bad;
  }
  for (const char* bad : {"68fd1e6g", "-8fd1e64", "0123456789abcdef0", "12 4"}) {
    std::string b = block;
    b.replace(b.find("68fd1e64"), 8, bad);
    EXPECT_FALSE(Parse(b, true, false).ok) << bad;
    EXPECT_FALSE(Parse(b, true, true).ok) << bad;
  }
}

}  // namespace
}  // namespace recflash::ingest
