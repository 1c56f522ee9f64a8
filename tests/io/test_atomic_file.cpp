// The atomic-file helper (summa/io/atomic_file.hpp), serial: a committed
// file has exactly the bytes written (appends and positioned writes, a gap
// reading as zeros) and replaces the old one; an uncommitted one leaves the
// old file and no temporary behind; errors name the path and the system's
// reason; a temporary left by a writer that died is cleared by the next
// write of its file, one a live writer holds is not. Also io/files.hpp: what is not a regular file
// is named.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "summa/core/error.hpp"
#include "summa/io/atomic_file.hpp"
#include "summa/io/files.hpp"
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
  // the target is a directory: refused before anything is written, nothing
  // is left behind
  const fs::path sub = dir.path() / "sub";
  fs::create_directories(sub / "inside");
  msg = error_of([&] { io::write_file_atomic(sub, "x"); });
  EXPECT_NE(msg.find("is a directory, not a regular file: refusing to replace it"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(sub.string()), std::string::npos) << msg;
  EXPECT_EQ(entries(dir.path()), 1);
  // a FIFO (or, for root, a device such as /dev/full) is never replaced
  const fs::path fifo = dir.path() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  msg = error_of([&] { io::write_file_atomic(fifo, "x", "the test"); });
  EXPECT_EQ(msg.rfind("the test: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("is a FIFO (named pipe), not a regular file: refusing to replace it"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_EQ(entries(dir.path()), 2);
  fs::remove(fifo);
  msg = error_of([&] { io::sync_directory(missing.parent_path()); });
  EXPECT_NE(msg.find(missing.parent_path().string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

// A link to a regular file is written through: the file it names gets the
// new contents, the link stays a link (was: the link replaced by a file, its
// target left stale). A dangling link is replaced like a missing file.
TEST(AtomicFile, LinksAreWrittenThrough) {
  TempDir dir("summa_atomic_link_");
  const fs::path real = dir.path() / "real.json", link = dir.path() / "link.json",
                 dangling = dir.path() / "dangling";
  std::ofstream(real) << "old";
  fs::create_symlink("real.json", link);
  io::write_file_atomic(link, "new", "the test");
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(link)));
  std::ifstream in(real);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "new");
  fs::create_symlink("nowhere", dangling);
  io::write_file_atomic(dangling, "x", "the test");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dangling)));
  EXPECT_EQ(entries(dir.path()), 3);  // no temporary left
}

