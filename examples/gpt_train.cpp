// gpt_train: train a GPT-2 with summa from the command line, under any
// scheme (1D, 2D, 3D, data axis), stop, resume under another scheme, and
// export a Hugging Face checkpoint.
//
//   mpirun -np 4 ./gpt_train                      # small GPT, bundled corpus, 2x2 mesh
//   mpirun -np 4 ./gpt_train --scheme 1d:p=4 --resume
//   mpirun -np 4 ./gpt_train --backend cuda      # one GPU per rank (NCCL)
//   mpirun -np 4 ./gpt_train --backend cuda --comm mpi_staged   # ranks share GPUs
//   ./gpt_train --help
//
// Rank 0 prints progress (step, loss, learning rate, tokens/s, model FLOP/s,
// memory per rank, ETA: updated in place on a terminal, one line every
// --print-every steps otherwise), evaluations, and a final summary; it writes
// a JSON-lines log (one object per step and per evaluation, flushed a line
// at a time) for scripts/plot_loss.py. Outputs go under --out:
// checkpoints/ (sharded, resumable under any scheme), export/
// (model.safetensors + config.json, Hugging Face GPT-2) and log.jsonl.
//
// Reliability (docs/reliability.md): every failure is the same error on
// every rank, printed once; --out is locked against a second job; a fresh
// run never overwrites a saved one (--overwrite); --resume never starts
// from scratch over saved checkpoints; a non-finite loss stops training
// before anything is saved; a collective watchdog (--watchdog) ends a hung
// job with a report naming the ranks that did not arrive.
#include <fcntl.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "flag_checks.hpp"
#include "summa/comm/mpi_init.hpp"
#include "summa/summa.hpp"

// The Python of the plot and check hints (cmake/SummaPython.cmake) and the
// scripts' directory.
#ifndef SUMMA_PYTHON_EXECUTABLE
#define SUMMA_PYTHON_EXECUTABLE "python3"
#endif
#ifndef SUMMA_SCRIPTS_DIR
#define SUMMA_SCRIPTS_DIR "scripts"
#endif
#ifndef SUMMA_DEFAULT_CORPUS
#define SUMMA_DEFAULT_CORPUS "examples/data/corpus.txt"
#endif

