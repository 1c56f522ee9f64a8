#pragma once
/// \file engine.hpp
/// SUMMA on a q x q mesh (Optimus Algorithms 1-3):
///
///   Form::AB    C = alpha A  B  + beta C   A m x k, B k x n
///   Form::ABt   C = alpha A  B' + beta C   A m x k, B n x k
///   Form::AtB   C = alpha A' B  + beta C   A k x m, B k x n
///
/// Every matrix is split into q x q equal blocks; rank (i, j) of the mesh holds
/// block (i, j) of A, B and C (its local views). AB broadcasts A panels along
/// mesh rows and B panels along mesh columns; ABt broadcasts B along columns
/// and reduces partial C panels along rows; AtB broadcasts A along rows and
/// reduces partial C along columns. Each of the q outer steps is cut into
/// panels of `panel` columns; with `overlap` the collectives of panel s+1 are
/// in flight (double-buffered) while panel s is multiplied. All temporaries
/// come from the caller's workspace, whose size workspace_bytes() tells in
/// advance; no memory is allocated during a call.
///
/// Shapes are checked before any collective, on every rank: each rank
/// throws summa::Error when its own arguments are wrong (every rank, with the
/// same message, when every rank passes the same sizes). With
/// `consensus_checks`, or on a grid in debug mode (GridOptions::check_calls),
/// the ranks of the mesh also agree on the outcome first, so an error found
/// on one rank only (say a wrongly sized local block) is thrown with the same
/// message on every rank instead of leaving the others in a collective; the
/// same all-reduce compares the form and the global sizes m, n, k across the
/// mesh, so a rank that passes another k is told so on every rank instead of
/// hanging in a broadcast (one latency-bound all-reduce of 72 bytes per call,
/// docs/reliability.md). Off by default: the layers agree their shapes once,
/// when they are built, and a training step makes no such all-reduce.
/// alpha, beta and the options must be the same on every rank.

#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>

#include "summa/backend/backend.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/memory/arena.hpp"

namespace summa {

enum class Form { AB, ABt, AtB };
const char* name_of(Form f);

struct SummaOptions {
  /// Panel width: columns of the broadcast operand per step (AB: of k, ABt:
  /// of n, AtB: of m). 0 means a whole block per step. Need not divide the block.
  index_t panel = 256;
  /// Double-buffer: issue panel s+1's collectives before multiplying panel s.
  bool overlap = true;
  /// With overlap, each panel's local product is cut into this many column
  /// slices and the in-flight collectives are tested between slices. MPI
  /// libraries without an asynchronous progress thread (Open MPI's default)
  /// only advance non-blocking collectives inside MPI calls, so without these
  /// polls a broadcast would make no progress during the GEMM. 1 = no polls.
  int progress_slices = 4;
  /// Agree on shape errors and on the global sizes across the mesh before
  /// communicating (see above), on every call; also honoured by the 2D
  /// layers' per-call checks (SummaEngine::settle). GridOptions::check_calls
  /// turns it on for every engine of the grid. Constructors always agree.
  bool consensus_checks = false;

  friend bool operator==(const SummaOptions&, const SummaOptions&) = default;
};

/// Local block shapes of the three operands on every rank.
struct BlockShapes {
  index_t a_rows, a_cols, b_rows, b_cols, c_rows, c_cols;
};

class SummaEngine {
  template <class T>
  using ConstView = std::type_identity_t<ConstMatrixView<T>>;
  template <class T>
  using Scalar = std::type_identity_t<acc_t<T>>;

 public:
  /// The grid's mesh must be square (rows == cols); depth and data may be
  /// anything: each (data, depth) plane runs its own SUMMA.
  SummaEngine(ProcessGrid& grid, Backend& backend, SummaOptions options = {});

  const SummaOptions& options() const { return options_; }
  /// True when a call agrees its checks over the mesh: consensus_checks or
  /// the grid's GridOptions::check_calls.
  bool agrees_calls() const;
  void set_options(const SummaOptions& o);
  int q() const { return q_; }
  ProcessGrid& grid() const { return *grid_; }
  Backend& backend() const { return *backend_; }

  /// Ends a call's local checks: with consensus_checks (or the grid's
  /// check_calls) the mesh agrees on `error` (every rank throws the lowest
  /// failing rank's message), otherwise this rank throws its own error, if any.
  void settle(const std::optional<std::string>& error) const;

  /// Global m x n x k -> local block shapes; throws when q does not divide them.
  static BlockShapes block_shapes(Form form, index_t m, index_t n, index_t k, int q);

  /// Workspace bytes one multiply() of this size needs on this engine.
  std::size_t workspace_bytes(Form form, index_t m, index_t n, index_t k, DType t) const;
  /// The same, for any q, options and backend (memory planning without a grid).
  static std::size_t workspace_bytes(Form form, index_t m, index_t n, index_t k, DType t, int q,
                                     const SummaOptions& options, const Backend& backend);

  /// T (float, double or bf16) is deduced from C; A and B convert
  /// (MatrixView<T> -> ConstMatrixView<T>). alpha and beta are acc_t<T>
  /// (float for bf16: fp32 accumulation, C rounded once per local product).
  template <class T>
  void multiply(Form form, index_t m, index_t n, index_t k, Scalar<T> alpha, ConstView<T> A,
                ConstView<T> B, Scalar<T> beta, MatrixView<T> C, Workspace& workspace);

  template <class T>
  void ab(index_t m, index_t n, index_t k, Scalar<T> alpha, ConstView<T> A, ConstView<T> B,
          Scalar<T> beta, MatrixView<T> C, Workspace& ws) {
    multiply(Form::AB, m, n, k, alpha, A, B, beta, C, ws);
  }
  template <class T>
  void abt(index_t m, index_t n, index_t k, Scalar<T> alpha, ConstView<T> A, ConstView<T> B,
           Scalar<T> beta, MatrixView<T> C, Workspace& ws) {
    multiply(Form::ABt, m, n, k, alpha, A, B, beta, C, ws);
  }
  template <class T>
  void atb(index_t m, index_t n, index_t k, Scalar<T> alpha, ConstView<T> A, ConstView<T> B,
           Scalar<T> beta, MatrixView<T> C, Workspace& ws) {
    multiply(Form::AtB, m, n, k, alpha, A, B, beta, C, ws);
  }

 private:
  template <class T>
  void run_ab(const BlockShapes& s, acc_t<T> alpha, ConstMatrixView<T> A, ConstMatrixView<T> B,
              acc_t<T> beta, MatrixView<T> C, Workspace& ws);
  template <class T>
  void run_reduce_form(Form form, const BlockShapes& s, acc_t<T> alpha, ConstMatrixView<T> A,
                       ConstMatrixView<T> B, acc_t<T> beta, MatrixView<T> C, Workspace& ws);

  ProcessGrid* grid_;
  Backend* backend_;
  SummaOptions options_;
  int q_;
};

extern template void SummaEngine::multiply<float>(Form, index_t, index_t, index_t, float,
                                                  ConstMatrixView<float>, ConstMatrixView<float>,
                                                  float, MatrixView<float>, Workspace&);
extern template void SummaEngine::multiply<double>(Form, index_t, index_t, index_t, double,
                                                   ConstMatrixView<double>, ConstMatrixView<double>,
                                                   double, MatrixView<double>, Workspace&);
extern template void SummaEngine::multiply<bf16>(Form, index_t, index_t, index_t, float,
                                                 ConstMatrixView<bf16>, ConstMatrixView<bf16>,
                                                 float, MatrixView<bf16>, Workspace&);

}  // namespace summa