// io/files.hpp: what is not a regular file is named before any open can
// block; a regular file opens for blocking reads; a missing one is -1/ENOENT.
// A writer that died mid-write (kill -9 during an export) leaves
// "<file>.tmp-<16 hex>"; the next AtomicFile of that file removes it, but
// never a temporary a live writer holds (its flock), a young one (the
// instant between a writer's open and its lock), another file's, or a name
// that is not a temporary's.
TEST(AtomicFile, TheNextWriteClearsWhatADeadWriterLeft) {
  TempDir dir("summa_atomic_stale_");
  const fs::path file = dir.path() / "model.safetensors";
  const auto make = [&](const std::string& name, bool old) {
    const fs::path p = dir.path() / name;
    std::ofstream(p) << "partial";
    if (old) {
      const timespec times[2] = {{std::time(nullptr) - 7200, 0}, {std::time(nullptr) - 7200, 0}};
      EXPECT_EQ(::utimensat(AT_FDCWD, p.c_str(), times, 0), 0);
    }
    return p;
  };
  const fs::path dead = make("model.safetensors.tmp-0123456789abcdef", true);
  const fs::path held = make("model.safetensors.tmp-fedcba9876543210", true);
  const fs::path young = make("model.safetensors.tmp-00000000000000aa", false);
  const fs::path other = make("config.json.tmp-0123456789abcdef", true);
  const fs::path not_ours = make("model.safetensors.tmp-notahexsalt0000", true);
  // A live writer's lock (flock locks belong to the open file, so one taken
  // here excludes the helper's own open of the same file).
  const int holder = ::open(held.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(holder, 0);
  ASSERT_EQ(::flock(holder, LOCK_EX | LOCK_NB), 0);
  {
    io::AtomicFile out(file);  // clears before it writes
    EXPECT_FALSE(fs::exists(dead));
    // its own temporary is locked too: not cleared even at age 0
    EXPECT_EQ(io::remove_stale_temporaries(file, 0), 1u);  // young: unlocked, age 0 allowed
    EXPECT_TRUE(fs::exists(out.temp_path()));
    out.write("ok", 2);
    out.commit();
  }
  EXPECT_FALSE(fs::exists(young));
  EXPECT_TRUE(fs::exists(held));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(not_ours));
  EXPECT_EQ(read_all(file), "ok");
  ::close(holder);  // the writer is gone: its temporary goes with the next write
  io::write_file_atomic(file, "ok2");
  EXPECT_FALSE(fs::exists(held));
  EXPECT_EQ(read_all(file), "ok2");
  EXPECT_EQ(io::remove_stale_temporaries(file, 0), 0u);
  EXPECT_EQ(entries(dir.path()), 3);  // the file, another file's and a foreign name
  // A temporary stamped a little ahead of the clock (a file system's finer
  // clock than the one `now` is read from: CI once saw time() a second
  // behind a fresh file) is just written, age 0, not of a negative age that
  // no limit admits.
  const fs::path ahead = make("model.safetensors.tmp-00000000000000bb", false);
  timespec future{};
  ::clock_gettime(CLOCK_REALTIME, &future);
  future.tv_sec += 2;
  const timespec times[2] = {future, future};
  ASSERT_EQ(::utimensat(AT_FDCWD, ahead.c_str(), times, 0), 0);
  EXPECT_EQ(io::remove_stale_temporaries(file, 60), 0u);  // too young for the default
  EXPECT_EQ(io::remove_stale_temporaries(file, 0), 1u);
  EXPECT_FALSE(fs::exists(ahead));
}

TEST(Files, NonRegularFilesAreNamedBeforeTheyBlock) {
  TempDir dir("summa_files_");
  const fs::path regular = dir.path() / "regular", fifo = dir.path() / "fifo",
                 dangling = dir.path() / "dangling", loop = dir.path() / "loop",
                 missing = dir.path() / "missing";
  std::ofstream(regular) << "text";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink("nowhere", dangling);
  fs::create_symlink("loop", loop);
  EXPECT_EQ(io::non_regular_kind(regular), "");
  EXPECT_EQ(io::non_regular_kind(missing), "");
  EXPECT_EQ(io::non_regular_kind(fifo), "a FIFO (named pipe)");
  EXPECT_EQ(io::non_regular_kind(dir.path()), "a directory");
  EXPECT_EQ(io::non_regular_kind("/dev/null"), "a character device");
  EXPECT_EQ(io::non_regular_kind(dangling), "a dangling symbolic link (to 'nowhere')");
  EXPECT_EQ(io::non_regular_kind(loop), "a symbolic link loop");
  EXPECT_NO_THROW(io::require_regular_file(regular, "x"));
  EXPECT_NO_THROW(io::require_regular_file(missing, "x"));
  const auto message = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { io::require_regular_file(fifo, "--log"); }),
            "--log: '" + fifo.string() + "' is a FIFO (named pipe), not a regular file");
  // no reader or writer on the FIFO: a blocking open would never return
  EXPECT_EQ(message([&] { io::open_regular_for_read(fifo, "checkpoint"); }),
            "checkpoint: '" + fifo.string() + "' is a FIFO (named pipe), not a regular file");
  EXPECT_NE(message([&] { io::open_regular_for_read(loop); }).find("a symbolic link loop"),
            std::string::npos);
  EXPECT_NE(message([&] { io::open_regular_for_read(dir.path()); }).find("is a directory"),
            std::string::npos);
  const int fd = io::open_regular_for_read(regular);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
  char buf[4];
  EXPECT_EQ(::read(fd, buf, 4), 4);
  ::close(fd);
  errno = 0;
  EXPECT_EQ(io::open_regular_for_read(missing), -1);
  EXPECT_EQ(errno, ENOENT);
}

}  // namespace
}  // namespace summa::test
