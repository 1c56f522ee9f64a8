#pragma once
/// \file files.hpp
/// Opening a user's file without hanging: every file summa or its programs
/// read (checkpoint `latest`, manifests and shards, token and text files,
/// Hugging Face files, machine files, prompts, studies) or append to (the
/// training log, the check batch) must be a regular file. A FIFO given by
/// mistake would otherwise block open() or read() on one rank while the
/// others wait in MPI; a device, socket or directory fails later and less
/// clearly. These checks come first and throw summa::Error naming the path
/// and what it is, e.g. "'/x/latest' is a FIFO (named pipe), not a regular
/// file", or "'/x/latest' is a dangling symbolic link (to 'step_9')".

#include <cstdint>
#include <filesystem>
#include <string>

namespace summa::io {

/// What `path` is when it is not a regular file (following symbolic links):
/// "a FIFO (named pipe)", "a directory", "a character device", "a block
/// device", "a socket", "a dangling symbolic link (to '…')", "a symbolic
/// link loop"; empty for a regular file or a path that does not exist.
std::string non_regular_kind(const std::filesystem::path& path);

/// Throws summa::Error "<what> '<path>' is a dangling symbolic link (to
/// '…')" or "<what> '<path>' is a symbolic link loop" when `path` is one;
/// anything else passes (a directory, a missing path). For the paths a
/// program creates or follows as a directory (--out, --hf, a checkpoint
/// root), where "no such file" or "File exists" would hide the cause.
void require_not_broken_link(const std::filesystem::path& path, const std::string& what);

/// Throws summa::Error unless `path` is a directory (following symbolic
/// links), naming `what` (a flag: "--import") and what the path is instead:
/// "<what> '<path>' does not exist", "... is a dangling symbolic link (to
/// '…')", "... is a FIFO (named pipe), not a directory", "... is a file,
/// not a directory". For the directories a program reads (an HF export, a
/// tokenizer), before a file inside is looked for.
void require_directory(const std::filesystem::path& path, const std::string& what);

/// Throws summa::Error "<context>: '<path>' is <kind>, not a regular file"
/// (without "<context>: " when empty) when `path` exists and is not a
/// regular file. A missing path passes: opening it reports that.
void require_regular_file(const std::filesystem::path& path, const std::string& context = {});

/// open(2) of a file to read: O_RDONLY | O_CLOEXEC, opened non-blocking so
/// a FIFO cannot block, then refused unless fstat says it is a regular file
/// (the descriptor is closed first) and switched back to blocking reads.
/// Returns the descriptor (the caller closes it), or -1 with errno set when
/// open itself fails (ENOENT, EACCES, ELOOP, ...), so the caller can word
/// its own "missing" message.
int open_regular_for_read(const std::filesystem::path& path, const std::string& context = {});

/// The whole of a small file (a machine file, a tokenizer's vocabulary):
/// opened with open_regular_for_read, and refused before anything is read
/// when it is larger than `max_bytes`. Throws summa::Error naming `context`
/// and the path ("machine file '/x/m.json': 300000000 bytes is larger than
/// the limit of 16777216 bytes for this file", "... cannot be opened: No
/// such file or directory").
std::string read_small_file(const std::filesystem::path& path, std::uint64_t max_bytes,
                            const std::string& context = {});

}  // namespace summa::io
