#include "summa/comm/watchdog.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>

#include "setup_limit.hpp"
#include "summa/comm/consensus.hpp"
#include "summa/comm/mpi_communicator.hpp"
#include "summa/core/error.hpp"

namespace summa {

namespace {

constexpr int kProbeTag = 1;
constexpr int kAnswerTag = 2;
using Clock = std::chrono::steady_clock;

// What a rank answers a probe with.
struct Answer {
  std::int64_t waiting = 0;  // 1: in a guarded wait
  std::int64_t axis = 0, leader = 0, kind = 0;
  std::int64_t sequence = 0, bytes = 0;
  std::int64_t waited_ms = 0;
  std::int64_t raw = 0;    // 1: a program's own MPI request (no axis)
  std::int64_t token = 0;  // the probe's, echoed: answers to an earlier round are stale
};
constexpr int kAnswerWords = sizeof(Answer) / sizeof(std::int64_t);

// The probe rounds of this process, numbered from 1: a probe carries its
// round, an answer echoes it, and the prober counts only answers to its
// current round. A rank that serves a probe late (it was computing, or
// stopped, when the round ended) answers after the prober gave up; that
// stale answer, still queued (on this watchdog, or on a later one whose
// duplicated communicator reuses the context), must not count as an answer
// in a later report (was: a silent rank reported as answering, seen in CI).
// Each round's number has its own element of a deque that never shrinks
// (stable addresses): a probe's send buffer outlives the send, which the
// prober frees without waiting for it, and a later round never rewrites a
// buffer an earlier send may still read (8 bytes per expiry).
std::int64_t probe_round = 0;
std::deque<std::int64_t> probe_tokens;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// When the current guarded wait began (for the answers' waited_ms).
thread_local Clock::time_point wait_began{};

}  // namespace

namespace {
// The live enabled watchdogs, oldest first (Watchdog::active: the last).
std::vector<Watchdog*>& live_watchdogs() {
  static std::vector<Watchdog*> live;
  return live;
}
}  // namespace

Watchdog* Watchdog::active() {
  const std::vector<Watchdog*>& live = live_watchdogs();
  return live.empty() ? nullptr : live.back();
}

bool Watchdog::wait_if_covered(MPI_Request& request, MPI_Comm group, const char* what,
                               std::uint64_t bytes) {
  if (!enabled()) return false;
  Known* k = nullptr;
  int size = 0;
  check_mpi(MPI_Comm_size(group, &size), "MPI_Comm_size");
  for (Known& e : known_)  // (a freed handle may come back for another group)
    if (e.comm == group && (!e.covered || std::ssize(e.members) == size)) k = &e;
  if (k == nullptr) {  // first meeting: translate the group once
    k = &known_[next_known_];
    next_known_ = (next_known_ + 1) % known_.size();
    k->comm = group;
    try {
      k->members = members_of(group);
      k->covered = true;
    } catch (const Error&) {
      k->covered = false;  // a rank outside the watchdog's communicator
    }
  }
  if (!k->covered) return false;
  Pending p;
  p.what = what;
  p.bytes = bytes;
  p.leader = k->members.empty() ? 0 : k->members.front();
  guard(p, k->members, [&] {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  });
  return true;
}

Watchdog::Watchdog(MPI_Comm comm, WatchdogOptions options) : options_(std::move(options)) {
  std::optional<std::string> error;
  const double t = options_.timeout_s, r = options_.report_s;
  if (!std::isfinite(t) || t < 0)
    error = fmt::format("Watchdog: timeout_s={} must be finite and >= 0 (0: off)", t);
  else if (!std::isfinite(r) || r < 0)
    error = fmt::format("Watchdog: report_s={} must be finite and >= 0", r);
  const std::array<std::int64_t, 1> ms{error ? 0 : std::llround(t * 1000)};
  static constexpr const char* names[] = {"the watchdog timeout (ms)"};
  {
    // The agreement on the limit runs before this watchdog exists: under
    // the rank's own limit (a rank stopped before it ends the job too).
    const detail::SetupLimit limit(error ? 0 : t + r);
    agree_on(comm, error, ms, names, "the watchdog's set-up agreement");
  }
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup (watchdog)");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  if (enabled()) live_watchdogs().push_back(this);
}

Watchdog::~Watchdog() {
  std::erase(live_watchdogs(), this);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::vector<int> Watchdog::members_of(MPI_Comm native) const {
  MPI_Group mine, theirs;
  check_mpi(MPI_Comm_group(native, &mine), "MPI_Comm_group");
  check_mpi(MPI_Comm_group(comm_, &theirs), "MPI_Comm_group");
  int n = 0;
  check_mpi(MPI_Group_size(mine, &n), "MPI_Group_size");
  std::vector<int> ranks(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) ranks[static_cast<std::size_t>(i)] = i;
  check_mpi(MPI_Group_translate_ranks(mine, n, ranks.data(), theirs, out.data()),
            "MPI_Group_translate_ranks");
  MPI_Group_free(&mine);
  MPI_Group_free(&theirs);
  for (int w : out)
    if (w == MPI_UNDEFINED)
      throw Error("Watchdog: a communicator holds a rank outside the watchdog's communicator");
  return out;
}

void Watchdog::attach(Communicator& c, MPI_Comm native) {
  if (!enabled() || !c.host_blocking_wait()) return;
  c.watch_members_ = members_of(native);
  c.watchdog_ = this;
}

void Watchdog::serve_probes() {
  for (;;) {
    int flag = 0;
    MPI_Status status;
    check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kProbeTag, comm_, &flag, &status), "MPI_Iprobe");
    if (!flag) return;
    std::int64_t token = 0;
    check_mpi(
        MPI_Recv(&token, 1, MPI_INT64_T, status.MPI_SOURCE, kProbeTag, comm_, MPI_STATUS_IGNORE),
        "MPI_Recv (watchdog probe)");
    Answer a;
    a.token = token;
    if (pending_.active) {
      a.waiting = 1;
      a.axis = pending_.axis;
      a.leader = pending_.leader;
      a.kind = pending_.kind;
      a.sequence = static_cast<std::int64_t>(pending_.sequence);
      a.bytes = static_cast<std::int64_t>(pending_.bytes);
      a.waited_ms = std::llround(seconds_since(wait_began) * 1000);
      a.raw = pending_.what != nullptr ? 1 : 0;
    }
    // A small eager send; the prober is polling for it.
    check_mpi(MPI_Send(&a, kAnswerWords, MPI_INT64_T, status.MPI_SOURCE, kAnswerTag, comm_),
              "MPI_Send (watchdog answer)");
  }
}

