#include "summa/summa/engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <optional>

namespace summa {

namespace {

// Drives the panels' requests on both communicators (MPI_Test each): the
// progress calls between GEMM slices.
void progress(Communicator& a, std::array<Request, 2>& a_req, Communicator& b,
              std::array<Request, 2>& b_req, int buffers) {
  for (int k = 0; k < buffers; ++k) {
    a.test(a_req[k]);
    b.test(b_req[k]);
  }
}

// The panel loop: with overlap, step s+1's collective is issued before step
// s's GEMM (two buffers in flight); without, each step issues, then computes.
template <class Issue, class Compute>
void pipeline(index_t steps, bool overlap, Issue& issue, Compute& compute) {
  if (overlap) issue(0);
  for (index_t step = 0; step < steps; ++step) {
    if (!overlap)
      issue(step);
    else if (step + 1 < steps)
      issue(step + 1);
    compute(step);
  }
}

index_t panel_width(index_t panel, index_t dim) {
  return (panel <= 0 || panel > dim) ? dim : panel;
}

// Widths of the panels a block dimension is cut into: the full width and, when
// it does not divide the dimension, the remainder.
std::array<index_t, 2> panel_widths(index_t panel, index_t dim) {
  const index_t w = panel_width(panel, dim);
  return {w, w > 0 ? dim % w : 0};
}

std::size_t elems(index_t r, index_t c, DType t) {
  return Arena::rounded(static_cast<std::size_t>(r * c) * size_of(t));
}

// How a local m x n product is cut for progress polls (see progress_slices):
// along its longer side, never into slices narrower than kMinSlice.
constexpr index_t kMinSlice = 128;
struct SlicePlan {
  bool by_rows;
  index_t width;  ///< rows or columns per slice
};
SlicePlan slice_plan(index_t m, index_t n, int slices) {
  const bool by_rows = m > n;
  const index_t dim = by_rows ? m : n;
  const index_t count = std::max<index_t>(1, std::min<index_t>(slices, dim / kMinSlice));
  return {by_rows, std::max<index_t>(1, (dim + count - 1) / count)};
}

// Largest GEMM scratch over the slices of an m x n x k product.
std::size_t sliced_scratch(const Backend& backend, index_t m, index_t n, index_t k, DType t,
                           int slices) {
  const SlicePlan plan = slice_plan(m, n, slices);
  std::size_t bytes = 0;
  for (index_t w : panel_widths(plan.width, plan.by_rows ? m : n))
    bytes = std::max(bytes, plan.by_rows ? backend.gemm_scratch_bytes(w, n, k, t)
                                         : backend.gemm_scratch_bytes(m, w, k, t));
  return bytes;
}

// C = alpha op(A) op(B) + beta C, cut into slices of C with `poll` called
// between slices to drive the collectives in flight.
template <class T, class Poll>
void sliced_gemm(Backend& backend, Op ta, Op tb, std::type_identity_t<acc_t<T>> alpha,
                 std::type_identity_t<ConstMatrixView<T>> A,
                 std::type_identity_t<ConstMatrixView<T>> B, std::type_identity_t<acc_t<T>> beta,
                 MatrixView<T> C, Scratch scratch, int slices, Poll&& poll) {
  const SlicePlan plan = slice_plan(C.rows, C.cols, slices);
  const index_t dim = plan.by_rows ? C.rows : C.cols;
  for (index_t x0 = 0; x0 < dim; x0 += plan.width) {
    const index_t w = std::min(plan.width, dim - x0);
    if (plan.by_rows) {
      const ConstMatrixView<T> a =
          ta == Op::N ? A.block(x0, 0, w, A.cols) : A.block(0, x0, A.rows, w);
      backend.gemm(ta, tb, alpha, a, B, beta, C.block(x0, 0, w, C.cols), scratch);
    } else {
      const ConstMatrixView<T> b =
          tb == Op::N ? B.block(0, x0, B.rows, w) : B.block(x0, 0, w, B.cols);
      backend.gemm(ta, tb, alpha, A, b, beta, C.block(0, x0, C.rows, w), scratch);
    }
    if (x0 + w < dim) poll();
  }
}

// Before a collective on buffers the backend just wrote: a host-driven
// communicator (MPI) reads them when the call is issued, so the backend's
// queued work must have finished; a stream-ordered one (NCCL, staged MPI)
// orders itself after it, and the host does not wait.
void settle_before(Backend& backend, const Communicator& a, const Communicator& b) {
  if (!a.stream_ordered() || !b.stream_ordered()) backend.synchronize();
}

}  // namespace

SummaEngine::SummaEngine(ProcessGrid& grid, Backend& backend, SummaOptions options)
    : grid_(&grid), backend_(&backend), q_(grid.shape().rows) {
  require(grid.square_mesh(), fmt::format("SUMMA needs a square mesh, grid has rows={} cols={}",
                                          grid.shape().rows, grid.shape().cols));
  set_options(options);
}

void SummaEngine::set_options(const SummaOptions& o) {
  require(o.panel >= 0, fmt::format("SUMMA panel width must be >= 0, got {}", o.panel));
  require(o.progress_slices >= 1,
          fmt::format("SUMMA progress_slices must be >= 1, got {}", o.progress_slices));
  options_ = o;
}

BlockShapes SummaEngine::block_shapes(Form form, index_t m, index_t n, index_t k, int q) {
  require(q > 0,
          [&] { return fmt::format("SUMMA {}: q must be positive, got {}", name_of(form), q); });
  const std::array<std::pair<const char*, index_t>, 3> dims{{{"m", m}, {"n", n}, {"k", k}}};
  for (const auto& [name, v] : dims) {
    require(v >= 0,
            [&] { return fmt::format("SUMMA {}: {}={} is negative", name_of(form), name, v); });
    require(v % q == 0, [&] {
      return fmt::format("SUMMA {}: {}={} not divisible by q={}", name_of(form), name, v, q);
    });
  }
  const index_t mb = m / q, nb = n / q, kb = k / q;
  switch (form) {
    case Form::AB:
      return {mb, kb, kb, nb, mb, nb};
    case Form::ABt:
      return {mb, kb, nb, kb, mb, nb};
    case Form::AtB:
      return {kb, mb, kb, nb, mb, nb};
  }
  return {};
}

std::size_t SummaEngine::workspace_bytes(Form form, index_t m, index_t n, index_t k,
                                         DType t) const {
  return workspace_bytes(form, m, n, k, t, q_, options_, *backend_);
}

std::size_t SummaEngine::workspace_bytes(Form form, index_t m, index_t n, index_t k, DType t, int q,
                                         const SummaOptions& options, const Backend& backend) {
  const BlockShapes s = block_shapes(form, m, n, k, q);
  const index_t mb = s.c_rows, nb = s.c_cols, kb = form == Form::AtB ? s.a_rows : s.a_cols;
  if (q == 1) return Arena::rounded(backend.gemm_scratch_bytes(mb, nb, kb, t));
  const std::size_t buffers = options.overlap ? 2 : 1;
  const int slices = options.overlap ? options.progress_slices : 1;
  // The dimension a form's panels cut (k for AB, n for ABt, m for AtB), its
  // two panel buffers at width w, and the local GEMM of a panel x wide.
  const index_t cut = form == Form::AB ? kb : form == Form::ABt ? nb : mb;
  const index_t w = panel_width(options.panel, cut);
  const std::size_t panels = form == Form::AB    ? elems(mb, w, t) + elems(w, nb, t)
                             : form == Form::ABt ? elems(w, kb, t) + elems(mb, w, t)
                                                 : elems(kb, w, t) + elems(w, nb, t);
  std::size_t scratch = 0;
  for (index_t x : panel_widths(options.panel, cut))
    scratch =
        std::max(scratch, form == Form::AB    ? sliced_scratch(backend, mb, nb, x, t, slices)
                          : form == Form::ABt ? sliced_scratch(backend, mb, x, kb, t, slices)
                                              : sliced_scratch(backend, x, nb, kb, t, slices));
  return buffers * panels + Arena::rounded(scratch);
}

bool SummaEngine::agrees_calls() const {
  return options_.consensus_checks || grid_->check_calls();
}

void SummaEngine::settle(const std::optional<std::string>& error) const {
  if (agrees_calls())
    grid_->agree(CommAxis::mesh, error);
  else if (error)
    throw Error(*error);
}

template <class T>
void SummaEngine::multiply(Form form, index_t m, index_t n, index_t k, Scalar<T> alpha,
                           ConstView<T> A, ConstView<T> B, Scalar<T> beta, MatrixView<T> C,
                           Workspace& ws) {
  // Validate everything locally, then agree across the mesh before any collective.
  std::optional<std::string> error;
  BlockShapes s{};
  std::size_t needed = 0;
  try {
    s = block_shapes(form, m, n, k, q_);
    auto check_block = [&](const char* what, index_t rows, index_t cols, index_t er, index_t ec) {
      require(rows == er && cols == ec, [&] {
        return fmt::format(
            "SUMMA {} (m={} n={} k={} q={}): local {} block is {}x{}, expected {}x{}",
            name_of(form), m, n, k, q_, what, rows, cols, er, ec);
      });
    };
    check_block("A", A.rows, A.cols, s.a_rows, s.a_cols);
    check_block("B", B.rows, B.cols, s.b_rows, s.b_cols);
    check_block("C", C.rows, C.cols, s.c_rows, s.c_cols);
    A.check_layout("SUMMA A");
    B.check_layout("SUMMA B");
    C.check_layout("SUMMA C");
    needed = workspace_bytes(form, m, n, k, dtype_v<T>);
    const std::size_t free_bytes = ws.capacity() - ws.used();
    require(free_bytes >= needed, [&] {
      return fmt::format(
          "SUMMA {} (m={} n={} k={} q={} panel={} overlap={}): workspace '{}' has "
          "{} bytes free, needs {}",
          name_of(form), m, n, k, q_, options_.panel, options_.overlap, ws.name(), free_bytes,
          needed);
    });
  } catch (const Error& e) {
    error = e.what();
  }
  if (agrees_calls()) {
    // The same all-reduce also compares the global sizes: a rank passing
    // another k (or form) gets an error on every rank instead of a hang.
    static constexpr const char* names[] = {"the form (0 AB, 1 ABt, 2 AtB)", "m", "n", "k"};
    const std::array<std::int64_t, 4> sizes{static_cast<std::int64_t>(form), m, n, k};
    // `what` must be the same on every rank: the form is among the values.
    agree_on(grid_->native(CommAxis::mesh), error, sizes, names, "SUMMA multiply");
  } else if (error) {
    throw Error(*error);
  }

  if (m == 0 || n == 0) return;
  if (alpha == acc_t<T>(0) || k == 0) {  // BLAS: A and B are not referenced
    backend_->scale(beta, C);
    return;
  }
  if (q_ == 1) {  // nothing to communicate: one local product
    const Op ta = form == Form::AtB ? Op::T : Op::N;
    const Op tb = form == Form::ABt ? Op::T : Op::N;
    backend_->gemm(ta, tb, alpha, A, B, beta, C, ws.rest());
    return;
  }
  if (form == Form::AB)
    run_ab(s, alpha, A, B, beta, C, ws);
  else
    run_reduce_form(form, s, alpha, A, B, beta, C, ws);
}

// Algorithm 1: C_ij += A_il B_lj; A_il broadcast along mesh row i from column
// l, B_lj along mesh column j from row l, one k-panel of the block at a time.
template <class T>
void SummaEngine::run_ab(const BlockShapes& s, acc_t<T> alpha, ConstMatrixView<T> A,
                         ConstMatrixView<T> B, acc_t<T> beta, MatrixView<T> C, Workspace& ws) {
  const index_t mb = s.c_rows, nb = s.c_cols, kb = s.a_cols;
  const index_t w = panel_width(options_.panel, kb);
  const index_t per_block = (kb + w - 1) / w;
  const index_t steps = q_ * per_block;
  const int buffers = options_.overlap ? 2 : 1;

  ArenaScope scope(ws);
  std::array<T*, 2> a_buf{}, b_buf{};
  for (int b = 0; b < buffers; ++b) {
    a_buf[b] = ws.take<T>(static_cast<std::size_t>(mb * w));
    b_buf[b] = ws.take<T>(static_cast<std::size_t>(w * nb));
  }
  const Scratch scratch = ws.rest();
  Communicator& row = grid_->mesh_row();
  Communicator& col = grid_->mesh_col();
  std::array<Request, 2> a_req, b_req;
  std::array<MatrixView<T>, 2> a_pan, b_pan;

  auto issue = [&](index_t step) {
    const int l = static_cast<int>(step / per_block);
    const index_t k0 = (step % per_block) * w, kw = std::min(w, kb - k0);
    const int slot = static_cast<int>(step % buffers);
    a_pan[slot] = MatrixView<T>::dense(a_buf[slot], mb, kw, A.order);
    b_pan[slot] = MatrixView<T>::dense(b_buf[slot], kw, nb, B.order);
    if (row.rank() == l) backend_->copy(A.block(0, k0, mb, kw), a_pan[slot]);
    if (col.rank() == l) backend_->copy(B.block(k0, 0, kw, nb), b_pan[slot]);
    settle_before(*backend_, row, col);
    a_req[slot] = row.ibroadcast(a_buf[slot], static_cast<std::size_t>(mb * kw), dtype_v<T>, l);
    b_req[slot] = col.ibroadcast(b_buf[slot], static_cast<std::size_t>(kw * nb), dtype_v<T>, l);
  };
  const int slices = options_.overlap ? options_.progress_slices : 1;
  auto poll = [&] { progress(row, a_req, col, b_req, buffers); };
  auto compute = [&](index_t step) {
    const int slot = static_cast<int>(step % buffers);
    row.wait(a_req[slot]);
    col.wait(b_req[slot]);
    sliced_gemm(*backend_, Op::N, Op::N, alpha, a_pan[slot], b_pan[slot],
                step == 0 ? beta : acc_t<T>(1), C, scratch, slices, poll);
  };

  pipeline(steps, options_.overlap, issue, compute);
}

// Algorithms 2 and 3: broadcast one operand's panel, multiply locally into a
// partial C panel, reduce it to the rank that owns that panel of C.
//   ABt: B_lj panel (rows of B = columns of C) broadcast along mesh column j
//        from row l; A_ij B_lj' reduced along mesh row i to column l.
//   AtB: A_il panel (columns of A = rows of C) broadcast along mesh row i
//        from column l; A_il' B_ij reduced along mesh column j to row l.
template <class T>
void SummaEngine::run_reduce_form(Form form, const BlockShapes& s, acc_t<T> alpha,
                                  ConstMatrixView<T> A, ConstMatrixView<T> B, acc_t<T> beta,
                                  MatrixView<T> C, Workspace& ws) {
  const bool abt = form == Form::ABt;
  const index_t mb = s.c_rows, nb = s.c_cols, kb = abt ? s.a_cols : s.a_rows;
  const index_t split = abt ? nb : mb;  // the dimension of C cut into panels
  const index_t w = panel_width(options_.panel, split);
  const index_t per_block = (split + w - 1) / w;
  const index_t steps = q_ * per_block;
  const int buffers = options_.overlap ? 2 : 1;
  Communicator& in = abt ? grid_->mesh_col() : grid_->mesh_row();
  Communicator& out = abt ? grid_->mesh_row() : grid_->mesh_col();
  const ConstMatrixView<T> source = abt ? B : A;  // the broadcast operand

  ArenaScope scope(ws);
  std::array<T*, 2> in_buf{}, part_buf{};
  for (int b = 0; b < buffers; ++b) {
    in_buf[b] = ws.take<T>(static_cast<std::size_t>(w * kb));
    part_buf[b] = ws.take<T>(static_cast<std::size_t>(abt ? mb * w : w * nb));
  }
  const Scratch scratch = ws.rest();
  std::array<Request, 2> in_req, out_req;
  std::array<MatrixView<T>, 2> in_pan, part;
  std::array<index_t, 2> part_step{-1, -1};

  auto geometry = [&](index_t step, int& l, index_t& x0, index_t& xw) {
    l = static_cast<int>(step / per_block);
    x0 = (step % per_block) * w;
    xw = std::min(w, split - x0);
  };
  auto issue = [&](index_t step) {
    int l;
    index_t x0, xw;
    geometry(step, l, x0, xw);
    const int slot = static_cast<int>(step % buffers);
    in_pan[slot] = abt ? MatrixView<T>::dense(in_buf[slot], xw, kb, source.order)
                       : MatrixView<T>::dense(in_buf[slot], kb, xw, source.order);
    if (in.rank() == l)
      backend_->copy(abt ? source.block(x0, 0, xw, kb) : source.block(0, x0, kb, xw), in_pan[slot]);
    settle_before(*backend_, in, in);
    in_req[slot] = in.ibroadcast(in_buf[slot], static_cast<std::size_t>(xw * kb), dtype_v<T>, l);
  };
  // Completes the reduction that last used `slot` and folds it into C on its root.
  auto drain = [&](int slot) {
    if (part_step[slot] < 0) return;
    out.wait(out_req[slot]);
    int l;
    index_t x0, xw;
    geometry(part_step[slot], l, x0, xw);
    if (out.rank() == l)
      backend_->axpby(acc_t<T>(1), part[slot], beta,
                      abt ? C.block(0, x0, mb, xw) : C.block(x0, 0, xw, nb));
    part_step[slot] = -1;
  };
  const int slices = options_.overlap ? options_.progress_slices : 1;
  auto poll = [&] { progress(in, in_req, out, out_req, buffers); };
  auto compute = [&](index_t step) {
    int l;
    index_t x0, xw;
    geometry(step, l, x0, xw);
    const int slot = static_cast<int>(step % buffers);
    in.wait(in_req[slot]);
    drain(slot);  // the partial buffer of step - buffers must be free
    if (abt) {
      part[slot] = MatrixView<T>::dense(part_buf[slot], mb, xw, C.order);
      sliced_gemm(*backend_, Op::N, Op::T, alpha, A, in_pan[slot], acc_t<T>(0), part[slot], scratch,
                  slices, poll);
    } else {
      part[slot] = MatrixView<T>::dense(part_buf[slot], xw, nb, C.order);
      sliced_gemm(*backend_, Op::T, Op::N, alpha, in_pan[slot], B, acc_t<T>(0), part[slot], scratch,
                  slices, poll);
    }
    settle_before(*backend_, out, out);
    out_req[slot] =
        out.ireduce(part_buf[slot], part_buf[slot], static_cast<std::size_t>(xw * (abt ? mb : nb)),
                    dtype_v<T>, ReduceOp::sum, l);
    part_step[slot] = step;
    if (!options_.overlap) drain(slot);
  };

  pipeline(steps, options_.overlap, issue, compute);
  for (int b = 0; b < buffers; ++b) drain(static_cast<int>((steps + b) % buffers));
}

template void SummaEngine::multiply<float>(Form, index_t, index_t, index_t, float,
                                           ConstMatrixView<float>, ConstMatrixView<float>, float,
                                           MatrixView<float>, Workspace&);
template void SummaEngine::multiply<double>(Form, index_t, index_t, index_t, double,
                                            ConstMatrixView<double>, ConstMatrixView<double>,
                                            double, MatrixView<double>, Workspace&);
template void SummaEngine::multiply<bf16>(Form, index_t, index_t, index_t, float,
                                          ConstMatrixView<bf16>, ConstMatrixView<bf16>, float,
                                          MatrixView<bf16>, Workspace&);

const char* name_of(Form f) {
  switch (f) {
    case Form::AB:
      return "AB";
    case Form::ABt:
      return "ABt";
    case Form::AtB:
      return "AtB";
  }
  return "?";
}

}  // namespace summa
