#pragma once
// Flag validators the programs share (CLI11): each error names the value the
// user gave and the range, and no value wraps around or is read in part
// ("1e20" is not 1, "-1" is not 2^64-1).

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <system_error>

#include "summa/build_info.hpp"
#include "summa/core/error.hpp"

namespace summa::flags {

// A validator for an integer flag: a plain decimal integer in [lo, hi]
// (no exponent, no fraction, no wrap-around into an unsigned type).
inline CLI::Validator integer_in(long double lo, long double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const char* b = text.data();
        const char* e = b + text.size();
        bool ok = b != e;
        for (const char* c = b; ok && c != e; ++c)
          ok = (*c >= '0' && *c <= '9') || (c == b && *c == '-' && e - b > 1);
        long double v = 0;
        if (ok) {
          errno = 0;
          v = std::strtold(text.c_str(), nullptr);
          ok = errno == 0;
        }
        if (!ok || v < lo || v > hi) {
          std::ostringstream m;
          m.precision(20);
          m << "'" << text << "' is not an integer in [" << lo << ", " << hi << "]";
          return m.str();
        }
        return {};
      },
      "INT", "integer_in");
}

// A validator for a real flag: finite, in [lo, hi] (in [lo, hi) with
// `below_hi`: an AdamW beta of 1 is refused by the flag, not later by
// OptimizerOptions).
inline CLI::Validator real_in(double lo, double hi, bool below_hi = false) {
  return CLI::Validator(
      [lo, hi, below_hi](std::string& text) -> std::string {
        double v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v < lo ||
            v > hi || (below_hi && v == hi)) {
          std::ostringstream m;  // shortest form: 1e+30, not 1000000000000000019884624838656.0
          m << "'" << text << "' is not a finite number in [" << lo << ", " << hi
            << (below_hi ? ")" : "]");
          return m.str();
        }
        return {};
      },
      "NUMBER", "real_in");
}

// --watchdog: 0 (off) or seconds in [0.1, 1e7] (a shorter limit ends a job
// in its own set-up: was accepted down to 1e-300).
inline CLI::Validator watchdog_seconds() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = -1;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec == std::errc() && end == text.data() + text.size() &&
            (v == 0 || (v >= 0.1 && v <= 1e7)))
          return {};
        return "'" + text + "' is not 0 (off) or a number of seconds in [0.1, 1e+07]";
      },
      "SECONDS", "watchdog_seconds");
}

// --cpu-gemm and --threads (the cpu backend's GEMM library and threads per
// rank; DeviceOptions::cpu_gemm / threads, docs/design.md "CPU GEMM").
inline void add_cpu_options(CLI::App& app, std::string& cpu_gemm, int& threads) {
  app.add_option("--cpu-gemm", cpu_gemm,
                 "cpu: the GEMM library: eigen, openblas, blis or mkl (default: $SUMMA_CPU_GEMM, "
                 "else the configured " SUMMA_CPU_GEMM_DEFAULT
                 "; summa_gemm --compare-libraries says which is fastest here)")
      ->check(CLI::IsMember({"eigen", "openblas", "blis", "mkl"}));
  app.add_option("--threads", threads,
                 "cpu: threads of each rank's GEMMs (the BLAS's thread count; eigen: 1)")
      ->check(integer_in(1, 4096))
      ->capture_default_str();
}

// A positional argument read as integer_in(lo, hi) reads a flag: the value,
// or summa::CollectiveError "<name>: '<text>' is not an integer in [lo, hi]"
// (every rank reads the same command line: the same error everywhere).
inline long long positional_integer(const char* text, const char* name, long double lo,
                                    long double hi) {
  std::string value = text;
  if (std::string error = integer_in(lo, hi)(value); !error.empty())
    throw summa::CollectiveError(std::string(name) + ": " + error);
  return std::stoll(value);
}

// An error every rank has (the same command line, an agreed check):
// printed once, by rank 0, as "<program>: error: <what>".
inline void print_once(const char* program, const std::exception& e) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", program, e.what());
}

// A command line CLI11 refused (every rank parses the same argv): --help and
// --version print on rank 0 and give 0; an error is printed once as
// "<program>: error: <what> (see --help)" and gives 2, as every other
// refusal does (was: CLI11's own text and codes, 105 and others).
inline int parse_exit(const CLI::App& app, const CLI::ParseError& e, const char* program) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (e.get_exit_code() == 0) return rank == 0 ? app.exit(e) : 0;
  if (rank == 0) std::fprintf(stderr, "%s: error: %s (see --help)\n", program, e.what());
  return 2;
}

}  // namespace summa::flags
