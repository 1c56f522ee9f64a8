#pragma once
/// \file atomic_file.hpp
/// Replacing a file so that readers, and the file system after a crash, see
/// either the old file or the complete new one: write a temporary file in the
/// target's directory, fsync it, rename it over the target, fsync the
/// directory. Every file summa writes goes through here (safetensors, Hugging
/// Face config.json, token files, checkpoint shards, manifests and `latest`).
///
/// Errors are summa::Error naming the path and the system's reason (errno
/// text), e.g. "cannot create the temporary file '/x/f.tmp-…' for '/x/f':
/// No such file or directory".

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace summa::io {

/// A new version of `path`, written under a unique temporary name next to it
/// (`<path>.tmp-<16 hex digits>`, created exclusively, mode 0666 less the
/// umask) and put in place by commit(). Destroying it uncommitted (an
/// exception, say) removes the temporary file and leaves `path` as it was.
/// Error messages start with `context` and ": " when it is not empty (e.g.
/// "checkpoint").
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path, std::string context = {});
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends `bytes` bytes at the end of what was written so far.
  void write(const void* data, std::size_t bytes);
  /// Writes `bytes` bytes at byte `offset` (any order; a gap reads as zeros).
  void write_at(std::uint64_t offset, const void* data, std::size_t bytes);
  /// fsync, close, rename over path(), fsync of the directory. After it the
  /// object holds nothing; a second commit() is an error.
  void commit();

  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const std::string& problem) const;

  std::filesystem::path path_, temp_;
  std::string context_;
  int fd_ = -1;
  std::uint64_t end_ = 0;  // where write() appends
};

/// Removes the temporaries of `path` (`<path>.tmp-<16 hex digits>` beside
/// it) that no live writer holds: an AtomicFile holds an flock on its
/// temporary until it commits or is abandoned, and the kernel releases it
/// when the process ends, however it ends (kill -9, MPI_Abort), so a
/// temporary that can be locked and was last written `min_age_s` seconds ago
/// or more is left over from a writer that died. Every AtomicFile calls it
/// for its own target (an export, a shard, `latest`), so the next write of a
/// file clears what an interrupted one left. Returns the number removed;
/// never throws (what cannot be read or locked is left alone).
std::size_t remove_stale_temporaries(const std::filesystem::path& path, double min_age_s = 60);

/// Replaces `path` with `bytes` (AtomicFile; `context` starts its errors).
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes,
                       std::string context = {});

/// fsync of a directory, making the renames and new entries in it durable.
/// A file system that cannot sync directories (EINVAL, ENOTSUP) is accepted;
/// any other failure throws summa::Error naming `dir` and the reason.
void sync_directory(const std::filesystem::path& dir);

}  // namespace summa::io
