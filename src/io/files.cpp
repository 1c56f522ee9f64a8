#include "summa/io/files.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <system_error>

#include "summa/core/error.hpp"

namespace summa::io {

namespace fs = std::filesystem;

namespace {

std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return {};
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file of a known type";
}

std::string message(const fs::path& path, const std::string& kind, const std::string& context) {
  return fmt::format("{}'{}' is {}, not a regular file", context.empty() ? "" : context + ": ",
                     path.string(), kind);
}

}  // namespace

std::string non_regular_kind(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return kind_of(st.st_mode);
  const int code = errno;
  struct stat link {};
  if (code == ELOOP) return "a symbolic link loop";
  if (code == ENOENT && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(path, ec);
    return ec ? std::string("a dangling symbolic link")
              : fmt::format("a dangling symbolic link (to '{}')", target.string());
  }
  return {};  // missing (or unreadable): the open that follows says why
}

void require_not_broken_link(const fs::path& path, const std::string& what) {
  const std::string kind = non_regular_kind(path);
  if (kind.starts_with("a dangling") || kind.starts_with("a symbolic link loop"))
    throw Error(fmt::format("{} '{}' is {}", what, path.string(), kind));
}

void require_directory(const fs::path& path, const std::string& what) {
  require_not_broken_link(path, what);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_directory(st)) return;
  if (!fs::exists(st)) throw Error(fmt::format("{} '{}' does not exist", what, path.string()));
  const std::string kind = non_regular_kind(path);
  throw Error(fmt::format("{} '{}' is {}, not a directory", what, path.string(),
                          kind.empty() ? std::string("a file") : kind));
}

void require_regular_file(const fs::path& path, const std::string& context) {
  const std::string kind = non_regular_kind(path);
  if (!kind.empty()) throw Error(message(path, kind, context));
}

int open_regular_for_read(const fs::path& path, const std::string& context) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    // a dangling link or a loop: say so rather than "No such file"
    const int code = errno;
    const std::string kind = non_regular_kind(path);
    if (!kind.empty()) throw Error(message(path, kind, context));
    errno = code;
    return -1;
  }
  struct stat st {};
  std::string kind;
  if (::fstat(fd, &st) != 0) {
    kind = "not a file that can be examined";
  } else {
    kind = kind_of(st.st_mode);
  }
  if (kind.empty()) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0 && ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0) return fd;
    kind = "a file whose descriptor cannot be set to blocking reads";
  }
  ::close(fd);
  throw Error(message(path, kind, context));
}

std::string read_small_file(const fs::path& path, std::uint64_t max_bytes,
                            const std::string& context) {
  const std::string where = context.empty() ? fmt::format("'{}'", path.string())
                                            : fmt::format("{} '{}'", context, path.string());
  const int fd = open_regular_for_read(path, context);
  if (fd < 0)
    throw Error(fmt::format("{}: cannot be opened: {}", where,
                            std::error_code(errno, std::generic_category()).message()));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw Error(fmt::format("{}: cannot get its size: {}", where,
                            std::error_code(errno, std::generic_category()).message()));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes)
    throw Error(fmt::format("{}: {} bytes is larger than the limit of {} bytes for this file",
                            where, size, max_bytes));
  std::string text(static_cast<std::size_t>(size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw Error(fmt::format("{}: read error: {}", where,
                              std::error_code(errno, std::generic_category()).message()));
    if (n == 0) break;  // shorter than fstat said (truncated meanwhile): what is there
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  return text;
}

}  // namespace summa::io
