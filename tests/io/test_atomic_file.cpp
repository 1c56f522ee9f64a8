// The atomic-file helper (summa/io/atomic_file.hpp), serial: a committed
// file has exactly the bytes written (appends and positioned writes, a gap
// reading as zeros) and replaces the old one; an uncommitted one leaves the
// old file and no temporary behind; errors name the path and the system's
// reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "summa/core/error.hpp"
#include "summa/io/atomic_file.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int entries(const fs::path& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(AtomicFile, CommitReplacesAbandonLeavesTheOldFile) {
  TempDir dir("summa_atomic_file_");
  const fs::path file = dir.path() / "f.bin";
  io::write_file_atomic(file, "old");
  EXPECT_EQ(read_all(file), "old");
  {
    io::AtomicFile out(file);
    EXPECT_EQ(out.temp_path().parent_path(), dir.path());
    out.write("ab", 2);
    out.write_at(5, "xy", 2);          // bytes 2..4 are a gap
    out.write("z", 1);                 // appends after the furthest byte
    EXPECT_EQ(read_all(file), "old");  // not in place before commit()
    out.commit();
    EXPECT_NE(error_of([&] { out.commit(); }).find("committed twice"), std::string::npos);
  }
  EXPECT_EQ(read_all(file), std::string("ab\0\0\0xyz", 8));
  EXPECT_EQ(entries(dir.path()), 1);
  {
    io::AtomicFile abandoned(file);
    abandoned.write("new", 3);
    EXPECT_EQ(entries(dir.path()), 2);
  }  // no commit(): the temporary file goes, the old file stays
  EXPECT_EQ(read_all(file), std::string("ab\0\0\0xyz", 8));
  EXPECT_EQ(entries(dir.path()), 1);
}

TEST(AtomicFile, ErrorsNameThePathAndTheReason) {
  TempDir dir("summa_atomic_file_");
  const fs::path missing = dir.path() / "no_such_dir" / "f.bin";
  std::string msg = error_of([&] { io::write_file_atomic(missing, "x", "the test"); });
  EXPECT_EQ(msg.rfind("the test: cannot create the temporary file", 0), 0u) << msg;
  EXPECT_NE(msg.find(missing.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  // the target is a directory: the rename fails, nothing is left behind
  const fs::path sub = dir.path() / "sub";
  fs::create_directories(sub / "inside");
  msg = error_of([&] { io::write_file_atomic(sub, "x"); });
  EXPECT_NE(msg.find("renaming"), std::string::npos) << msg;
  EXPECT_NE(msg.find(sub.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("directory"), std::string::npos) << msg;  // "Is a directory"
  EXPECT_EQ(entries(dir.path()), 1);
  msg = error_of([&] { io::sync_directory(missing.parent_path()); });
  EXPECT_NE(msg.find(missing.parent_path().string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

}  // namespace
}  // namespace summa::test