namespace {

namespace fs = std::filesystem;
using summa::index_t;
using summa::flags::integer_in;
using summa::flags::real_in;

struct Cli {
  int layers = 4, hidden = 128, heads = 4, seq = 64, vocab = 0, positions = 0;
  std::string scheme;  // default: from the rank count; "auto": the step-time model's choice
  std::string machine = SUMMA_DEFAULT_MACHINE;  // --scheme auto
  int top = 3;
  std::string dtype = "float";
  std::string backend = "cpu";
  std::string comm;      // default: mpi on cpu, nccl on cuda
  std::string cpu_gemm;  // default: CpuBackend::default_gemm()
  int threads = 1;
  bool tf32 = false;
  std::string recompute = "full";  // none | full | selective (summa::Recompute)
  bool no_recompute = false;       // --no-recompute: recompute = none
  bool profile = false;            // time the step's parts into the log
  std::int64_t steps = 400;
  index_t batch = 16;
  std::string optimizer = "adamw";
  double lr = 2e-3, min_lr = -1, weight_decay = 0.1, beta2 = 0.95, momentum = 0.9, clip = 1.0;
  std::int64_t warmup = 20;
  std::int64_t offload_bucket = 0;  // --offload-bucket: 0 keeps the optimizer on the backend
  std::uint64_t seed = 1234, data_seed = 1234;
  std::string data = SUMMA_DEFAULT_CORPUS;
  double val_fraction = 0.1;
  int eval_every = 100, eval_batches = 4, print_every = 10;
  std::string progress = "auto";
  std::string out = "gpt_train_out";
  int checkpoint_every = 100;
  bool resume = false, overwrite = false;
  double watchdog = 600;
  bool check_calls = false;  // GridOptions::check_calls: the per-call agreement (debug mode)
  std::string on_nonfinite = "stop";
  int max_skipped = 10;
  double memory_budget_gib = 0;
  std::string resume_from, import_dir, export_dir = "<out>/export", log = "<out>/log.jsonl";
  std::string check_batch;
  std::set<std::string> given;  // options set on the command line
};

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// 2D on a square rank count, 1D otherwise.
std::string default_scheme(int ranks) {
  const int q = static_cast<int>(std::lround(std::sqrt(static_cast<double>(ranks))));
  return q * q == ranks ? "2d:q=" + std::to_string(q) : "1d:p=" + std::to_string(ranks);
}

std::string human(double v, const char* unit) {
  const char* prefix[] = {"", "k", "M", "G", "T", "P"};
  int k = 0;
  while (std::abs(v) >= 1000 && k < 5) {
    v /= 1000;
    ++k;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g %s%s", v, prefix[k], unit);
  return buf;
}

std::string duration(double s) {
  char buf[32];
  const long t = std::lround(std::max(0.0, s));
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

std::string replace_out(std::string path, const std::string& out) {
  const std::string key = "<out>";
  if (path.rfind(key, 0) == 0) path = out + path.substr(key.size());
  return path;
}

// ---- flag validation: each error names the flag and the value given ------

// Checks that need several flags at once; throws on every rank alike (the
// same argv), printed once.
void check_flags(const Cli& cli) {
  const auto fail = [](const std::string& m) { throw summa::CollectiveError("gpt_train: " + m); };
  if (cli.hidden % cli.heads != 0)
    fail("--hidden " + std::to_string(cli.hidden) + " is not a multiple of --heads " +
         std::to_string(cli.heads));
  if (cli.positions > 0 && cli.positions < cli.seq)
    fail("--positions " + std::to_string(cli.positions) + " is smaller than --seq " +
         std::to_string(cli.seq));
  if (cli.given.count("--min-lr") && cli.min_lr > cli.lr)
    fail((std::ostringstream() << "--min-lr " << cli.min_lr << " exceeds --lr " << cli.lr)
             .str());  // shortest form: 2e-08, not 0.000000
  if (cli.out.empty()) fail("--out must name a directory (it is empty)");
  if (cli.log.empty()) fail("--log must name a file (it is empty)");
  if (!cli.scheme.empty() && cli.scheme != "auto") {
    try {
      (void)summa::SchemeSpec::parse(cli.scheme);
    } catch (const summa::Error& e) {
      fail(std::string("--scheme: ") + e.what());
    }
  }
}

// ---- progress -------------------------------------------------------------

// True when this process runs under an MPI launcher (mpirun, mpiexec, srun):
// its stdout may then be a pseudo-terminal even when the user's output goes
// to a file (Open MPI), so isatty() cannot tell.
bool under_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_ID",
                        "MPI_LOCALNRANKS", "HYDRA_CONTROL_FD"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

enum class Progress { bar, lines, none };

Progress progress_mode(const Cli& cli) {
  if (cli.progress == "bar") return Progress::bar;
  if (cli.progress == "none" || cli.print_every == 0) return Progress::none;
  if (cli.progress == "lines") return Progress::lines;
  return isatty(fileno(stdout)) && !under_launcher() ? Progress::bar : Progress::lines;
}

// ---- the output directory --------------------------------------------------

// A job's claim on what it writes (--out, and --log wherever it is): an
// fcntl lock on a lock file, held for the run and naming its holder. A
// second job is refused; a lock file removed or replaced while the run goes
// on (by hand, or by a cleanup script) is noticed before the next save, which
// then refuses to write over what another job may now be writing. fcntl
// locks are released by the kernel when the process ends, so a crashed job
// never leaves a stale lock; the file's text names the holder.
class JobLock {
 public:
  // `lock_file`: the lock file; `what`: the claim as the user gave it
  // ("--out DIR", "--log FILE").
  JobLock(fs::path lock_file, std::string what)
      : path_(std::move(lock_file)), what_(std::move(what)) {
    // Only a regular file (or nothing) there: a link, FIFO, socket or
    // directory is named (were: "Too many levels of symbolic links" for any
    // link, "Invalid argument" for a FIFO).
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      throw summa::Error("the lock file " + path_.string() + " is " +
                         (S_ISLNK(st.st_mode) ? std::string("a symbolic link")
                                              : summa::io::non_regular_kind(path_)) +
                         ", not a regular file; remove it (no job holds a lock through it)");
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd_ < 0)
      throw summa::Error("cannot create the lock file " + path_.string() + ": " +
                         std::strerror(errno) + " (is " + what_ + " writable?)");
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    if (::fcntl(fd_, F_SETLK, &l) != 0) {
      std::string holder(256, '\0');
      const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
      holder.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
      while (!holder.empty() && holder.back() == '\n') holder.pop_back();
      ::close(fd_);
      fd_ = -1;
      throw summa::Error(what_ + " is in use by another gpt_train job (" +
                         (holder.empty() ? std::string("holder unknown") : holder) +
                         "); wait for it to end, or choose another " +
                         what_.substr(0, what_.find(' ')));
    }
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    char when[32] = "?";  // UTC, readable (was: seconds since 1970)
    const std::time_t now = std::time(nullptr);
    if (std::tm utc{}; ::gmtime_r(&now, &utc) != nullptr)
      std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
    const std::string text = "host " + std::string(host) + ", pid " + std::to_string(::getpid()) +
                             ", started " + when + "\n";
    if (::ftruncate(fd_, 0) != 0 ||
        ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
      throw summa::Error("cannot write the lock file " + path_.string() + ": " +
                         std::strerror(errno));
  }
  ~JobLock() {
    if (fd_ < 0 || !lost().empty()) {  // another job's lock file now: leave it
      if (fd_ >= 0) ::close(fd_);
      return;
    }
    std::error_code ignored;
    fs::remove(path_, ignored);  // then unlock: a waiting job never sees a half-removed lock
    ::close(fd_);
  }
  JobLock(const JobLock&) = delete;
  JobLock& operator=(const JobLock&) = delete;

  // Throws summa::Error when the lock file is no longer the one this job
  // holds (removed or replaced): another job may have taken `what`.
  void require_held() const {
    if (const std::string why = lost(); !why.empty())
      throw summa::Error(what_ + ": the lock file " + path_.string() + " " + why +
                         " while this job ran, so another job may be writing there now; this job "
                         "does not save over it (its last checkpoint stays as it was). Check "
                         "for another job, then --resume");
  }

 private:
  std::string lost() const {
    struct stat now {
    }, held{};
    if (::lstat(path_.c_str(), &now) != 0) return "was removed";
    if (::fstat(fd_, &held) != 0 || now.st_ino != held.st_ino || now.st_dev != held.st_dev)
      return "was replaced";
    return {};
  }

  fs::path path_;
  std::string what_;
  int fd_ = -1;
};

// Creates `dir` (and parents) and proves it writable by creating and
// removing a probe file; throws naming `flag` and the reason.
void ensure_writable_dir(const fs::path& dir, const std::string& flag, const std::string& tag) {
  std::error_code ec;
  summa::io::require_not_broken_link(dir, flag);  // was: "File exists"
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw summa::Error(flag + " " + dir.string() + " exists and is not a directory");
  fs::create_directories(dir, ec);
  if (ec)
    throw summa::Error(flag + ": cannot create the directory " + dir.string() + ": " +
                       ec.message());
  const fs::path probe = dir / (".write_probe_" + tag);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw summa::Error(flag + ": the directory " + dir.string() +
                       " is not writable: " + std::strerror(errno));
  ::close(fd);
  fs::remove(probe, ec);
}

// ---- the JSON-lines log ------------------------------------------------------

// Rank 0's log: each record is one complete line written with one write()
// and flushed to the kernel at once (a kill leaves whole lines only);
// sync() (fsync) at checkpoints. A failed write is remembered and turned
// into an error on every rank by the caller; a line written in part (a disk
// that fills mid-line) is cut off again, so the log ends with a whole line.
// Fault injection (tests/fault): SUMMA_FAULT_LOG_LIMIT=<bytes> makes the
// file full at that size (a write past it is written in part, then fails
// with ENOSPC).
class LogFile {
 public:
  LogFile() = default;
  // Opens `path`: truncated for a fresh run; for a resumed one, cut back to
  // the lines of steps <= `step` first, so no partial or repeated line
  // remains.
  // `run`: this run's id (TrainerOptions::run_id), written into every record
  // by the caller; a resume refuses a log with a record of another run.
  void open(const fs::path& path, bool resume, std::int64_t step, const std::string& run) {
    path_ = path;
    run_ = run;
    summa::io::require_regular_file(path, "--log");  // a FIFO would block open()
    if (resume)
      truncate_to(step);
    else
      scan(0, /*cut=*/false);  // --overwrite cuts a log, never a file with other lines
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_APPEND, 0644);
    if (fd_ < 0)
      throw summa::Error("--log: cannot open " + path.string() + ": " + std::strerror(errno));
    // The file itself is locked too (an open-file-description lock, kept
    // while fd_ is open; other descriptors of it do not release it), before
    // a fresh run cuts it: a second job that reaches this log under another
    // name (a symbolic or hard link) is refused instead of cutting it.
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    if (::fcntl(fd_, F_OFD_SETLK, &l) != 0) {
      const int e = errno;
      ::close(fd_);
      fd_ = -1;
      throw summa::Error("--log " + path.string() +
                         (e == EAGAIN || e == EACCES
                              ? std::string(" is in use by another gpt_train job (the same file, "
                                            "perhaps under another name or link); choose "
                                            "another --log")
                              : ": cannot lock it: " + std::string(std::strerror(e))));
    }
    if (!resume && ::ftruncate(fd_, 0) != 0)
      throw summa::Error("--log: cannot truncate " + path.string() + ": " + std::strerror(errno));
    const off_t end = ::lseek(fd_, 0, SEEK_END);
    whole_ = end > 0 ? end : 0;
    if (const char* limit = std::getenv("SUMMA_FAULT_LOG_LIMIT")) limit_ = std::atoll(limit);
  }
  ~LogFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  void line(const std::string& text) {
    if (fd_ < 0 || !error_.empty()) return;
    const std::string l = text + "\n";
    std::size_t done = 0;
    while (done < l.size()) {
      std::size_t want = l.size() - done;
      const long long room = limit_ - static_cast<long long>(whole_ + static_cast<off_t>(done));
      if (limit_ > 0)
        want =
            static_cast<std::size_t>(std::clamp<long long>(room, 0, static_cast<long long>(want)));
      const ssize_t n = want > 0 ? ::write(fd_, l.data() + done, want) : (errno = ENOSPC, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error_ = "writing the log " + path_.string() + " failed: " + std::strerror(errno);
        if (done > 0 && ::ftruncate(fd_, whole_) != 0)  // no partial line left behind
          error_ +=
              "; cutting its partial last line failed too: " + std::string(std::strerror(errno));
        return;
      }
      done += static_cast<std::size_t>(n);
    }
    whole_ += static_cast<off_t>(l.size());
  }
  void sync() {
    if (fd_ >= 0 && error_.empty() && ::fsync(fd_) != 0)
      error_ = "fsync of the log " + path_.string() + " failed: " + std::strerror(errno);
  }
  const std::string& error() const { return error_; }
  // Whether the resumed log already holds a validation at the checkpoint's step.
  bool val_at_resume() const { return val_at_resume_; }

 private:
  void truncate_to(std::int64_t step) { scan(step, /*cut=*/true); }
  // Reads the log; throws unless every line is a record or crash damage;
  // with `cut`, rewrites it with the lines up to `step`.
  void scan(std::int64_t step, bool cut) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;  // no log yet
    // Streamed in chunks, a line at most kMaxLine bytes: a longer one (a
    // damaged tail of NUL bytes, say) is skipped without being held, and a
    // hole in a sparse file (SEEK_DATA) is not read at all (was: the whole
    // file read line by line into memory, an 8 GiB line too).
    // Every line is a record of a gpt_train log, or damage a crash can leave
    // (NUL bytes, a hole, a record cut short at the end): a file with other
    // lines is not cut at all (was: a text file whose first line was a record
    // lost its other lines).
    constexpr std::size_t kMaxLine = 1 << 20;
    std::string kept, l;
    bool overlong = false, nul_only = true, brace = false;  // brace: the line starts with '{'
    bool started = false;
    std::int64_t line_no = 0;
    const auto keep = [&](bool whole) {
      ++line_no;
      // (a NUL inside a line ends what the parser reads: such a line is no
      // record; was: "{\"step\":9}\0 my notes" taken for one)
      const auto record = overlong || l.find('\0') != std::string::npos
                              ? nlohmann::json()
                              : nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
      if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) {
        if (nul_only || (!whole && brace)) return;  // damage
        ::close(fd);
        throw summa::Error(
            "--log " + path_.string() + ": line " + std::to_string(line_no) +
            " is not a record of a gpt_train log (a JSON object with an integer \"step\"); a "
            "file with other lines is never cut (for a resume or by --overwrite): choose "
            "another --log, or remove those lines");
      }
      // A record of another run (its "run" id differs from the checkpoint's):
      // this is not the resumed run's log, so it is never cut (was: a copy of
      // another run's log, every line a record, cut to the checkpoint's
      // step). Records without an id come from a gpt_train before run ids.
      if (cut && !run_.empty() && record.contains("run") && record["run"] != run_) {
        ::close(fd);
        throw summa::Error(
            "--log " + path_.string() + ": line " + std::to_string(line_no) +
            " is a record of another run (run id " + record["run"].dump() +
            "; the checkpoint resumed is of run \"" + run_ +
            "\"): a resume never cuts another run's log; give this run's own --log, or a new "
            "path");
      }
      // Every record up to the checkpoint's step is kept, a validation at that
      // step too: the resume does not log its own again (was: cut and
      // re-logged, so a resume with another --batch lost the first value).
      const auto s = record["step"].get<std::int64_t>();
      if (s <= step) kept += l + "\n";
      if (cut && s == step && record.contains("val_loss")) val_at_resume_ = true;
    };
    std::vector<char> chunk(1 << 20);
    for (off_t pos = 0;;) {
      const off_t data = ::lseek(fd, pos, SEEK_DATA);
      if (data < 0) break;  // ENXIO: nothing but a hole up to the end (or no SEEK_DATA)
      if (data > pos) overlong = started = true, l.clear();  // a hole: NUL bytes, never a record
      pos = data;
      const ssize_t got = ::pread(fd, chunk.data(), chunk.size(), pos);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      const auto n_got = static_cast<std::size_t>(got);
      for (std::size_t at = 0; at < n_got;) {
        const char* begin = chunk.data() + at;
        const auto* nl = static_cast<const char*>(std::memchr(begin, '\n', n_got - at));
        const std::size_t n = nl != nullptr ? static_cast<std::size_t>(nl - begin) : n_got - at;
        nul_only = nul_only && std::all_of(begin, begin + n, [](char c) { return c == 0; });
        if (!started && n > 0) brace = *begin == '{', started = true;
        if (!overlong && l.size() + n <= kMaxLine)
          l.append(begin, n);
        else
          overlong = true, l.clear();
        at += n;
        if (nl != nullptr) {  // a whole line
          keep(true);
          l.clear();
          overlong = brace = started = false, nul_only = true;
          ++at;
        }
      }
      pos += got;
    }
    if (started) keep(false);  // the last line, without '\n': a partial write
    ::close(fd);
    if (cut) summa::io::write_file_atomic(path_, kept, "--log: rewriting the log for the resume");
  }

  fs::path path_;
  std::string run_;
  int fd_ = -1;
  off_t whole_ = 0;      // the file's size after its last whole line
  long long limit_ = 0;  // SUMMA_FAULT_LOG_LIMIT (0: none)
  std::string error_;
  bool val_at_resume_ = false;
};

// The backend of --backend, and the grid's communicators (--comm) to go with
// it. Throws summa::Error on every rank for a combination that cannot work
// (checked from the options alone, or collectively in make_device: select_device_for_rank
// throws on every rank when any rank sees no device).
std::unique_ptr<summa::Backend> make_backend(const Cli& cli, summa::GridOptions& grid) {
  const std::string comm = cli.comm.empty() ? (cli.backend == "cuda" ? "nccl" : "mpi") : cli.comm;
  if (cli.backend == "cpu") {
    if (comm != "mpi")
      throw summa::CollectiveError(
          "gpt_train: --comm " + comm +
          " carries device memory and needs --backend cuda (the cpu backend "
          "uses --comm mpi)");
    if (cli.tf32) throw summa::CollectiveError("gpt_train: --tf32 applies to --backend cuda only");
    summa::Device d = summa::make_device(
        MPI_COMM_WORLD,
        {.backend = "cpu", .cpu_gemm = cli.cpu_gemm, .threads = cli.threads, .grid = grid});
    grid = d.grid;
    return std::move(d.backend);
  }
  if (!cli.cpu_gemm.empty() || cli.threads != 1)
    throw summa::CollectiveError("gpt_train: --cpu-gemm and --threads apply to --backend cpu only");
  if (comm == "mpi")
    throw summa::CollectiveError(
        "gpt_train: --backend cuda with --comm mpi: MPI communicators cannot take device "
        "memory; use --comm nccl (one GPU per rank) or --comm mpi_staged (ranks may share a "
        "GPU)");
  if (!SUMMA_HAVE_CUDA)
    throw summa::CollectiveError(
        "gpt_train: --backend cuda: this summa was built without CUDA (summa/build_info.hpp "
        "SUMMA_HAVE_CUDA=0; configure with -DSUMMA_CUDA=ON where the CUDA toolkit, cuBLAS and "
        "NCCL are installed)");
  summa::Device d = summa::make_device(
      MPI_COMM_WORLD, {.backend = "cuda", .comm = comm, .tf32 = cli.tf32, .grid = grid});
  grid = d.grid;
  return std::move(d.backend);
}