// A send or a receive (a pipeline's stage messages): its ranks wait on
// different messages by design, so while this rank waits on one, a member
// waiting in another call is not out of step, and only the silent ranks are
// behind. (While this rank waits in a collective, a member waiting on a
// message has not arrived: it lags as before.)
bool Watchdog::point_to_point(const Pending& p) {
  return p.what == nullptr && (p.kind == static_cast<int>(Communicator::Kind::send) ||
                               p.kind == static_cast<int>(Communicator::Kind::recv));
}

std::string Watchdog::describe(const Pending& p) const {
  if (p.what != nullptr) return fmt::format("{} ({} bytes)", p.what, p.bytes);
  return fmt::format("{} #{} on axis {} ({} bytes)", collective_name(p.kind), p.sequence,
                     name_of(static_cast<CommAxis>(p.axis)), p.bytes);
}

bool Watchdog::expire(const std::vector<int>& members, double waited_s, bool may_defer) {
  const Pending mine = pending_;
  // Every rank of the job is probed, not only the group's: a member that
  // waits in another call is waiting on someone, and on a multi-axis grid
  // that someone is often outside this group (rank 0 waits on its row,
  // whose other member waits on its column for the stopped rank).
  int size = 0;
  check_mpi(MPI_Comm_size(comm_, &size), "MPI_Comm_size");
  std::vector<MPI_Request> sends;
  const std::int64_t round = ++probe_round;
  const std::int64_t* token = &probe_tokens.emplace_back(round);
  for (int m = 0; m < size; ++m)
    if (m != rank_) {
      sends.emplace_back();
      check_mpi(MPI_Isend(token, 1, MPI_INT64_T, m, kProbeTag, comm_, &sends.back()),
                "MPI_Isend (watchdog probe)");
    }
  std::map<int, Answer> answers;
  const auto t0 = Clock::now();
  const std::size_t expected = sends.size();
  while (answers.size() < expected && seconds_since(t0) < options_.report_s) {
    serve_probes();
    int flag = 0;
    MPI_Status status;
    check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kAnswerTag, comm_, &flag, &status), "MPI_Iprobe");
    if (flag) {
      Answer a;
      check_mpi(MPI_Recv(&a, kAnswerWords, MPI_INT64_T, status.MPI_SOURCE, kAnswerTag, comm_,
                         MPI_STATUS_IGNORE),
                "MPI_Recv (watchdog answer)");
      if (a.token == round) answers[status.MPI_SOURCE] = a;  // else stale: dropped
    }
  }
  // One report per job: a lower rank that waits too reports (its limit
  // passes about now, or passed and it is collecting answers like this one).
  if (may_defer && !options_.on_expiry)
    for (const auto& [m, a] : answers)
      if (m < rank_ && a.waiting != 0) {
        for (MPI_Request& r : sends) MPI_Request_free(&r);
        return false;
      }
  std::string report = fmt::format(
      "summa watchdog: rank {} has waited {:.1f} s (limit {:g} s) in {}; its group has {} "
      "ranks:\n",
      rank_, waited_s, options_.timeout_s, describe(mine), members.size());
  std::vector<int> lagging;
  for (int m : members) {
    if (m == rank_) continue;
    const auto it = answers.find(m);
    if (it == answers.end()) {
      report += fmt::format(
          "  rank {}: NOT ARRIVED, no answer: not waiting in any guarded collective (busy "
          "computing, blocked elsewhere, or dead)\n",
          m);
      lagging.push_back(m);
      continue;
    }
    const Answer& a = it->second;
    Pending theirs;
    theirs.axis = static_cast<int>(a.axis);
    theirs.leader = static_cast<int>(a.leader);
    theirs.kind = static_cast<int>(a.kind);
    theirs.sequence = static_cast<std::uint64_t>(a.sequence);
    theirs.bytes = static_cast<std::uint64_t>(a.bytes);
    theirs.what = a.raw ? "a program's own MPI request" : nullptr;
    // (point to point has no "same call": each message has its own pair)
    const bool same = a.waiting && !a.raw && !point_to_point(mine) && mine.what == nullptr &&
                      theirs.axis == mine.axis && theirs.leader == mine.leader &&
                      theirs.sequence == mine.sequence && theirs.kind == mine.kind;
    if (same) {
      report += fmt::format("  rank {}: arrived (waiting in the same call for {:.1f} s)\n", m,
                            static_cast<double>(a.waited_ms) / 1000);
    } else if (a.waiting && point_to_point(mine)) {
      report += fmt::format(
          "  rank {}: waiting for {:.1f} s in {} (point to point: it waits on a message too)\n", m,
          static_cast<double>(a.waited_ms) / 1000, describe(theirs));
    } else if (a.waiting) {
      report += fmt::format(
          "  rank {}: NOT ARRIVED, waiting in another call for {:.1f} s: {} (the ranks' "
          "collectives are out of step)\n",
          m, static_cast<double>(a.waited_ms) / 1000, describe(theirs));
      lagging.push_back(m);
    } else {
      report += fmt::format("  rank {}: NOT ARRIVED, answered but is not in a collective\n", m);
      lagging.push_back(m);
    }
  }
  const auto listed = [](const std::vector<int>& ranks) {
    std::string list;
    const std::size_t shown = std::min<std::size_t>(ranks.size(), 16);
    for (std::size_t i = 0; i < shown; ++i) list += fmt::format("{}{}", i ? ", " : "", ranks[i]);
    if (ranks.size() > shown) list += fmt::format(" and {} more", ranks.size() - shown);
    return list;
  };
  if (!lagging.empty())
    report += fmt::format("lagging ranks: {}\n", listed(lagging));
  else if (point_to_point(mine))
    report +=
        "every rank of the group answers, waiting on a message: the messages wait on each other "
        "(a schedule that deadlocks) or the transport is stuck\n";
  else
    report += "every rank of the group has arrived: the transport is stuck\n";
  // The ranks that answer nothing, in the group or not: the likely cause
  // (a member waiting in another call waits on one of them).
  std::vector<int> silent, silent_elsewhere;
  for (int m = 0; m < size; ++m) {
    if (m == rank_ || answers.count(m) != 0) continue;
    silent.push_back(m);
    if (std::find(members.begin(), members.end(), m) == members.end())
      silent_elsewhere.push_back(m);
  }
  if (!silent_elsewhere.empty())
    report +=
        fmt::format("outside the group, no answer from rank(s) {}\n", listed(silent_elsewhere));
  if (!silent.empty())
    report += fmt::format(
        "likely cause: rank(s) {}: they answer no probe (stopped, dead, or busy outside any "
        "guarded collective) while the others wait\n",
        listed(silent));
  for (MPI_Request& r : sends) MPI_Request_free(&r);
  if (options_.on_expiry) {
    options_.on_expiry(report);  // report-only: the wait goes on
    return true;
  }
  pending_ = Pending{};
  std::fprintf(stderr, "%s(ranks are those of the watchdog's communicator) aborting the job\n",
               report.c_str());
  std::fflush(stderr);
  MPI_Abort(comm_, 3);
  std::abort();  // MPI_Abort does not return
}

