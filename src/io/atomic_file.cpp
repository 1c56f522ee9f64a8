#include "summa/io/atomic_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <utility>

#include "summa/core/error.hpp"
#include "summa/io/files.hpp"

namespace summa::io {

namespace fs = std::filesystem;

namespace {

std::string quoted(const fs::path& p) {
  return fmt::format("'{}'", p.string());
}

// The message of `errno` now.
std::string reason() {
  return std::strerror(errno);
}

// Random enough that concurrent writers of one target (other processes,
// other threads) practically never collide; O_EXCL settles the rest.
std::uint64_t temp_salt() {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device device;
  const std::uint64_t r = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  return r ^ (counter.fetch_add(1) * 0x9E3779B97F4A7C15ULL);
}

// `name` is `target`'s temporary: "<target>.tmp-<16 hex digits>".
bool is_temporary_of(const std::string& name, const std::string& target) {
  const std::string prefix = target + ".tmp-";
  return name.size() == prefix.size() + 16 && name.starts_with(prefix) &&
         std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                     [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
}

}  // namespace

std::size_t remove_stale_temporaries(const fs::path& path, double min_age_s) {
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  const std::string target = path.filename().string();
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  std::size_t removed = 0;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_temporary_of(name, target)) continue;
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    // Its writer holds the lock while it lives (the kernel drops it when the
    // process ends, however it ends); the age covers the instant between a
    // writer's open and its lock. The age in nanoseconds, at least 0: a
    // file system may stamp a write from a finer clock than the one now is
    // read from, so a file written a moment ago can seem to be from the
    // future (seen: time() a second behind a fresh file's st_mtime).
    const auto age = [&st] {
      timespec now{};
      ::clock_gettime(CLOCK_REALTIME, &now);
      return std::max(0.0, static_cast<double>(now.tv_sec - st.st_mtim.tv_sec) +
                               1e-9 * static_cast<double>(now.tv_nsec - st.st_mtim.tv_nsec));
    };
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && age() >= min_age_s &&
        ::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::unlink(it->path().c_str()) == 0)
      ++removed;
    ::close(fd);  // releases the lock
  }
  return removed;
}

AtomicFile::AtomicFile(fs::path path, std::string context)
    : path_(std::move(path)), context_(std::move(context)) {
  // The rename at commit() replaces whatever is at the path: only ever a
  // regular file (or nothing; a link is followed). A device, FIFO, socket
  // or directory there is refused now (as root, renaming over /dev/full
  // would replace the device with a file).
  std::error_code ec;
  // A link to a regular file is written through: the file it names is
  // replaced and the link kept (was: the link itself replaced, its target
  // left stale). A dangling or looping link is replaced like a missing file.
  if (fs::is_symlink(fs::symlink_status(path_, ec))) {
    const fs::path target = fs::canonical(path_, ec);
    if (!ec && fs::is_regular_file(fs::status(target, ec))) path_ = target;
  }
  const fs::file_status st = fs::status(path_, ec);
  if (!ec && st.type() != fs::file_type::regular && st.type() != fs::file_type::not_found) {
    const std::string kind = non_regular_kind(path_);
    fail(fmt::format("{} is {}, not a regular file: refusing to replace it", quoted(path_),
                     kind.empty() ? std::string("not a regular file") : kind));
  }
  // What an earlier writer of this file left when it died mid-write (was:
  // an export or a save cut short left a model-sized temporary for good).
  remove_stale_temporaries(path_);
  for (int attempt = 0; fd_ < 0; ++attempt) {
    temp_ = path_;
    temp_ += fmt::format(".tmp-{:016x}", temp_salt());
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt >= 16))
      fail(fmt::format("cannot create the temporary file {} for {}: {}", quoted(temp_),
                       quoted(path_), reason()));
  }
  // Held until the file is committed or abandoned, or the process ends:
  // remove_stale_temporaries leaves a locked temporary alone. A file system
  // without flock (ENOLCK, ENOSYS) only loses that clean-up.
  (void)::flock(fd_, LOCK_EX | LOCK_NB);
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(temp_.c_str());
}

void AtomicFile::fail(const std::string& problem) const {
  throw Error(context_.empty() ? problem : context_ + ": " + problem);
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  write_at(end_, data, bytes);
}

void AtomicFile::write_at(std::uint64_t offset, const void* data, std::size_t bytes) {
  if (fd_ < 0) fail(fmt::format("writing {} after commit()", quoted(path_)));
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(fmt::format("writing {} (the temporary file of {}) failed: {}", quoted(temp_),
                       quoted(path_), reason()));
    }
    p += n;
    offset += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
  end_ = std::max(end_, offset);
}

void AtomicFile::commit() {
  if (fd_ < 0) fail(fmt::format("{} committed twice", quoted(path_)));
  if (::fsync(fd_) != 0)
    fail(fmt::format("fsync of {} (the temporary file of {}) failed: {}", quoted(temp_),
                     quoted(path_), reason()));
  const int fd = std::exchange(fd_, -1);
  std::string problem;
  if (::close(fd) != 0)
    problem = fmt::format("closing {} (the temporary file of {}) failed: {}", quoted(temp_),
                          quoted(path_), reason());
  else if (std::rename(temp_.c_str(), path_.c_str()) != 0)
    problem = fmt::format("renaming {} over {} failed: {}", quoted(temp_), quoted(path_), reason());
  if (!problem.empty()) {
    ::unlink(temp_.c_str());
    fail(problem);
  }
  const fs::path dir = path_.parent_path();
  try {
    sync_directory(dir.empty() ? fs::path(".") : dir);
  } catch (const Error& e) {
    fail(e.what());
  }
}

void write_file_atomic(const fs::path& path, std::string_view bytes, std::string context) {
  AtomicFile file(path, std::move(context));
  file.write(bytes.data(), bytes.size());
  file.commit();
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open the directory {}: {}", quoted(dir), reason()));
  if (::fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP) {
    const std::string why = reason();
    ::close(fd);
    throw Error(fmt::format("fsync of the directory {} failed: {}", quoted(dir), why));
  }
  ::close(fd);
}

}  // namespace summa::io