// --scheme auto: every scheme of the rank count planned and priced on
// --machine (summa::rank_schemes, docs/scaling.md), the --top best printed,
// the fastest within the memory budget chosen.
// Optimizer state per parameter element: the moments (AdamW: 2, SGD: its
// momentum buffer, kept with momentum 0 too) and, under bf16, the fp32
// master weights, in master_t<T>.
template <class T>
std::uint64_t state_bytes_per_parameter(const summa::OptimizerOptions& opt) {
  if (opt.offload_bucket > 0) return 0;  // in the host pool: offload_staging_bytes instead
  const std::uint64_t slots = opt.kind == "adamw" ? 2 : 1;
  return sizeof(summa::master_t<T>) * (slots + (std::is_same_v<T, summa::bf16> ? 1 : 0));
}

template <class T>
summa::SchemeSpec choose_scheme(const Cli& cli, const summa::TrainerOptions& o,
                                summa::Backend& backend, bool root) {
  summa::model::Machine machine;
  {  // every rank reads the file: one verdict, printed once
    std::optional<std::string> error;
    try {
      machine = summa::io::load_machine(cli.machine);
    } catch (const std::exception& e) {
      error = std::string("--scheme auto: ") + e.what();
    }
    summa::agree_on(MPI_COMM_WORLD, error);
  }
  // --memory-budget when given, else the machine file's device memory
  const std::uint64_t budget = cli.memory_budget_gib > 0
                                   ? static_cast<std::uint64_t>(cli.memory_budget_gib * (1 << 30))
                                   : machine.device.memory_bytes;
  const auto all = summa::rank_schemes<T>(
      MPI_COMM_WORLD, backend, o.config, o.batch, o.seq, o.gpt, machine,
      {.budget_bytes = budget,
       .state_bytes_per_parameter = state_bytes_per_parameter<T>(o.optimizer),
       .state_bytes_fixed = summa::offload_staging_bytes<T>(o.optimizer),
       .time = {.offload_bucket = o.optimizer.offload_bucket,
                .ranks_per_device = summa::ranks_per_device(MPI_COMM_WORLD, backend)}},
      o.grid);
  if (all.empty() || !all.front().rejected.empty()) {  // ranked alike on every rank
    char mib[32];                                      // as the candidates' reasons print it
    std::snprintf(mib, sizeof mib, "%.1f", static_cast<double>(budget) / (1 << 20));
    throw summa::CollectiveError(
        "--scheme auto: no scheme of " + std::to_string(world_size()) +
        " ranks fits the model within " + mib + " MiB per rank" +
        (all.empty() ? "" : " (" + all.front().spec.str() + ": " + all.front().rejected + ")") +
        (o.optimizer.offload_bucket > 0
             ? std::string()
             : "; --offload-bucket N keeps the optimizer state in host memory instead"));
  }
  if (root) {
    std::printf(
        "gpt_train: --scheme auto on %s (step with the optimizer; memory planned per rank):\n",
        machine.name.c_str());
    for (int k = 0; k < cli.top && k < static_cast<int>(all.size()) && all[k].rejected.empty(); ++k)
      std::printf("  %d. %-22s predicted %.4f s/step  %.1f MiB%s\n", k + 1,
                  all[k].spec.str().c_str(), all[k].time.step_s,
                  static_cast<double>(all[k].memory_bytes) / (1024 * 1024),
                  k == 0 ? "  <- chosen" : "");
  }
  if (machine.spread.any()) {  // the chosen step at both ends of the calibration's spreads
    const summa::model::StepTimeOptions time{
        .offload_bucket = o.optimizer.offload_bucket,
        .ranks_per_device = summa::ranks_per_device(MPI_COMM_WORLD, backend)};
    const summa::SchemeSpec& spec = all.front().spec;
    const auto step = [&](int end) {
      const summa::model::Machine at = summa::model::at_spread(machine, end);
      return spec.pipeline.active()
                 ? summa::model::predict_pipeline_step_time(spec, o.config, o.batch, o.seq, o.gpt,
                                                            summa::dtype_v<T>, at, time)
                       .step_s
                 : summa::model::predict_step_time(spec, o.config, o.batch, o.seq, o.gpt,
                                                   summa::dtype_v<T>, at, time)
                       .step_s;
    };
    const double low = step(-1), high = step(1);
    if (root)
      std::printf("  the chosen step from the machine file's spreads: %.4f to %.4f s\n", low, high);
  }
  return all.front().spec;
}

// SIGTERM and SIGINT during training (a scheduler's time limit, Ctrl-C):
// the handler only records the signal; the ranks agree on it at the end of
// each step (and after each save), save a checkpoint by the normal atomic
// path, log why and exit with 128 + the signal (143, 130). The handler is
// installed with SA_RESETHAND, so a second signal ends the process at once.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void record_stop_signal(int sig) {
  g_stop_signal = sig;
}
void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}
// The signal any rank received (0: none). Collective.
int agreed_stop_signal(MPI_Comm world) {
  int sig = g_stop_signal;
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, &sig, 1, MPI_INT, MPI_MAX, world, &request);
  summa::wait_guarded(request, world, "gpt_train's stop-signal all-reduce", sizeof sig);
  return sig;
}