template <class Poll>
void Watchdog::guard(const Pending& pending, const std::vector<int>& members, Poll&& poll) {
  pending_ = pending;
  pending_.active = true;
  const auto t0 = Clock::now();
  wait_began = t0;
  auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(options_.timeout_s));
  bool reported = false, deferred = false;
  for (unsigned spins = 1;; ++spins) {
    if (poll()) break;
    if ((spins & 63U) == 0) {
      serve_probes();
      if (!reported && Clock::now() >= deadline) {
        try {
          if (expire(members, seconds_since(t0), !deferred)) {
            reported = true;
          } else {  // a lower rank reports; if it has not ended the job by then, this one does
            deferred = true;
            deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(options_.limit_s()));
          }
        } catch (...) {
          pending_ = Pending{};
          throw;
        }
      }
    }
  }
  pending_ = Pending{};
}

void Watchdog::wait(MPI_Request& request, MPI_Comm group, const char* what, std::uint64_t bytes) {
  if (!wait_if_covered(request, group, what, bytes))  // off, or a group it does not cover
    check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
}

// What a guarded wait on a request (its kind, sequence number and bytes, of
// a communicator on `axis` whose watchdog ranks are `members`) reports and
// answers.
Watchdog::Pending Watchdog::pending_of(int kind, std::uint64_t sequence, std::uint64_t bytes,
                                       CommAxis axis, const std::vector<int>& members) {
  Pending p;
  p.axis = static_cast<int>(axis);
  p.leader = members.empty() ? 0 : members.front();
  p.kind = kind;
  p.sequence = sequence;
  p.bytes = bytes;
  return p;
}

void Communicator::guarded_wait(Request& r) {
  const Watchdog::Pending p =
      Watchdog::pending_of(r.kind_, r.sequence_, r.bytes_, axis_, watch_members_);
  const std::uintptr_t token = r.token_;
  r = Request{};
  watchdog_->guard(p, watch_members_, [&] { return poll(token); });
}

int Communicator::guarded_wait_any(Request& a, Request& b) {
  int done = -1;
  const Watchdog::Pending p =
      Watchdog::pending_of(a.kind_, a.sequence_, a.bytes_, axis_, watch_members_);
  watchdog_->guard(p, watch_members_, [&] {
    if (poll(a.token_))
      done = 0;
    else if (poll(b.token_))
      done = 1;
    return done >= 0;
  });
  (done == 0 ? a : b) = Request{};
  return done;
}

}  // namespace summa
