// Status codes come from one list (status.h): enum, factories, names and the Python table.
#include <gtest/gtest.h>

#include <set>

#include "reader/csrc/status.h"

namespace recflash {
namespace {

TEST(Status, NamesAndTableFromOneList) {
  EXPECT_EQ(Status::OK().ToString(), "OK");
  EXPECT_EQ(Status::Corruption("page 3").ToString(), "Corruption: page 3");
  EXPECT_EQ(Status::Stale("x").ToString(), "Stale: x");
  EXPECT_EQ(Status::ReadOnly("x").code(), Status::Code::kReadOnly);
  // A value outside the list still prints (the switch's default branch).
  EXPECT_EQ(Status::CodeName(static_cast<Status::Code>(999)), "Unknown(999)");
  std::set<std::string> classes;
  int expect = 1;
  for (const Status::CodeInfo& c : Status::Codes()) {
    EXPECT_EQ(c.code, expect++);
    EXPECT_EQ(Status::CodeName(static_cast<Status::Code>(c.code)), c.name);
    EXPECT_TRUE(classes.insert(c.python_class).second) << c.python_class;
  }
  EXPECT_EQ(Status::Codes().size(), 12u);
}

TEST(Status, FromErrnoNamesCallAndPath) {
  const Status s = Status::FromErrno("open", "/x/pages.dat", 2);
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_NE(s.message().find("open failed on '/x/pages.dat'"), std::string::npos);
  EXPECT_NE(s.message().find("errno 2"), std::string::npos);
}

}  // namespace
}  // namespace recflash