template <class T>
int train(const Cli& cli) {
  const int rank = world_rank(), ranks = world_size();
  const bool root = rank == 0;
  const MPI_Comm world = MPI_COMM_WORLD;
  const fs::path out = cli.out;
  const fs::path ckpt_root = out / "checkpoints";
  // The set-up's agreements (files, locks, the checkpoint to resume) wait
  // under a watchdog on the whole job: a rank stopped before the grid exists
  // ends the job with the report naming it, not a hang. The grid's own
  // watchdog (o.grid.watchdog) guards the training; this one the rest.
  summa::WatchdogOptions setup_limit;
  setup_limit.timeout_s = cli.watchdog;
  const summa::Watchdog setup_watchdog(world, setup_limit);
  const std::string log_path = replace_out(cli.log, cli.out);
  const std::string export_dir = replace_out(cli.export_dir, cli.out);
  const Progress progress = progress_mode(cli);

  summa::TrainerOptions o;
  // --scheme auto: chosen below, once the backend exists; until then the
  // default stands in (the vocabulary is padded for any split of the ranks)
  const bool auto_scheme = cli.scheme == "auto";
  o.scheme = cli.scheme.empty() || auto_scheme ? default_scheme(ranks) : cli.scheme;
  summa::SchemeSpec spec = summa::SchemeSpec::parse(o.scheme);
  if (spec.ranks() != ranks)
    throw summa::CollectiveError("gpt_train: --scheme " + spec.str() + " needs " +
                                 std::to_string(spec.ranks()) + " ranks, running on " +
                                 std::to_string(ranks));
  o.config.n_layer = cli.layers;
  o.config.n_head = cli.heads;
  o.config.n_embd = cli.hidden;
  o.config.n_positions = cli.positions > 0 ? cli.positions : cli.seq;
  // Byte-level tokens (256), padded so every scheme's vocabulary split works.
  o.config.vocab_size = cli.vocab > 0
                            ? cli.vocab
                            : summa::io::ByteTokenizer::padded_vocab(
                                  summa::io::ByteTokenizer::base_vocab,
                                  auto_scheme ? ranks : static_cast<int>(spec.tensor_ranks()));
  o.batch = cli.batch;
  o.seq = cli.seq;
  o.gpt.recompute = cli.no_recompute ? summa::Recompute::none
                                     : summa::parse_recompute(cli.recompute, "--recompute");
  o.gpt.profile = cli.profile;
  o.optimizer.kind = cli.optimizer;
  o.optimizer.weight_decay = cli.weight_decay;
  o.optimizer.beta2 = cli.beta2;
  o.optimizer.momentum = cli.momentum;
  o.optimizer.offload_bucket = cli.offload_bucket;
  o.schedule = {.lr = cli.lr,
                .warmup = std::min(cli.warmup, cli.steps),
                .total = cli.steps,
                .min_lr = cli.given.count("--min-lr") ? cli.min_lr : cli.lr / 10};
  o.clip = cli.clip;
  o.init_seed = cli.seed;
  o.data_seed = cli.data_seed;
  o.val_fraction = cli.val_fraction;
  o.skip_hint = "--on-nonfinite skip";  // named by the divergence error
  o.on_non_finite = cli.on_nonfinite == "skip" ? summa::TrainerOptions::NonFinite::skip
                                               : summa::TrainerOptions::NonFinite::stop;
  o.max_skipped_steps = cli.max_skipped;
  o.grid.watchdog.timeout_s = cli.watchdog;
  o.grid.check_calls = cli.check_calls;

  // The output directory: created, locked against a second job, and checked
  // writable (every rank writes checkpoint shards) before anything is
  // trained. Each step rank 0 takes for all reports its outcome to all.
  std::unique_ptr<JobLock> lock, log_lock;
  summa::on_root_agreed(world, [&] {
    // A FIFO, socket or device where a directory is read is named (was: "no
    // such file" for --import, "(missing)" for --resume-from).
    // --import is an HF export's directory: named when it is anything else
    // (was: a dangling link "config file '…/config.json': no such file")
    if (!cli.import_dir.empty()) summa::io::require_directory(cli.import_dir, "--import");
    // --resume-from: a FIFO, socket or device named (a missing one or a file
    // is named where the checkpoint is read)
    if (std::error_code e; !cli.resume_from.empty()) {
      const fs::file_status st = fs::status(cli.resume_from, e);
      if (fs::exists(st) && !fs::is_directory(st) && !fs::is_regular_file(st))
        throw summa::Error("--resume-from " + cli.resume_from + " is " +
                           summa::io::non_regular_kind(cli.resume_from) + ", not a directory");
    }
    // The log, the check batch and the export never go among a run's
    // checkpoints, this run's or another's (was: --log naming a live job's
    // checkpoints/latest trained and replaced it); checked before any
    // directory is made (was: a refused --log left its step directory
    // among another run's checkpoints).
    std::error_code ec;
    const fs::path own_root = fs::weakly_canonical(fs::absolute(ckpt_root), ec);
    const auto is_root = [&](const fs::path& dir) {  // a run's checkpoints, this run's too
      return dir == own_root || !summa::step_directories(dir).empty() ||
             fs::exists(dir / "latest", ec) ||
             (dir.filename() == "checkpoints" &&
              fs::exists(dir.parent_path() / ".gpt_train.lock", ec));
    };
    const auto among_checkpoints = [&](const fs::path& file) -> std::optional<fs::path> {
      const fs::path dir = fs::weakly_canonical(fs::absolute(file), ec).parent_path();
      if (ec || dir.empty()) return std::nullopt;
      if (is_root(dir)) return dir;
      // inside a step directory, one that exists or one a later save makes
      // (and replaces whole: was: an export there deleted by the save)
      for (fs::path up = dir; up.has_relative_path(); up = up.parent_path())
        if (up.filename().string().starts_with("step_") &&
            (fs::exists(up / "manifest", ec) || is_root(up.parent_path())))
          return up.parent_path();
      return std::nullopt;
    };
    const std::string export_file =
        export_dir.empty() ? std::string() : (fs::path(export_dir) / "config.json").string();
    for (const auto& [flag, file] : {std::pair<std::string, std::string>{"--log", log_path},
                                     {"--check-batch", cli.check_batch},
                                     {"--export", export_file}})
      if (!file.empty())
        if (const auto dir = among_checkpoints(file))
          throw summa::Error(flag + " " + file + " is among the checkpoints of a run (" +
                             dir->string() +
                             ": each save replaces what is there); choose a path outside them");
    ensure_writable_dir(out, "--out", "0");
    lock = std::make_unique<JobLock>(out / ".gpt_train.lock", "--out " + out.string());
    // --log too: a second job with another --out must not cut this log.
    // The lock file sits beside the file a link leads to, so a job that
    // names the same log through a symbolic link finds the same lock (and
    // the log itself is locked once opened: LogFile::open).
    const fs::path log_file(log_path);
    if (const fs::path parent = log_file.parent_path(); !parent.empty())
      ensure_writable_dir(parent, "--log", "0");
    summa::io::require_regular_file(log_file, "--log");  // a FIFO or a device: refused now
    fs::path real = fs::weakly_canonical(fs::absolute(log_file), ec);
    if (ec) real = fs::absolute(log_file);
    log_lock = std::make_unique<JobLock>(
        real.parent_path() / ("." + real.filename().string() + ".gpt_train.lock"),
        "--log " + log_path);
  });
  // Resuming: the checkpoint fixes the model shape and the data stream.
  std::optional<fs::path> resume;
  std::string resume_note;
  if (!cli.resume_from.empty()) {
    resume = cli.resume_from;
  } else if (cli.resume) {
    if (const auto point = summa::find_resume_point(ckpt_root, world)) {
      resume = point->dir;
      resume_note = point->note;
    } else if (root) {
      std::printf("gpt_train: no checkpoint under %s, starting from scratch\n",
                  ckpt_root.string().c_str());
    }
  }
  // --check-batch never goes over what the run keeps (its checkpoints, log,
  // lock, export) or reads (--data, --machine, --import), by name, link or
  // hard link (was: a shard, the log, `latest` or the run's own corpus
  // replaced), nor over an existing file that is not this run's check
  // batch (`content`: once the shape is known, after a resume's manifest):
  // exactly 8 x batch x seq bytes of int32 ids below the vocabulary (was: a
  // UTF-32 text, a uint16 token file, an empty or zero-filled file
  // replaced). Checked at the start and again right before the write (was:
  // the path swapped for a link to the run's log during training, and the
  // log replaced). Rank 0 only (inside on_root_agreed).
  const auto guard_check_batch = [&](bool content) {
    std::error_code ec;
    const fs::path check = fs::weakly_canonical(cli.check_batch, ec);
    const auto within = [&](const fs::path& dir) {
      const fs::path d = fs::weakly_canonical(dir, ec);
      const auto [end, at] = std::mismatch(d.begin(), d.end(), check.begin(), check.end());
      return !d.empty() && end == d.end();
    };
    const auto same = [&](const fs::path& p) {
      std::error_code e;
      return check == fs::weakly_canonical(p, e) || fs::equivalent(check, p, e);
    };
    if (within(ckpt_root) || same(log_path) || same(fs::path(out) / ".gpt_train.lock") ||
        (!export_dir.empty() && within(export_dir)))
      throw summa::Error("--check-batch " + cli.check_batch +
                         " would overwrite what this run keeps (its checkpoints, log, lock or "
                         "export); choose a path outside them");
    if (same(cli.data) || (!cli.machine.empty() && same(cli.machine)) ||
        (!cli.import_dir.empty() &&
         (within(cli.import_dir) || same(fs::path(cli.import_dir) / "model.safetensors") ||
          same(fs::path(cli.import_dir) / "config.json"))))
      throw summa::Error("--check-batch " + cli.check_batch +
                         " is a file this run reads (its --data, --machine or --import); "
                         "choose another path");
    summa::io::require_regular_file(cli.check_batch, "--check-batch");
    if (!content) return;
    const auto size = fs::file_size(cli.check_batch, ec);
    if (ec) return;          // none: written new
    std::uint64_t want = 0;  // overflow-safe: an overflowed shape matches no file
    bool batch = !__builtin_mul_overflow(static_cast<std::uint64_t>(o.batch),
                                         static_cast<std::uint64_t>(o.seq), &want) &&
                 !__builtin_mul_overflow(want, std::uint64_t{8}, &want) && size == want;
    std::ifstream old(cli.check_batch, std::ios::binary);
    std::vector<char> chunk(1 << 16);
    for (std::uint64_t read = 0; batch && old && read < size;) {
      old.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      const auto got = static_cast<std::size_t>(old.gcount());
      for (std::size_t i = 0; batch && i + 4 <= got; i += 4) {
        std::uint32_t id = 0;
        for (int b = 0; b < 4; ++b)
          id |= static_cast<std::uint32_t>(static_cast<unsigned char>(chunk[i + b])) << (8 * b);
        batch = id < static_cast<std::uint32_t>(o.config.vocab_size);
      }
      read += got;
      if (got == 0) break;
    }
    if (!batch) {
      char text[200];
      std::snprintf(text, sizeof text,
                    " (%llu bytes) is not a check batch of this run (8 x batch %lld x seq %lld = "
                    "%llu bytes of int32 ids below its vocabulary, %d)",
                    static_cast<unsigned long long>(size), static_cast<long long>(o.batch),
                    static_cast<long long>(o.seq), static_cast<unsigned long long>(want),
                    o.config.vocab_size);
      throw summa::Error("--check-batch " + cli.check_batch + text +
                         "; it is never replaced: remove it or choose another path");
    }
  };
  summa::on_root_agreed(world, [&] {
    // A fresh run never replaces a saved one unless told to.
    std::error_code ec;
    const bool saved =
        !summa::step_directories(ckpt_root).empty() || fs::exists(ckpt_root / "latest", ec);
    if (!resume && saved) {
      if (!cli.overwrite)
        throw summa::Error("--out " + out.string() + " already holds the checkpoints of a run (" +
                           ckpt_root.string() +
                           "); pass --resume to continue it, --overwrite to replace it, or "
                           "choose another --out");
      fs::remove_all(ckpt_root);
    }
    // A log already there is replaced or extended only when it is a log
    // (was: --overwrite cut any file).
    if (std::ifstream existing(log_path, std::ios::binary); existing) {
      // A gpt_train log's first line is one JSON object with its "step" (a
      // pretty-printed JSON file, a machine file or a config.json, starts
      // with '{' too: it is not a log).
      // Leading lines of NUL bytes are crash damage (a resume drops them),
      // not the log's first line (was: such a log refused as no log).
      std::string first;  // at most 1 MiB of it (was: an 8 GiB line read whole)
      for (int line = 0; line < 64; ++line) {
        first.clear();
        for (char c = 0; first.size() <= (1u << 20) && existing.get(c) && c != '\n';)
          first.push_back(c);
        if (first.find_first_not_of('\0') != std::string::npos || !existing) break;
      }
      if (first.find_first_not_of('\0') == std::string::npos) first.clear();  // damage only
      if (!first.empty() || existing.peek() != std::ifstream::traits_type::eof()) {
        const nlohmann::json line = nlohmann::json::parse(first, nullptr, false);
        if (line.is_discarded() || !line.is_object() || !line.contains("step"))
          throw summa::Error("--log " + log_path +
                             " is a file that is not a gpt_train log (its first line is not a JSON "
                             "object with a \"step\"); it is never replaced or extended: choose "
                             "another --log");
      }
    }
    // Nor does it cut a log with lines in it (a run that saved nothing, or
    // one with another --out), unless told (--overwrite) or resuming a
    // checkpoint (--resume with nothing saved starts afresh: it may not cut
    // the log either; was: another run's log cut back under --resume).
    if (!resume && !cli.overwrite && fs::is_regular_file(log_path, ec) &&
        fs::file_size(log_path, ec) > 0 && !ec)
      throw summa::Error(
          "--log " + log_path + " already holds the log of a run" +
          (cli.resume ? " and --out has no checkpoint to resume, so this run starts afresh" : "") +
          "; pass --overwrite to replace it, --resume with that run's --out to continue it, or "
          "choose another --log");
    ensure_writable_dir(ckpt_root, "--out (checkpoints)", "0");
    // Every save replaces `latest` (a regular file, or a link a save
    // replaces) by a rename, which refuses a directory there, and the atomic
    // write refuses to replace a FIFO, socket or device: said now, not after
    // the first interval of training (was: a FIFO resumed, trained, then
    // failed at every save).
    if (const fs::path latest = ckpt_root / "latest";
        (fs::exists(fs::symlink_status(latest, ec)) &&
         !fs::is_regular_file(fs::symlink_status(latest, ec)) &&
         !fs::is_symlink(fs::symlink_status(latest, ec))) ||
        (fs::is_symlink(fs::symlink_status(latest, ec)) && fs::exists(fs::status(latest, ec)) &&
         !fs::is_regular_file(fs::status(latest, ec))))  // a link to one (was: refused at the
                                                         // first save, after training)
      throw summa::Error(
          "--out: " + latest.string() + " is " +
          (fs::is_directory(fs::symlink_status(latest, ec)) ? std::string("a directory")
                                                            : summa::io::non_regular_kind(latest)) +
          ", where the run's 'latest' file goes (every save would fail there); remove or rename "
          "it");
    if (!export_dir.empty()) {
      ensure_writable_dir(export_dir, "--export", "0");
      // the files the export replaces: refused now, not after training (was:
      // a FIFO config.json failed the export after the run, beside a new
      // model.safetensors)
      for (const char* name : {"model.safetensors", "config.json"})
        summa::io::require_regular_file(fs::path(export_dir) / name, "--export");
      // Never over the model the run reads (was: --export equal to --import
      // replaced it), nor over a model that is not an earlier export of
      // summa's (was: a user's model.safetensors and config.json replaced):
      // summa's config.json is GPT-2's without the "transformers_version"
      // that transformers writes.
      const fs::path cfg = fs::path(export_dir) / "config.json",
                     weights = fs::path(export_dir) / "model.safetensors";
      if (!cli.import_dir.empty()) {
        std::error_code e;
        const fs::path in = fs::path(cli.import_dir);
        if (fs::weakly_canonical(export_dir, e) == fs::weakly_canonical(in, e) ||
            fs::equivalent(cfg, in / "config.json", e) ||
            fs::equivalent(weights, in / "model.safetensors", e))
          throw summa::Error("--export " + export_dir + " is the model this run reads (--import " +
                             cli.import_dir + "); choose another --export");
      }
      const bool has_cfg = fs::exists(cfg, ec), has_weights = fs::exists(weights, ec);
      if (has_cfg || has_weights) {
        bool ours = false;
        if (std::ifstream in(cfg, std::ios::binary); has_cfg && in) {
          std::string text(1 << 20, '\0');
          in.read(text.data(), static_cast<std::streamsize>(text.size()));
          text.resize(static_cast<std::size_t>(in.gcount()));
          const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
          ours = j.is_object() && j.value("model_type", std::string()) == "gpt2" &&
                 j.contains("n_layer") && !j.contains("transformers_version");
        }
        if (!ours)
          throw summa::Error("--export " + export_dir +
                             " holds a model that is not an earlier export of summa's (" +
                             (has_cfg ? "its config.json is not summa's GPT-2 config"
                                      : "a model.safetensors without config.json") +
                             "); it is never replaced: choose another --export");
      }
    }
    if (!cli.check_batch.empty()) {
      guard_check_batch(false);
      if (const fs::path parent = fs::path(cli.check_batch).parent_path(); !parent.empty())
        ensure_writable_dir(parent, "--check-batch", "0");  // nothing made in it (was: a
                                                            // placeholder left by a failed run)
    }
  });
  {  // every rank writes its shard into the checkpoint directory
    std::optional<std::string> error;
    try {
      if (rank != 0) ensure_writable_dir(ckpt_root, "--out (checkpoints)", std::to_string(rank));
    } catch (const std::exception& e) {
      error = std::string(e.what()) + " (on rank " + std::to_string(rank) + ")";
    }
    summa::agree_on(world, error);
  }

  std::int64_t steps = cli.steps;
  if (resume) {
    const summa::CheckpointInfo info = summa::read_checkpoint_info(*resume, world);
    std::optional<std::string> meta_error;  // the same on every rank: the same manifest
    try {
      o.config = summa::config_from_meta(info.meta);
      // A resume continues the saved model: a shape flag given with another
      // value is refused (was: silently ignored, the saved model trained).
      for (const auto& [flag, given, key, saved] :
           {std::tuple<const char*, int, const char*, int>{"--layers", cli.layers, "n_layer",
                                                           o.config.n_layer},
            {"--hidden", cli.hidden, "n_embd", o.config.n_embd},
            {"--heads", cli.heads, "n_head", o.config.n_head},
            {"--vocab", cli.vocab, "vocab_size", o.config.vocab_size},
            {"--positions", cli.positions, "n_positions", o.config.n_positions}})
        if (cli.given.count(flag) && given != saved && !meta_error)
          meta_error = "--resume: " + resume->string() + ": the saved model has " + key + "=" +
                       std::to_string(saved) + ", not the " + flag + " " + std::to_string(given) +
                       " given; leave it out (a resume continues the saved model) or start a "
                       "new run";
    } catch (const std::exception& e) {
      meta_error = "--resume: " + resume->string() + ": " + e.what();
    }
    summa::agree_on(world, meta_error);
    // The run's settings continue unless given again on the command line;
    // each field parsed whole (no "1e20" read as 1, no wrap-around), the
    // same verdict on every rank (the same manifest).
    std::optional<std::string> keep_error;
    // (`least`: the smallest value the field takes; a batch of 0 in a
    // manifest is named here, was: "trainer: batch=0 ..." naming no file)
    const auto keep = [&](const char* flag, const char* key, auto& field, long long least = 0) {
      const auto it = info.meta.find(key);
      if (keep_error || (flag != nullptr && cli.given.count(flag)) || it == info.meta.end()) return;
      using F = std::decay_t<decltype(field)>;
      const std::string& v = it->second;
      F x{};
      bool ok = false;
      if constexpr (std::is_floating_point_v<F>) {
        char* end = nullptr;
        x = std::strtod(v.c_str(), &end);
        ok = !v.empty() && end == v.c_str() + v.size() && std::isfinite(x);
      } else {
        const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
        ok = r.ec == std::errc() && r.ptr == v.data() + v.size() &&
             static_cast<long double>(x) >= static_cast<long double>(least);
      }
      if (ok)
        field = x;
      else
        keep_error = "--resume: " + resume->string() + ": the manifest's " + key + " '" + v +
                     "' is not " +
                     (std::is_floating_point_v<F> ? std::string("a finite number")
                      : least > 0                 ? "an integer >= " + std::to_string(least)
                                                  : std::string("a non-negative integer")) +
                     (flag != nullptr ? std::string(" (give ") + flag + " to set it)" : "");
    };
    keep(nullptr, "data_seed", o.data_seed);
    keep("--batch", "batch", o.batch, 1);
    keep("--seq", "seq", o.seq, 1);
    keep("--lr", "lr", o.schedule.lr);
    keep("--min-lr", "min_lr", o.schedule.min_lr);
    keep("--warmup", "warmup", o.schedule.warmup);
    keep("--steps", "total", o.schedule.total);
    if (!keep_error && o.schedule.min_lr > o.schedule.lr)  // (was: LrSchedule's words, no file)
      keep_error = "--resume: " + resume->string() + ": the final learning rate " +
                   (std::ostringstream() << o.schedule.min_lr).str() +
                   (cli.given.count("--min-lr") ? " (--min-lr)" : " (the manifest's min_lr)") +
                   " is more than the learning rate " +
                   (std::ostringstream() << o.schedule.lr).str() +
                   (cli.given.count("--lr") ? " (--lr)" : " (the manifest's lr)") +
                   "; give --lr and --min-lr with min-lr <= lr";
    // the saved model's positions hold the sequence (was: "trainer: seq=64
    // exceeds n_positions=1", naming no file)
    if (!keep_error && o.seq > o.config.n_positions)
      keep_error =
          "--resume: " + resume->string() + ": the sequence length " + std::to_string(o.seq) +
          (cli.given.count("--seq") ? " (--seq)" : " (the manifest's seq)") +
          " is more than the saved model's n_positions=" + std::to_string(o.config.n_positions) +
          (cli.given.count("--seq") ? "; give a --seq of at most that" : "");
    steps = o.schedule.total;
    // As a fresh run does: the warm-up ends by the last step (a run saved
    // with --steps 30 and its default warm-up of 20, resumed with --steps 6).
    if (!keep_error && o.schedule.total > 0 && o.schedule.warmup > o.schedule.total) {
      if (root)
        std::printf(
            "gpt_train: the warm-up (%lld steps%s) is longer than --steps %lld: warm-up "
            "%lld steps\n",
            static_cast<long long>(o.schedule.warmup),
            cli.given.count("--warmup") ? "" : ", saved in the checkpoint",
            static_cast<long long>(o.schedule.total), static_cast<long long>(o.schedule.total));
      o.schedule.warmup = o.schedule.total;
    }
    // The run continues under its id (a checkpoint of a gpt_train before run
    // ids has none: the run gets one below).
    if (const auto it = info.meta.find("run_id"); it != info.meta.end() && !keep_error) {
      o.run_id = it->second;
      if (!summa::is_run_id(it->second))
        keep_error = "--resume: " + resume->string() + ": the manifest's run_id '" +
                     it->second.substr(0, 80) +
                     "' is not a run id (at most 64 letters, digits, "
                     "'-' or '_')";
    }
    keep("--weight-decay", "weight_decay", o.optimizer.weight_decay);
    keep("--clip", "clip", o.clip);
    summa::agree_on(world, keep_error);
    if (root) {
      if (!resume_note.empty()) std::printf("gpt_train: %s\n", resume_note.c_str());
      std::printf("gpt_train: resuming from %s (step %lld, saved under %s)\n",
                  resume->string().c_str(), static_cast<long long>(info.step),
                  info.meta.count("scheme") ? info.meta.at("scheme").c_str() : "?");
    }
  }

  if (!cli.check_batch.empty())  // the shape is known now
    summa::on_root_agreed(world, [&] { guard_check_batch(true); });
  std::vector<std::uint16_t> tokens;
  {
    std::optional<std::string> error;
    try {
      tokens = summa::io::load_tokens(cli.data);
    } catch (const summa::Error& e) {
      error = std::string("--data: ") + e.what();
    }
    summa::agree_on(world, error);
  }
  const std::size_t n_tokens = tokens.size();
  // Memory: sizes checked before anything large is built or allocated
  // (summa/parallel/memory_check.hpp): the parameters, gradients and
  // optimizer state from the sizes alone, then the planner's figure for this
  // configuration (every step buffer), against what each rank has: the
  // node's memory on the CPU, the device's free memory on a GPU (shared by
  // the ranks on it), or --memory-budget.
  const std::unique_ptr<summa::Backend> backend = make_backend(cli, o.grid);
  const bool budget_given = cli.memory_budget_gib > 0;
  // A budget is a ceiling within what the ranks have, never above it (was:
  // a budget beyond the node passed the check, then one rank's bad_alloc
  // aborted the job). The figure is the smallest over the ranks: the same
  // outcome on every rank.
  const double available = summa::available_memory_per_rank(world, *backend);
  if (budget_given && available > 0 && cli.memory_budget_gib * double(1 << 30) > available) {
    char text[320];
    std::snprintf(
        text, sizeof text,
        "--memory-budget %.10g GiB per rank is more than the %.3g GiB per rank %s (over "
        "the ranks sharing it); give at most that, or leave --memory-budget out to use it",
        cli.memory_budget_gib, available / double(1 << 30),
        summa::available_memory_source(*backend));
    throw summa::CollectiveError(text);
  }
  const summa::MemoryBudget budget{
      .bytes = budget_given ? cli.memory_budget_gib * double(1 << 30) : available,
      .source = budget_given ? "of --memory-budget" : summa::available_memory_source(*backend),
      .state_bytes_per_parameter = static_cast<double>(state_bytes_per_parameter<T>(o.optimizer)),
      .state_bytes_fixed = static_cast<double>(summa::offload_staging_bytes<T>(o.optimizer))};
  if (auto_scheme)  // before ranking schemes; the most optimistic group: all ranks
    summa::require_lower_bound_fits(world, ranks, o.config, sizeof(T), true, budget, "gpt_train");
  if (auto_scheme) {
    spec = choose_scheme<T>(cli, o, *backend, root);
    o.scheme = spec.str();
  }
  try {
    summa::require_memory_fits<T>(world, spec, *backend, o.config, o.batch, o.seq, o.gpt, o.grid,
                                  budget, "gpt_train");
  } catch (const summa::CollectiveError& e) {
    // The scheme's own checks (SchemeContext::check_gpt, agreed) name
    // GptConfig's fields: said with the scheme and the flag that sets the
    // field (was: "GPT (1D): vocab_size=1 must be divisible by p=2").
    std::string_view m = e.what();
    if (!m.starts_with("GPT (") || m.find("): ") == std::string_view::npos) throw;
    m.remove_prefix(m.find("): ") + 3);
    std::string flag;
    for (const auto& [field, name] :
         {std::pair<std::string_view, const char*>{"n_embd", "--hidden"},
          {"n_head=", "--heads"},
          {"vocab_size=", "--vocab"},
          {"batch=", "--batch"}})
      if (m.starts_with(field)) flag = name;
    if (flag == "--vocab" && !cli.given.count("--vocab") && !resume) flag.clear();
    throw summa::CollectiveError(
        (cli.scheme.empty() ? "the scheme " + spec.str() + " (the default for " +
                                  std::to_string(ranks) + " ranks; see --scheme)"
                            : "--scheme " + spec.str()) +
        " cannot split this model: " + std::string(m) +
        (flag.empty()
             ? std::string()
             : " (" + flag + (resume && flag != "--batch" ? ", saved in the checkpoint)" : ")")));
  }

  if (o.run_id.empty()) {  // a fresh run: rank 0 draws its id, every rank takes it
    char id[17] = {};
    if (root) {
      std::random_device device;
      const std::uint64_t x =
          (std::uint64_t{device()} << 32) ^ device() ^
          static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
      std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(x));
    }
    MPI_Request request;
    MPI_Ibcast(id, 16, MPI_CHAR, 0, world, &request);
    summa::wait_guarded(request, world, "gpt_train's run id broadcast", 16);
    o.run_id = std::string(id, 16);
  }
  std::unique_ptr<summa::Trainer<T>> made;
  try {
    made = std::make_unique<summa::Trainer<T>>(world, o, *backend, std::move(tokens));
  } catch (const summa::CollectiveError& e) {  // the token stream's problems name the file
    const std::string_view m = e.what();
    if (!m.starts_with("TokenLoader: ")) throw;
    throw summa::CollectiveError("--data " + cli.data + ": " + std::string(m.substr(13)));
  }
  summa::Trainer<T>& trainer = *made;
  if (!cli.import_dir.empty()) trainer.import_hf(cli.import_dir);
  if (resume) trainer.load(*resume);
  summa::Watchdog* watchdog = trainer.parallel().grid().watchdog();

  // Memory per rank: the model's buffers plus the optimizer state on the
  // backend (its slots and bf16's master; offloaded: the staging buffers)
  // (fixed after construction; the largest over ranks).
  const summa::MemoryReport report = trainer.model().memory_report();
  const summa::Optimizer<T>& opt = trainer.optimizer();
  double mem =
      static_cast<double>(report.total()) +
      (opt.offloaded()
           ? static_cast<double>(summa::offload_staging_bytes<T>(o.optimizer))
           : static_cast<double>(opt.state_names().size() + (opt.master() != nullptr ? 1 : 0)) *
                 static_cast<double>(opt.state_elements()) * sizeof(summa::master_t<T>));
  {  // under the watchdog (was a raw MPI_Allreduce: a rank stopped here hung the job)
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, &mem, 1, MPI_DOUBLE, MPI_MAX, world, &request);
    summa::wait_guarded(request, world, "gpt_train's memory all-reduce", sizeof mem);
  }
  const double flops_per_step = summa::model_flops_per_step(o.config, o.batch, o.seq);
  const double tokens_per_step = static_cast<double>(o.batch * o.seq);

  LogFile log;
  summa::on_root_agreed(world,
                        [&] { log.open(log_path, trainer.step() > 0, trainer.step(), o.run_id); });
  // A failed log write (rank 0) becomes the same error on every rank.
  const auto check_log = [&] {
    summa::agree_on(world, log.error().empty()
                               ? std::nullopt
                               : std::optional<std::string>("gpt_train: " + log.error()));
  };
  const auto save = [&] {
    if (root) log.sync();
    check_log();
    summa::on_root_agreed(world, [&] {  // still this job's --out and --log?
      lock->require_held();
      log_lock->require_held();
    });
    trainer.save(ckpt_root);
  };
  // the backend as it runs: "cpu-blis", "cpu-openblas x 2 threads", "cuda"
  std::string backend_text(backend->name());
  if (const auto* cpu = dynamic_cast<const summa::CpuBackend*>(backend.get());
      cpu != nullptr && cpu->threads() > 1)
    backend_text += " x " + std::to_string(cpu->threads()) + " threads";
  if (root) {
    std::printf(
        "gpt_train: GPT-2 n_layer=%d n_head=%d n_embd=%d seq=%lld vocab=%d (%lld parameters) | "
        "%s on %d ranks | %s on %s (comm %s%s%s) | batch %lld x %lld tokens, recompute %s | %s lr "
        "%.3g (warm-up "
        "%lld, cosine to %.3g) | %zu tokens from %s\n",
        o.config.n_layer, o.config.n_head, o.config.n_embd, static_cast<long long>(o.seq),
        o.config.vocab_size, static_cast<long long>(summa::reference::parameter_count(o.config)),
        summa::SchemeSpec::parse(trainer.options().scheme).str().c_str(), ranks, cli.dtype.c_str(),
        backend_text.c_str(), summa::to_string(o.grid.comm), cli.tf32 ? ", tf32" : "",
        // read from the grid the model runs on: the flag reached it
        trainer.parallel().grid().check_calls() ? ", check-calls" : "",
        static_cast<long long>(o.batch), static_cast<long long>(o.seq),
        // read from the model: the flag reached it
        std::string(summa::to_string(trainer.parallel().model().options().recompute)).c_str(),
        o.optimizer.kind.c_str(), o.schedule.lr, static_cast<long long>(o.schedule.warmup),
        o.schedule.min_lr, n_tokens, cli.data.c_str());
    std::fflush(stdout);
  }
  const bool bar = root && progress == Progress::bar;
  bool evaluated = false;
  const auto eval = [&](const char* when) {
    // Fault injection (tests/fault): SUMMA_FAULT_TERM_IN_FIRST_EVAL=<rank>
    // sends that rank SIGTERM as the first validation starts.
    if (const char* r = std::getenv("SUMMA_FAULT_TERM_IN_FIRST_EVAL");
        r != nullptr && !evaluated && std::atoi(r) == rank)
      std::raise(SIGTERM);
    const bool evaluated_before = evaluated;
    evaluated = true;
    const double v = trainer.evaluate(cli.eval_batches);
    if (root) {
      std::printf("%s%s step %lld: validation loss %.4f\n", bar ? "\n" : "", when,
                  static_cast<long long>(trainer.step()), v);
      std::fflush(stdout);
      // a resume's first validation, at a step whose value the log holds, is
      // printed only (the value logged before stays)
      if (evaluated_before || !log.val_at_resume())
        log.line(
            nlohmann::ordered_json{{"step", trainer.step()}, {"run", o.run_id}, {"val_loss", v}}
                .dump());
    }
    return v;
  };

  // Before the first validation (was: after it, so a signal during it ended
  // the rank at once, unreported): one that comes during it stops the run
  // before its first step.
  install_stop_handlers();
  const double val_before = eval("before training,");
  const std::int64_t first = trainer.step();
  int stop_signal = agreed_stop_signal(world);
  // the last step's checkpoint is written (stopped before any step: the
  // checkpoint resumed, if any)
  bool saved_now = stop_signal != 0;
  std::vector<double> times, losses;
  int skipped = 0;
  const auto t_start = std::chrono::steady_clock::now();
  for (std::int64_t s = first; s < steps && stop_signal == 0; ++s) {
    const summa::TrafficCounters before = trainer.model().grid().traffic();
    trainer.model().reset_profile();
    const auto t0 = std::chrono::steady_clock::now();
    const summa::StepStats st = trainer.train_step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The slowest rank sets the pace; rank 0's log state and any rank's
    // stop signal travel along.
    double shared[3] = {dt, log.error().empty() ? 0.0 : 1.0, static_cast<double>(g_stop_signal)};
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, shared, 3, MPI_DOUBLE, MPI_MAX, world, &request);
    if (watchdog != nullptr)
      watchdog->wait(request, world, "gpt_train's step-time all-reduce", sizeof shared);
    else
      MPI_Wait(&request, MPI_STATUS_IGNORE);
    if (shared[1] > 0) check_log();
    stop_signal = static_cast<int>(shared[2]);
    saved_now = false;
    const double dt_max = shared[0];
    times.push_back(dt_max);
    losses.push_back(st.loss);
    skipped += st.skipped ? 1 : 0;
    if (root) {
      const double tok_s = tokens_per_step / dt_max, flop_s = flops_per_step / dt_max;
      // ETA from the median of the last 20 steps.
      std::vector<double> recent(times.end() - std::min<std::ptrdiff_t>(20, std::ssize(times)),
                                 times.end());
      std::nth_element(recent.begin(), recent.begin() + std::ssize(recent) / 2, recent.end());
      const double eta = recent[recent.size() / 2] * static_cast<double>(steps - s - 1);
      char line[256];
      std::snprintf(line, sizeof line,
                    "step %5lld/%lld | loss %.4f | lr %.2e | |g| %.3f | %s | %s | mem %s/rank | "
                    "ETA %s%s",
                    static_cast<long long>(s + 1), static_cast<long long>(steps), st.loss, st.lr,
                    st.grad_norm, human(tok_s, "tok/s").c_str(), human(flop_s, "FLOP/s").c_str(),
                    human(mem, "B").c_str(), duration(eta).c_str(),
                    st.skipped ? " | SKIPPED (not finite)" : "");
      if (bar) {
        std::printf("\r%s\033[K", line);
        std::fflush(stdout);
      } else if (progress == Progress::lines &&
                 ((s + 1) % cli.print_every == 0 || s == first || s + 1 == steps)) {
        std::printf("%s\n", line);
        std::fflush(stdout);
      }
      nlohmann::ordered_json record = {{"step", s + 1},
                                       {"run", o.run_id},
                                       {"loss", st.loss},
                                       {"lr", st.lr},
                                       {"grad_norm", st.grad_norm},
                                       {"step_s", dt_max},
                                       {"tokens_per_s", tok_s},
                                       {"model_flops_per_s", flop_s}};
      // Rank 0's breakdown: the time it waited on each axis's communication
      // and the rest of its step (compute and unhidden local work).
      const summa::TrafficCounters& after = trainer.model().grid().traffic();
      nlohmann::ordered_json wait = nlohmann::ordered_json::object();
      double waited = 0;
      for (std::size_t a = 0; a < summa::comm_axis_count; ++a) {
        const auto axis = static_cast<summa::CommAxis>(a);
        const double w = after[axis].wait_seconds - before[axis].wait_seconds;
        if (after[axis].calls == before[axis].calls) continue;
        wait[std::string(summa::name_of(axis))] = w;
        waited += w;
      }
      record["comm_wait_s"] = wait;
      record["compute_s"] = std::max(0.0, dt - waited);
      if (cli.profile) {  // rank 0's step parts (GptOptions::profile)
        nlohmann::ordered_json parts = nlohmann::ordered_json::object();
        for (const summa::StepPart& p : trainer.model().profile())
          parts[std::string(p.op) + "." + std::string(p.phase)] = p.seconds;
        record["parts_s"] = parts;
      }
      if (st.skipped) record["skipped"] = true;
      log.line(record.dump());
    }
    if (cli.eval_every > 0 && (s + 1) % cli.eval_every == 0 && s + 1 < steps) eval("at");
    if (stop_signal != 0) break;
    if (cli.checkpoint_every > 0 && (s + 1) % cli.checkpoint_every == 0 && s + 1 < steps) {
      save();
      saved_now = true;
      stop_signal = agreed_stop_signal(world);  // one that came during the save
      if (stop_signal != 0) break;
    }
  }
  if (stop_signal != 0) {  // save (unless just saved), log why, exit 128 + signal
    const char* name = stop_signal == SIGINT ? "SIGINT" : "SIGTERM";
    const bool nothing = trainer.step() == 0;  // a fresh run stopped before its first step
    if (root) {
      if (nothing)
        std::printf(
            "gpt_train: %s received before the first step: nothing trained, nothing "
            "saved\n",
            name);
      else
        std::printf("%sgpt_train: %s received: stopping after step %lld%s\n", bar ? "\n" : "", name,
                    static_cast<long long>(trainer.step()),
                    saved_now ? " (its checkpoint is saved)" : "; saving a checkpoint");
      std::fflush(stdout);
    }
    if (!saved_now) save();
    // logged once the checkpoint is saved: a job killed during the save (mpirun
    // forwards a signal, then kills the ranks) leaves no "stopped" line for a
    // checkpoint that does not exist
    if (root)
      log.line(
          nlohmann::ordered_json{{"step", trainer.step()}, {"run", o.run_id}, {"stopped", name}}
              .dump());
    check_log();
    if (root && !nothing) {
      std::printf("checkpoint: %s (resume with --resume)\n",
                  summa::latest_checkpoint(ckpt_root).value_or(ckpt_root).string().c_str());
      std::fflush(stdout);
    }
    return 128 + stop_signal;
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  // Nothing trained (a finished run resumed): the loss was just measured and
  // logged at this step (was: a second identical log line).
  const double val_after = trainer.step() == first ? val_before : eval("after training,");
  if (trainer.step() > first || !resume) save();  // nothing new otherwise
  check_log();
  if (!export_dir.empty()) trainer.export_hf(export_dir);
  if (!cli.check_batch.empty()) {
    // One validation batch and summa's loss on it, for scripts/hf_check.py
    // (the same loss from the export, in PyTorch).
    const summa::io::TokenLoader& L = trainer.loader();
    const summa::io::Batch b =
        L.batch(0, L.has_val() ? summa::io::Split::val : summa::io::Split::train);
    const double loss = trainer.model().forward(b.tokens, b.targets);
    summa::on_root_agreed(world, [&] {
      std::string bytes;  // written whole or not at all (atomic: was a truncate in place)
      bytes.reserve(4 * (b.tokens.size() + b.targets.size()));
      for (const auto* ids : {&b.tokens, &b.targets})
        for (const std::int32_t id : *ids) {
          const auto u = static_cast<std::uint32_t>(id);
          for (int shift = 0; shift < 32; shift += 8)
            bytes.push_back(static_cast<char>((u >> shift) & 0xff));
        }
      guard_check_batch(true);  // the path may have changed during the run
      summa::io::write_file_atomic(cli.check_batch, bytes, "--check-batch");
    });
    if (root)
      std::printf(
          "check batch: %s (%lld x %lld ids, then targets; int32 LE), summa loss=%.17g\n"
          "  compare: %s %s %s %s %lld %lld\n",
          cli.check_batch.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq),
          loss, SUMMA_PYTHON_EXECUTABLE, SUMMA_SCRIPTS_DIR "/hf_check.py", export_dir.c_str(),
          cli.check_batch.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq));
  }
  // The most the backend held at once on any rank (every buffer the library
  // allocated; the plan above should equal it: docs/memory.md).
  double peaks[2] = {static_cast<double>(backend->peak_allocated_bytes()),
                     static_cast<double>(backend->host_peak_allocated_bytes())};
  {
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, peaks, 2, MPI_DOUBLE, MPI_MAX, world, &request);
    summa::wait_guarded(request, world, "gpt_train's peak memory all-reduce", sizeof peaks);
  }
  const double peak = peaks[0], host_peak = peaks[1];
  if (root) {
    const std::size_t k = std::min<std::size_t>(10, losses.size());
    const double head =
        k ? std::accumulate(losses.begin(), losses.begin() + static_cast<std::ptrdiff_t>(k), 0.0) /
                static_cast<double>(k)
          : 0;
    const double tail =
        k ? std::accumulate(losses.end() - static_cast<std::ptrdiff_t>(k), losses.end(), 0.0) /
                static_cast<double>(k)
          : 0;
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted.empty() ? 0 : sorted[sorted.size() / 2];
    std::printf("%s\n== summary ==\n", bar ? "\n" : "");
    if (times.empty())
      std::printf("nothing to train: at step %lld of %lld (--steps N to go further)\n",
                  static_cast<long long>(trainer.step()), static_cast<long long>(steps));
    else
      std::printf("steps %lld..%lld in %s (median step %.3f s, %s, %s)\n",
                  static_cast<long long>(first), static_cast<long long>(trainer.step()),
                  duration(elapsed).c_str(), median,
                  human(median > 0 ? tokens_per_step / median : 0, "tok/s").c_str(),
                  human(median > 0 ? flops_per_step / median : 0, "FLOP/s").c_str());
    if (skipped > 0) std::printf("skipped steps (non-finite loss or gradient norm): %d\n", skipped);
    if (k)
      std::printf("training loss: mean of the first %zu steps %.4f -> last %zu steps %.4f\n", k,
                  head, k, tail);
    std::printf("validation loss: %.4f -> %.4f (uniform over %d tokens would be %.4f)\n",
                val_before, val_after, o.config.vocab_size,
                std::log(static_cast<double>(o.config.vocab_size)));
    std::printf("memory per rank (largest): %s planned, %s measured peak (backend)\n",
                human(mem, "B").c_str(), human(peak, "B").c_str());
    if (o.optimizer.offload_bucket > 0)
      std::printf(
          "optimizer offload: %s of state in host memory per rank (largest), buckets of "
          "%lld elements\n",
          human(host_peak, "B").c_str(), static_cast<long long>(o.optimizer.offload_bucket));
    std::string latest = ckpt_root.string();
    try {  // `latest` may be the damaged one a resume passed over
      latest = summa::latest_checkpoint(ckpt_root).value_or(ckpt_root).string();
    } catch (const summa::Error&) {
    }
    std::printf("checkpoint: %s (resume with --resume, under any scheme)\n", latest.c_str());
    if (!export_dir.empty())
      std::printf("export:     %s/model.safetensors + config.json (Hugging Face GPT-2)\n",
                  export_dir.c_str());
    std::printf("log:        %s (plot: %s %s %s)\n", log_path.c_str(), SUMMA_PYTHON_EXECUTABLE,
                SUMMA_SCRIPTS_DIR "/plot_loss.py", log_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  summa::init_mpi(&argc, &argv, Cli{}.watchdog);  // MPI_Init under --watchdog's limit
  Cli cli;
  CLI::App app{"gpt_train: train a GPT-2 with summa under any tensor-parallel scheme"};
  // A flag given twice: the last one counts (as in most command lines).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--layers", cli.layers, "transformer blocks")
      ->check(integer_in(1, 100000))
      ->capture_default_str();
  app.add_option("--hidden", cli.hidden, "hidden size n_embd")
      ->check(integer_in(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--heads", cli.heads, "attention heads")
      ->check(integer_in(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--seq", cli.seq, "tokens per sequence")
      ->check(integer_in(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--vocab", cli.vocab,
                 "vocabulary size (0: the byte tokenizer's 256, padded to a multiple of the "
                 "tensor ranks)")
      ->check(integer_in(0, 65536))
      ->capture_default_str();
  app.add_option("--positions", cli.positions, "n_positions (0: seq)")
      ->check(integer_in(0, 1 << 24))
      ->capture_default_str();
  app.add_option("--scheme", cli.scheme,
                 "scheme and grid: 2d:q=Q[,panel=N][,overlap=on|off], 1d:p=P[,sp=on|,dc=on], "
                 "3d:XxYxZ[,overlap=oar+ors+oag], with optional data=D[:zero=1|2|3] (zero=1: "
                 "the optimizer state sharded over the D groups; zero=2: each gradient reduced "
                 "onto its chunk's group too; zero=3: the parameters and gradients sharded "
                 "too, each block gathered ahead of its use), or auto: the fastest "
                 "by the step-time model on --machine within the memory budget (default: 2d on "
                 "a square rank count, else 1d)");
  app.add_option("--machine", cli.machine,
                 "--scheme auto: the machine file the schemes are priced on (machines/*.json)")
      ->capture_default_str();
  app.add_option("--top", cli.top, "--scheme auto: how many of the best schemes to print")
      ->check(integer_in(1, 1000))  // whole decimal (was: 0x5 accepted)
      ->capture_default_str();
  app.add_option("--dtype", cli.dtype,
                 "float, double or bf16 (bf16 parameters and activations, fp32 master weights, "
                 "optimizer state and statistics)")
      ->check(CLI::IsMember({"float", "double", "bf16"}))
      ->capture_default_str();
  app.add_option("--backend", cli.backend,
                 "cpu (GEMMs on --cpu-gemm) or cuda (one GPU per rank, chosen from the node-local "
                 "rank; needs summa built with CUDA)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  summa::flags::add_cpu_options(app, cli.cpu_gemm, cli.threads);
  app.add_option("--comm", cli.comm,
                 "communicators: mpi (cpu only), nccl (cuda, one GPU per rank) or mpi_staged "
                 "(cuda, through pinned host buffers; several ranks may share a GPU). Default: "
                 "mpi on cpu, nccl on cuda")
      ->check(CLI::IsMember({"mpi", "nccl", "mpi_staged"}));
  app.add_flag("--tf32", cli.tf32, "cuda: TF32 tensor cores in float GEMMs");
  auto* recompute =
      app.add_option("--recompute", cli.recompute,
                     "what backward recomputes: full (per-block activation checkpoints), "
                     "selective (only attention's probabilities; Korthikanti et al. 2022) or none "
                     "(keep every activation)")
          ->check(CLI::IsMember({"none", "full", "selective"}))
          ->capture_default_str();
  app.add_flag("--no-recompute", cli.no_recompute, "the same as --recompute none")
      ->excludes(recompute);
  app.add_flag("--profile", cli.profile,
               "log each step's parts (parts_s: embedding, blocks, ln_f, lm_head forward; "
               "lm_head, ln_f, blocks recompute and backward, embedding, data-axis wait; each "
               "block op per phase, nested in blocks; rank 0, device-synchronised)");
  app.add_option("--steps", cli.steps, "total training steps")
      ->check(integer_in(0, 1e12))
      ->capture_default_str();
  app.add_option("--batch", cli.batch, "global batch (sequences per step)")
      ->check(integer_in(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--optimizer", cli.optimizer, "adamw or sgd")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  app.add_option("--lr", cli.lr, "peak learning rate")
      ->check(real_in(0, 1e30))
      ->capture_default_str();
  app.add_option("--min-lr", cli.min_lr, "final learning rate of the cosine (default lr/10)")
      ->check(real_in(0, 1e30));
  app.add_option("--warmup", cli.warmup, "linear warm-up steps")
      ->check(integer_in(0, 1e12))
      ->capture_default_str();
  app.add_option("--weight-decay", cli.weight_decay, "decoupled weight decay (2-D parameters)")
      ->check(real_in(0, 1e6))
      ->capture_default_str();
  app.add_option("--beta2", cli.beta2, "AdamW beta2")
      ->check(real_in(0, 1, /*below_hi=*/true))
      ->capture_default_str();
  app.add_option("--momentum", cli.momentum, "SGD momentum")
      ->check(real_in(0, 1, /*below_hi=*/true))
      ->capture_default_str();
  app.add_option("--offload-bucket", cli.offload_bucket,
                 "optimizer offload: keep the optimizer state (and bf16's fp32 master weights) "
                 "in host memory, streamed through the update in buckets of N elements (0: on "
                 "the backend; docs/training.md, \"Optimizer offload\")")
      ->check(integer_in(0, 1e15))
      ->capture_default_str();
  app.add_option("--clip", cli.clip, "gradient global-norm clip (0: off)")
      ->check(real_in(0, 1e30))
      ->capture_default_str();
  app.add_option("--seed", cli.seed, "weight initialisation seed")
      ->check(integer_in(0, 18446744073709551615.0L))
      ->capture_default_str();
  app.add_option("--data-seed", cli.data_seed, "batch sampling seed")
      ->check(integer_in(0, 18446744073709551615.0L))
      ->capture_default_str();
  app.add_option("--data", cli.data, "token file (.bin, nanoGPT uint16) or text file")
      ->capture_default_str();
  app.add_option("--val-fraction", cli.val_fraction, "held-out tail of the data")
      ->check(real_in(0, 0.99))
      ->capture_default_str();
  app.add_option("--eval-every", cli.eval_every, "validation every N steps (0: start/end only)")
      ->check(integer_in(0, 1 << 30))
      ->capture_default_str();
  app.add_option("--eval-batches", cli.eval_batches, "validation batches")
      ->check(integer_in(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--print-every", cli.print_every,
                 "with --progress lines: a progress line every N steps (0: none)")
      ->check(integer_in(0, 1 << 30))
      ->capture_default_str();
  app.add_option("--progress", cli.progress,
                 "bar (one line updated in place), lines (--print-every), none, or auto: bar "
                 "when stdout is a terminal and no MPI launcher runs the job, else lines")
      ->check(CLI::IsMember({"auto", "bar", "lines", "none"}))
      ->capture_default_str();
  app.add_option("--out", cli.out, "output directory")->capture_default_str();
  app.add_option("--checkpoint-every", cli.checkpoint_every,
                 "checkpoint every N steps (0: only at the end)")
      ->check(integer_in(0, 1 << 30))
      ->capture_default_str();
  app.add_flag("--resume", cli.resume,
               "resume from <out>/checkpoints: the step `latest` names, or the newest valid "
               "one when `latest` is damaged; from scratch only when nothing was saved");
  app.add_flag("--overwrite", cli.overwrite,
               "start afresh even though --out holds a run's checkpoints (they are deleted) or "
               "--log a run's lines (it is cut)");
  app.add_option("--watchdog", cli.watchdog,
                 "seconds a collective may wait before the job is ended with a report naming "
                 "the ranks that did not arrive (0: off)")
      ->check(summa::flags::watchdog_seconds())
      ->capture_default_str();
  app.add_flag("--check-calls", cli.check_calls,
               "debug mode: every layer, model and SUMMA call agrees its argument checks over "
               "its group before it communicates (one small all-reduce per call), so an "
               "argument one rank alone gets wrong is the same error on every rank instead of a "
               "hang; off, a step makes only its scheme's collectives (docs/reliability.md)");
  app.add_option("--on-nonfinite", cli.on_nonfinite,
                 "a step with a NaN or infinite loss or gradient norm: stop (before any update "
                 "or save) or skip it (no update)")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  app.add_option("--max-skipped", cli.max_skipped,
                 "with --on-nonfinite skip: stop after this many skipped steps in a row")
      ->check(integer_in(0, 1 << 30))
      ->capture_default_str();
  app.add_option("--memory-budget", cli.memory_budget_gib,
                 "GiB per rank the configuration must fit in (0: what the backend has per "
                 "rank: the node's available memory on cpu, the GPU's free memory on cuda, "
                 "shared by the ranks on it; more than that is refused)")
      ->check(real_in(0, 1e9));
  app.add_option("--resume-from", cli.resume_from, "resume from this checkpoint (dir or root)");
  app.add_option("--import", cli.import_dir, "start from a Hugging Face GPT-2 export (dir)");
  app.add_option("--export", cli.export_dir, "Hugging Face export directory ('' : none)")
      ->capture_default_str();
  app.add_option("--log", cli.log, "JSON-lines log")->capture_default_str();
  app.add_option("--check-batch", cli.check_batch,
                 "after training, write a validation batch here and print summa's loss on it "
                 "(for scripts/hf_check.py)");
  int code = 0;
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // Every rank parses the same argv: the same outcome everywhere, printed once.
      if (e.get_exit_code() == 0) {
        code = world_rank() == 0 ? app.exit(e) : 0;
      } else {
        if (world_rank() == 0)
          std::fprintf(stderr, "gpt_train: error: %s (see --help)\n", e.what());
        code = 2;
      }
      summa::finalize_mpi();
      return code;
    }
    for (const CLI::Option* opt : app.get_options())
      if (opt->count() > 0) cli.given.insert(opt->get_name());
    check_flags(cli);
    code = cli.dtype == "double" ? train<double>(cli)
           : cli.dtype == "bf16" ? train<summa::bf16>(cli)
                                 : train<float>(cli);
  } catch (const summa::CollectiveError& e) {
    // Every rank holds this error: printed once, a clean exit everywhere.
    std::string_view m = e.what();
    if (m.starts_with("gpt_train: ")) m.remove_prefix(11);
    if (world_rank() == 0)
      std::fprintf(stderr, "gpt_train: error: %.*s\n", static_cast<int>(m.size()), m.data());
    code = 1;
  } catch (const std::bad_alloc& e) {  // past the planner's check (summa::OutOfMemory: the bytes)
    std::fprintf(stderr,
                 "gpt_train (rank %d): out of memory (%s); lower --batch or the model size, or "
                 "give --memory-budget; aborting the job\n",
                 world_rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const std::exception& e) {
    // Seen by this rank alone: its peers may wait in a collective for it, so
    // the job is ended rather than left hanging.
    std::fprintf(stderr, "gpt_train (rank %d): error: %s; aborting the job\n", world_rank(),
                 e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  summa::finalize_mpi();
  return code;
}
