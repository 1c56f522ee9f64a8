// CUDA kernels of CudaBackend (every op but GEMM) and the device optimizer
// updates. Design:
//  - Elementwise ops walk the output in its storage order with a grid-stride
//    loop; when every view shares that order and is 16-byte aligned with a
//    leading dimension that keeps rows aligned, each thread moves one
//    float4 / double2 per view (vectorised path), else one element.
//  - Reductions along a row or a column pick their shape from the storage
//    order: a warp per output when the reduced axis is contiguous (lanes read
//    consecutive elements, warp shuffles combine), otherwise a 32-wide tile
//    of outputs per block with kTileY threads down each (coalesced across
//    outputs, combined in shared memory). Both run in a fixed order, so
//    results never depend on timing.
//  - Scalar reductions to one double (cross-entropy sum, Σx²) run in two
//    passes: per-block partials, then one block sums them in order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels.cuh"
#include "summa/backend/cuda_backend.hpp"
#include "summa/backend/optimizer_math.hpp"
#include "summa/core/error.hpp"

namespace summa::cuda_detail {

void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess)
    throw Error(std::string("CudaBackend: ") + call + " failed: " + cudaGetErrorString(e) + " (" +
                cudaGetErrorName(e) + ")");
}

namespace {

constexpr int kThreads = 256;  // threads per block of 1-D launches
constexpr int kTileY = 16;     // threads down each output in the tiled reduction

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(std::string("CudaBackend: launch of the ") + kernel +
                " kernel failed: " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")");
}

// Blocks for `work` items of `per_block` each, capped (grid-stride loops
// cover the rest) at a few waves of the device.
unsigned grid_for(index_t work, index_t per_block, const Launch& launch) {
  const index_t blocks = (work + per_block - 1) / per_block;
  const index_t cap = static_cast<index_t>(launch.sm_count) * 32;
  return static_cast<unsigned>(std::max<index_t>(1, std::min(blocks, cap)));
}

// ---- Device arithmetic in the element type -----------------------------------

__device__ __forceinline__ float dexp(float x) {
  return expf(x);
}
__device__ __forceinline__ double dexp(double x) {
  return exp(x);
}
__device__ __forceinline__ float dtanh(float x) {
  return tanhf(x);
}
__device__ __forceinline__ double dtanh(double x) {
  return tanh(x);
}
__device__ __forceinline__ float dsqrt(float x) {
  return sqrtf(x);
}
__device__ __forceinline__ double dsqrt(double x) {
  return sqrt(x);
}
__device__ __forceinline__ float dmax(float a, float b) {
  return fmaxf(a, b);
}
__device__ __forceinline__ double dmax(double a, double b) {
  return fmax(a, b);
}

template <class T>
__device__ __forceinline__ T minus_infinity();
template <>
__device__ __forceinline__ float minus_infinity<float>() {
  return -CUDART_INF_F;
}
template <>
__device__ __forceinline__ double minus_infinity<double>() {
  return -CUDART_INF;
}

// ---- Storage <-> arithmetic type ----------------------------------------------
// Loads widen to acc_of<T> (exact for bf16), stores narrow once (bf16: round
// to nearest even); identities for float and double.

__device__ __forceinline__ float widen(float x) {
  return x;
}
__device__ __forceinline__ double widen(double x) {
  return x;
}
__device__ __forceinline__ float widen(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <class T>
__device__ __forceinline__ T narrow(acc_of<T> x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return x;
}

// ---- 16-byte vector moves -----------------------------------------------------

template <class T>
struct Vec16;
template <>
struct Vec16<float> {
  using type = float4;
  static constexpr int n = 4;
};
template <>
struct Vec16<double> {
  using type = double2;
  static constexpr int n = 2;
};
template <>
struct Vec16<__nv_bfloat16> {
  using type = uint4;  // 8 bf16
  static constexpr int n = 8;
};

__device__ __forceinline__ void unpack(float4 v, float (&o)[4]) {
  o[0] = v.x;
  o[1] = v.y;
  o[2] = v.z;
  o[3] = v.w;
}
__device__ __forceinline__ void unpack(double2 v, double (&o)[2]) {
  o[0] = v.x;
  o[1] = v.y;
}
__device__ __forceinline__ void unpack(uint4 v, float (&o)[8]) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    o[2 * i] = f.x;
    o[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ float4 pack(const float (&o)[4]) {
  return make_float4(o[0], o[1], o[2], o[3]);
}
__device__ __forceinline__ double2 pack(const double (&o)[2]) {
  return make_double2(o[0], o[1]);
}
__device__ __forceinline__ uint4 pack(const float (&o)[8]) {
  uint4 v;
  auto* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(o[2 * i], o[2 * i + 1]);  // .x is lower
  return v;
}

// N consecutive elements along the output's contiguous axis from (r, c),
// widened to the arithmetic type. For N > 1 the launcher guaranteed the view
// shares that order and alignment.
template <int N, class T>
__device__ __forceinline__ void load(const DView<T>& v, index_t r, index_t c, acc_of<T> (&out)[N]) {
  using U = std::remove_const_t<T>;
  if constexpr (N == 1) {
    out[0] = widen(v(r, c));
  } else {
    unpack(*reinterpret_cast<const typename Vec16<U>::type*>(&v(r, c)), out);
  }
}
template <int N, class T>
__device__ __forceinline__ void store(const DView<T>& v, index_t r, index_t c,
                                      const acc_of<T> (&in)[N]) {
  if constexpr (N == 1) {
    v(r, c) = narrow<T>(in[0]);
  } else {
    *reinterpret_cast<typename Vec16<T>::type*>(&v(r, c)) = pack(in);
  }
}

// True when `v` can take the vectorised path of an output of order `row_major`.
template <class T>
bool vector_ok(const DView<T>& v, bool row_major) {
  constexpr index_t n = Vec16<std::remove_const_t<T>>::n;
  return v.row_major == row_major && v.ld % n == 0 &&
         reinterpret_cast<std::uintptr_t>(v.data) % 16 == 0;
}

// ---- Elementwise driver ---------------------------------------------------------
// f.apply<N>(r, c, dr, dc) handles the N elements (r + k dr, c + k dc).

template <int N, class F>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(F f, index_t outer, index_t packs, bool row_major) {
  const index_t total = outer * packs;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const index_t o = i / packs;
    const index_t in = (i - o * packs) * N;
    if (row_major)
      f.template apply<N>(o, in, 0, 1);
    else
      f.template apply<N>(in, o, 1, 0);
  }
}

// Runs f over a rows x cols output of the given order; vectorised when
// `vec` (every view passed vector_ok) and the contiguous extent allows it.
template <class T, class F>
void launch_elementwise(const Launch& launch, const F& f, index_t rows, index_t cols,
                        bool row_major, bool vec, const char* kernel) {
  if (rows == 0 || cols == 0) return;
  const index_t outer = row_major ? rows : cols, inner = row_major ? cols : rows;
  constexpr int n = Vec16<T>::n;
  if (vec && inner % n == 0) {
    const index_t packs = inner / n;
    elementwise_kernel<n>
        <<<grid_for(outer * packs, kThreads, launch), kThreads, 0, launch.stream>>>(f, outer, packs,
                                                                                    row_major);
  } else {
    elementwise_kernel<1>
        <<<grid_for(outer * inner, kThreads, launch), kThreads, 0, launch.stream>>>(f, outer, inner,
                                                                                    row_major);
  }
  check_launch(kernel);
}

// f(i) for i in [0, n).
template <class F>
__global__ void __launch_bounds__(kThreads) index_kernel(F f, index_t n) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    f(i);
}

template <class F>
void launch_index(const Launch& launch, const F& f, index_t n, const char* kernel) {
  if (n <= 0) return;
  index_kernel<<<grid_for(n, kThreads, launch), kThreads, 0, launch.stream>>>(f, n);
  check_launch(kernel);
}

// ---- Reductions along rows or columns ------------------------------------------
// A reduction functor has: using Acc; Acc init(); Acc value(r, c);
// Acc combine(Acc, Acc); void finish(kept index, Acc).

template <class A>
struct Two {
  A x, y;
};

__device__ __forceinline__ float shfl_down(float v, int o) {
  return __shfl_down_sync(0xffffffffu, v, o);
}
__device__ __forceinline__ double shfl_down(double v, int o) {
  return __shfl_down_sync(0xffffffffu, v, o);
}
template <class A>
__device__ __forceinline__ Two<A> shfl_down(Two<A> v, int o) {
  return Two<A>{shfl_down(v.x, o), shfl_down(v.y, o)};
}

// A warp per kept index: lanes stride along the (contiguous) reduced axis.
template <class F>
__global__ void __launch_bounds__(kThreads)
    reduce_warp_kernel(F f, index_t kept, index_t len, bool kept_is_row) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const index_t warp = (static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const index_t warps = (static_cast<index_t>(gridDim.x) * blockDim.x) >> 5;
  for (index_t k = warp; k < kept; k += warps) {  // uniform across the warp
    typename F::Acc acc = f.init();
    for (index_t j = lane; j < len; j += 32)
      acc = f.combine(acc, kept_is_row ? f.value(k, j) : f.value(j, k));
    for (int o = 16; o > 0; o >>= 1) acc = f.combine(acc, shfl_down(acc, o));
    if (lane == 0) f.finish(k, acc);
  }
}

// A 32-wide tile of kept indices per block (threadIdx.x, contiguous in
// memory), kTileY threads down the reduced axis of each, combined in order
// through shared memory.
template <class F>
__global__ void __launch_bounds__(32 * kTileY)
    reduce_tile_kernel(F f, index_t kept, index_t len, bool kept_is_row) {
  __shared__ typename F::Acc partial[kTileY][32];
  for (index_t k0 = static_cast<index_t>(blockIdx.x) * 32; k0 < kept;
       k0 += static_cast<index_t>(gridDim.x) * 32) {  // uniform across the block
    const index_t k = k0 + threadIdx.x;
    typename F::Acc acc = f.init();
    if (k < kept)
      for (index_t j = threadIdx.y; j < len; j += kTileY)
        acc = f.combine(acc, kept_is_row ? f.value(k, j) : f.value(j, k));
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && k < kept) {
      for (int y = 1; y < kTileY; ++y) acc = f.combine(acc, partial[y][threadIdx.x]);
      f.finish(k, acc);
    }
    __syncthreads();
  }
}

// Reduces a rows x cols view (`X` decides the kernel shape) to one value per
// row (kept_is_row) or per column.
template <class F, class T>
void launch_reduce(const Launch& launch, const F& f, const DView<T>& X, bool kept_is_row,
                   const char* kernel) {
  const index_t kept = kept_is_row ? X.rows : X.cols, len = kept_is_row ? X.cols : X.rows;
  if (kept == 0) return;
  const bool reduced_contiguous = kept_is_row == X.row_major;
  if (reduced_contiguous) {
    reduce_warp_kernel<<<grid_for(kept * 32, kThreads, launch), kThreads, 0, launch.stream>>>(
        f, kept, len, kept_is_row);
  } else {
    reduce_tile_kernel<<<grid_for(kept, 32, launch), dim3(32, kTileY), 0, launch.stream>>>(
        f, kept, len, kept_is_row);
  }
  check_launch(kernel);
}

// ---- Two-pass reduction of n terms to one double ---------------------------------

__device__ __forceinline__ double block_sum(double v) {
  __shared__ double warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = 0;
  if (warp == 0) {
    const unsigned warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? warp_sums[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  }
  return v;  // valid in thread 0
}

template <class F>
__global__ void __launch_bounds__(kThreads) sum_partials_kernel(F f, index_t n, double* partials) {
  double acc = 0;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc += f(i);
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(kThreads) sum_final_kernel(double* partials, int count) {
  double acc = 0;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[kMaxPartials] = acc;
}

template <class F>
void launch_sum(const Launch& launch, const F& f, index_t n, double* partials, const char* kernel) {
  if (n <= 0) {
    check_cuda(cudaMemsetAsync(partials + kMaxPartials, 0, sizeof(double), launch.stream),
               "cudaMemsetAsync");
    return;
  }
  const unsigned blocks = std::min<unsigned>(grid_for(n, kThreads, launch), kMaxPartials);
  sum_partials_kernel<<<blocks, kThreads, 0, launch.stream>>>(f, n, partials);
  check_launch(kernel);
  sum_final_kernel<<<1, kThreads, 0, launch.stream>>>(partials, static_cast<int>(blocks));
  check_launch(kernel);
}

// ---- Elementwise ops -------------------------------------------------------------
// Each op computes in A = acc_of<T> (fp32 for bf16): loads widen, stores
// round once; per-column parameters (bias, gamma, beta) are T, widened.

template <class T>
struct AxpbyOp {
  using A = acc_of<T>;
  DView<const T> x;
  DView<T> c;
  A alpha, beta;
  template <int N>
  __device__ void apply(index_t r, index_t col, int, int) const {
    A xv[N], out[N];
    load<N>(x, r, col, xv);
    if (beta == A(0)) {
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] = alpha * xv[k];
    } else {
      A cv[N];
      load<N>(c, r, col, cv);
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] = alpha * xv[k] + beta * cv[k];
    }
    store<N>(c, r, col, out);
  }
};

// C = alpha X + beta C for X and C of opposite orders: 32 x 32 tiles through
// shared memory, so both the reads and the writes are coalesced.
template <class T>
__global__ void __launch_bounds__(32 * 8)
    transpose_axpby_kernel(DView<const T> x, DView<T> c, acc_of<T> alpha, acc_of<T> beta) {
  using A = acc_of<T>;
  __shared__ A tile[32][33];  // tile[i][j] = element (r0 + i, c0 + j)
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (index_t r0 = static_cast<index_t>(blockIdx.y) * 32; r0 < c.rows;
       r0 += static_cast<index_t>(gridDim.y) * 32) {
    for (index_t c0 = static_cast<index_t>(blockIdx.x) * 32; c0 < c.cols;
         c0 += static_cast<index_t>(gridDim.x) * 32) {
      if (x.row_major) {  // consecutive threads along a row of X
        for (int i = ty; i < 32; i += 8)
          if (r0 + i < c.rows && c0 + tx < c.cols) tile[i][tx] = widen(x(r0 + i, c0 + tx));
      } else {
        for (int j = ty; j < 32; j += 8)
          if (r0 + tx < c.rows && c0 + j < c.cols) tile[tx][j] = widen(x(r0 + tx, c0 + j));
      }
      __syncthreads();
      if (c.row_major) {
        for (int i = ty; i < 32; i += 8) {
          const index_t r = r0 + i, cc = c0 + tx;
          if (r < c.rows && cc < c.cols)
            c(r, cc) = narrow<T>(beta == A(0) ? alpha * tile[i][tx]
                                              : alpha * tile[i][tx] + beta * widen(c(r, cc)));
        }
      } else {
        for (int j = ty; j < 32; j += 8) {
          const index_t r = r0 + tx, cc = c0 + j;
          if (r < c.rows && cc < c.cols)
            c(r, cc) = narrow<T>(beta == A(0) ? alpha * tile[tx][j]
                                              : alpha * tile[tx][j] + beta * widen(c(r, cc)));
        }
      }
      __syncthreads();
    }
  }
}

template <class T>
struct ScaleOp {
  using A = acc_of<T>;
  DView<T> c;
  A beta;
  template <int N>
  __device__ void apply(index_t r, index_t col, int, int) const {
    A v[N];
    load<N>(c, r, col, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] *= beta;
    store<N>(c, r, col, v);
  }
};

template <class T>
struct AddBiasOp {
  using A = acc_of<T>;
  DView<T> y;
  const T* bias;
  template <int N>
  __device__ void apply(index_t r, index_t c, int, int dc) const {
    A v[N];
    load<N>(y, r, c, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += widen(bias[c + k * dc]);
    store<N>(y, r, c, v);
  }
};

template <class T>
struct LnApplyOp {
  using A = acc_of<T>;
  DView<const T> x;
  const A *mean, *rstd;
  const T *gamma, *beta;
  DView<T> y;
  template <int N>
  __device__ void apply(index_t r, index_t c, int dr, int dc) const {
    A v[N];
    load<N>(x, r, c, v);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const index_t rr = r + k * dr, cc = c + k * dc;
      v[k] = (v[k] - mean[rr]) * rstd[rr] * widen(gamma[cc]) + widen(beta[cc]);
    }
    store<N>(y, r, c, v);
  }
};

template <class T>
struct LnBackwardApplyOp {
  using A = acc_of<T>;
  DView<const T> x, dy;
  const A *mean, *rstd;
  const T* gamma;
  const A *a, *b;
  A h, inv_h;
  DView<T> dx;
  template <int N>
  __device__ void apply(index_t r, index_t c, int dr, int dc) const {
    A xv[N], g[N];
    load<N>(x, r, c, xv);
    load<N>(dy, r, c, g);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const index_t rr = r + k * dr, cc = c + k * dc;
      const A gk = g[k] * widen(gamma[cc]);
      const A xhat = (xv[k] - mean[rr]) * rstd[rr];
      // rstd / h * (h g - a - xhat b), as CpuBackend groups it.
      g[k] = ((gk * h - a[rr]) - xhat * b[rr]) * rstd[rr] * inv_h;
    }
    store<N>(dx, r, c, g);
  }
};

constexpr double kGeluC = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

template <class T>
struct GeluForwardOp {
  using A = acc_of<T>;
  DView<const T> x;
  DView<T> y;
  template <int N>
  __device__ void apply(index_t r, index_t c, int, int) const {
    A v[N];
    load<N>(x, r, c, v);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const A xv = v[k];
      const A t = dtanh(A(kGeluC) * (xv + A(kGeluA) * xv * xv * xv));
      v[k] = A(0.5) * xv * (A(1) + t);
    }
    store<N>(y, r, c, v);
  }
};

template <class T>
struct GeluBackwardOp {
  using A = acc_of<T>;
  DView<const T> x, dy;
  DView<T> dx;
  template <int N>
  __device__ void apply(index_t r, index_t c, int, int) const {
    A xv[N], g[N];
    load<N>(x, r, c, xv);
    load<N>(dy, r, c, g);  // read before dX (may be dY) is written
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const A v = xv[k];
      const A t = dtanh(A(kGeluC) * (v + A(kGeluA) * v * v * v));
      const A d = A(0.5) * (A(1) + t) +
                  A(0.5) * v * (A(1) - t * t) * A(kGeluC) * (A(1) + A(3.0 * kGeluA) * v * v);
      g[k] *= d;
    }
    store<N>(dx, r, c, g);
  }
};

// Local column of global id `id` in a block of `count` starting at `first`,
// or -1 when not local.
__device__ __forceinline__ index_t local_index(std::int32_t id, index_t first, index_t count) {
  const index_t i = static_cast<index_t>(id) - first;
  return i >= 0 && i < count ? i : index_t(-1);
}

template <class T>
struct CrossEntropyGradOp {
  using A = acc_of<T>;
  DView<T> z;
  const A *max, *sum;
  const std::int32_t* targets;
  index_t col0;
  A scale;
  template <int N>
  __device__ void apply(index_t r, index_t c, int dr, int dc) const {
    A v[N];
    load<N>(z, r, c, v);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const index_t rr = r + k * dr, cc = c + k * dc;
      const A p = dexp(v[k] - max[rr]) / sum[rr];
      const A hit = cc + col0 == static_cast<index_t>(targets[rr]) ? A(1) : A(0);
      v[k] = scale * (p - hit);
    }
    store<N>(z, r, c, v);
  }
};

// Vectorised only when out and table are row-major (a row of the table is
// then contiguous next to the output row).
template <class T>
struct GatherRowsOp {
  using A = acc_of<T>;
  const std::int32_t* ids;
  index_t row0;
  DView<const T> table;
  bool accumulate;
  DView<T> out;
  template <int N>
  __device__ void apply(index_t r, index_t c, int, int) const {
    // N > 1 only for row-major views: the N elements then share row r.
    A v[N];
    const index_t t = local_index(ids[r], row0, table.rows);
    if (t >= 0) {
      load<N>(table, t, c, v);
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = A(0);
    }
    if (accumulate) {
      A o[N];
      load<N>(out, r, c, o);
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] += o[k];
    }
    store<N>(out, r, c, v);
  }
};

// Deterministic scatter-add (the CPU's order): table(t, c) += src(r, c) for
// r = 0, 1, ... in row order, each addition widened to acc_of<T> and rounded
// back to T, exactly like CpuBackend. No atomics: the (t, c) element has one
// owner thread, the one for column c and bucket t % buckets, which walks every
// row of src in order and adds the rows whose id falls in its bucket. So the
// result is the same bits on every run and every replica (replicated
// embedding gradients stay identical across ranks), and for float and double
// the same bits as the CPU. The ids travel through shared memory in chunks
// (one broadcast read per warp and row); buckets multiply the parallelism
// past the column count (a block is 32 columns x kScatterBucketsPerBlock
// buckets).
constexpr int kScatterChunk = 2048;
constexpr int kScatterBucketsPerBlock = 8;

template <class T>
__global__ void scatter_add_rows_kernel(const std::int32_t* ids, index_t row0, DView<const T> src,
                                        DView<T> table, int buckets) {
  using A = acc_of<T>;
  __shared__ index_t local[kScatterChunk];
  const index_t c = static_cast<index_t>(blockIdx.x) * 32 + threadIdx.x;
  const int bucket = static_cast<int>(blockIdx.y) * kScatterBucketsPerBlock + threadIdx.y;
  const int tid = threadIdx.y * 32 + threadIdx.x;
  const int threads = 32 * kScatterBucketsPerBlock;
  const bool active = c < src.cols && bucket < buckets;
  for (index_t base = 0; base < src.rows; base += kScatterChunk) {
    const index_t count = src.rows - base < kScatterChunk ? src.rows - base : kScatterChunk;
    __syncthreads();  // the previous chunk is read by everyone
    for (index_t i = tid; i < count; i += threads)
      local[i] = local_index(ids[base + i], row0, table.rows);
    __syncthreads();
    if (!active) continue;
    for (index_t i = 0; i < count; ++i) {
      const index_t t = local[i];
      if (t < 0 || t % buckets != bucket) continue;
      T& out = table(t, c);
      out = narrow<T>(widen(out) + widen(src(base + i, c)));
    }
  }
}

// ---- Reduction functors -------------------------------------------------------------
// Sums accumulate in acc_of<T>; bf16 outputs (column sums, dgamma, dbeta)
// are rounded once from the fp32 total.

template <class T>
struct ColumnSumsOp {
  using Acc = acc_of<T>;
  DView<const T> x;
  Acc beta;
  T* out;
  __device__ Acc init() const { return Acc(0); }
  __device__ Acc value(index_t r, index_t c) const { return widen(x(r, c)); }
  __device__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ void finish(index_t c, Acc s) const {
    out[c] = narrow<T>(beta == Acc(0) ? s : beta * widen(out[c]) + s);
  }
};

template <class T>
struct LnPartialSumsOp {
  using Acc = acc_of<T>;
  DView<const T> x;
  const Acc* center;
  Acc* out;
  __device__ Acc init() const { return Acc(0); }
  __device__ Acc value(index_t r, index_t c) const {
    if (center == nullptr) return widen(x(r, c));
    const Acc d = widen(x(r, c)) - center[r];
    return d * d;
  }
  __device__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ void finish(index_t r, Acc s) const { out[r] = s; }
};

template <class T>
struct LnBackwardPartialsOp {
  using A = acc_of<T>;
  using Acc = Two<A>;
  DView<const T> x, dy;
  const A *mean, *rstd;
  const T* gamma;
  A *a, *b;
  __device__ Acc init() const { return Acc{A(0), A(0)}; }
  __device__ Acc value(index_t r, index_t c) const {
    const A g = widen(dy(r, c)) * widen(gamma[c]);
    const A xhat = (widen(x(r, c)) - mean[r]) * rstd[r];
    return Acc{g, g * xhat};
  }
  __device__ Acc combine(Acc p, Acc q) const { return Acc{p.x + q.x, p.y + q.y}; }
  __device__ void finish(index_t r, Acc s) const {
    a[r] = s.x;
    b[r] = s.y;
  }
};

template <class T>
struct LnParamPartialsOp {
  using A = acc_of<T>;
  using Acc = Two<A>;
  DView<const T> x, dy;
  const A *mean, *rstd;
  T *dgamma, *dbeta;
  __device__ Acc init() const { return Acc{A(0), A(0)}; }
  __device__ Acc value(index_t r, index_t c) const {
    const A d = widen(dy(r, c));
    return Acc{d * ((widen(x(r, c)) - mean[r]) * rstd[r]), d};
  }
  __device__ Acc combine(Acc p, Acc q) const { return Acc{p.x + q.x, p.y + q.y}; }
  __device__ void finish(index_t c, Acc s) const {
    dgamma[c] = narrow<T>(s.x);
    dbeta[c] = narrow<T>(s.y);
  }
};

template <class T>
struct RowMaxOp {
  using Acc = acc_of<T>;
  DView<const T> z;
  Acc* out;
  __device__ Acc init() const { return minus_infinity<Acc>(); }
  __device__ Acc value(index_t r, index_t c) const { return widen(z(r, c)); }
  __device__ Acc combine(Acc a, Acc b) const { return dmax(a, b); }
  __device__ void finish(index_t r, Acc m) const { out[r] = m; }
};

// In double, like CpuBackend (a vocabulary row holds tens of thousands of terms).
template <class T>
struct RowSumExpOp {
  using Acc = double;
  DView<const T> z;
  const acc_of<T>* max;
  acc_of<T>* out;
  __device__ Acc init() const { return 0.0; }
  __device__ Acc value(index_t r, index_t c) const {
    return exp(static_cast<double>(widen(z(r, c))) - static_cast<double>(max[r]));
  }
  __device__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ void finish(index_t r, Acc s) const { out[r] = static_cast<acc_of<T>>(s); }
};

// ---- Causal softmax: W lanes per row (32: a warp, 1: a thread) ---------------------

template <int W, class A>
__device__ __forceinline__ A group_sum(A v) {
  if constexpr (W > 1)
    for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int W, class A>
__device__ __forceinline__ A group_max(A v) {
  if constexpr (W > 1)
    for (int o = W / 2; o > 0; o >>= 1) v = dmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <int W, class T>
__global__ void __launch_bounds__(kThreads)
    softmax_causal_kernel(DView<const T> s, acc_of<T> scale, DView<T> p) {
  using A = acc_of<T>;
  const index_t gid = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const index_t lane = W == 1 ? 0 : gid % W;
  const index_t groups = static_cast<index_t>(gridDim.x) * blockDim.x / W;
  // the causal window aligned at the bottom right (Backend::softmax_causal)
  const index_t shift = p.cols > p.rows ? p.cols - p.rows : 0;
  for (index_t r = gid / W; r < p.rows; r += groups) {  // uniform across a group
    const index_t end = r + 1 + shift < p.cols ? r + 1 + shift : p.cols;
    // Both reading passes finish (the group reductions synchronise the
    // lanes) before any lane writes the row, so P may be S.
    A m = minus_infinity<A>();
    for (index_t c = lane; c < end; c += W) m = dmax(m, scale * widen(s(r, c)));
    m = group_max<W>(m);
    A sum = 0;
    for (index_t c = lane; c < end; c += W) sum += dexp(scale * widen(s(r, c)) - m);
    const A inv = A(1) / group_sum<W>(sum);
    for (index_t c = lane; c < p.cols; c += W)
      p(r, c) = narrow<T>(c < end ? dexp(scale * widen(s(r, c)) - m) * inv : A(0));
  }
}

template <int W, class T>
__global__ void __launch_bounds__(kThreads)
    softmax_causal_backward_kernel(DView<const T> p, DView<const T> dp, acc_of<T> scale,
                                   DView<T> ds) {
  using A = acc_of<T>;
  const index_t gid = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const index_t lane = W == 1 ? 0 : gid % W;
  const index_t groups = static_cast<index_t>(gridDim.x) * blockDim.x / W;
  const index_t shift = ds.cols > ds.rows ? ds.cols - ds.rows : 0;
  for (index_t r = gid / W; r < ds.rows; r += groups) {
    const index_t end = r + 1 + shift < ds.cols ? r + 1 + shift : ds.cols;
    A dot = 0;
    for (index_t c = lane; c < end; c += W) dot += widen(dp(r, c)) * widen(p(r, c));
    dot = group_sum<W>(dot);
    for (index_t c = lane; c < ds.cols; c += W) {
      if (c < end) {
        const A pv = widen(p(r, c)),
                dpv = widen(dp(r, c));  // read before dS (may be dP) is written
        ds(r, c) = narrow<T>(scale * pv * (dpv - dot));
      } else {
        ds(r, c) = narrow<T>(A(0));
      }
    }
  }
}

// Rows of a row-major S: a warp each; column-major: a thread each (threads
// of a warp then read consecutive rows of a column).
template <class T, class KernelWarp, class KernelThread, class... Args>
void launch_rows(const Launch& launch, bool row_major, index_t rows, KernelWarp warp_kernel,
                 KernelThread thread_kernel, const char* kernel, Args... args) {
  if (rows == 0) return;
  if (row_major)
    warp_kernel<<<grid_for(rows * 32, kThreads, launch), kThreads, 0, launch.stream>>>(args...);
  else
    thread_kernel<<<grid_for(rows, kThreads, launch), kThreads, 0, launch.stream>>>(args...);
  check_launch(kernel);
}

}  // namespace

// ---- Launchers -------------------------------------------------------------------------

template <class T>
void axpby(const Launch& launch, acc_of<T> alpha, DView<const T> X, acc_of<T> beta, DView<T> C) {
  if (C.rows == 0 || C.cols == 0) return;
  if (X.row_major != C.row_major) {
    const index_t tiles_r = (C.rows + 31) / 32, tiles_c = (C.cols + 31) / 32;
    const index_t cap_x = static_cast<index_t>(launch.sm_count) * 8;
    const dim3 grid(static_cast<unsigned>(std::min<index_t>(tiles_c, cap_x)),
                    static_cast<unsigned>(std::min<index_t>(tiles_r, 65535)));
    transpose_axpby_kernel<<<grid, dim3(32, 8), 0, launch.stream>>>(X, C, alpha, beta);
    check_launch("transpose");
    return;
  }
  const bool vec = vector_ok(X, C.row_major) && vector_ok(C, C.row_major);
  launch_elementwise<T>(launch, AxpbyOp<T>{X, C, alpha, beta}, C.rows, C.cols, C.row_major, vec,
                        "axpby");
}

template <class T>
void scale(const Launch& launch, acc_of<T> beta, DView<T> C) {
  launch_elementwise<T>(launch, ScaleOp<T>{C, beta}, C.rows, C.cols, C.row_major,
                        vector_ok(C, C.row_major), "scale");
}

template <class T>
void add_bias(const Launch& launch, DView<T> Y, const T* bias) {
  launch_elementwise<T>(launch, AddBiasOp<T>{Y, bias}, Y.rows, Y.cols, Y.row_major,
                        vector_ok(Y, Y.row_major), "add_bias");
}

template <class T>
void column_sums(const Launch& launch, DView<const T> X, acc_of<T> beta, T* out) {
  launch_reduce(launch, ColumnSumsOp<T>{X, beta, out}, X, false, "column_sums");
}

template <class T>
void layernorm_partial_sums(const Launch& launch, DView<const T> X, const acc_of<T>* center,
                            acc_of<T>* out) {
  launch_reduce(launch, LnPartialSumsOp<T>{X, center, out}, X, true, "layernorm_partial_sums");
}

template <class T>
struct LnMeanOp {
  const T* sums;
  T* mean;
  T h;
  __device__ void operator()(index_t r) const { mean[r] = sums[r] / h; }
};
template <class T>
struct LnRstdOp {
  const T* squares;
  T* rstd;
  T h, eps;
  __device__ void operator()(index_t r) const { rstd[r] = T(1) / dsqrt(squares[r] / h + eps); }
};

template <class T>
void layernorm_mean(const Launch& launch, index_t n, index_t h, const T* sums, T* mean) {
  launch_index(launch, LnMeanOp<T>{sums, mean, static_cast<T>(h)}, n, "layernorm_mean");
}

template <class T>
void layernorm_rstd(const Launch& launch, index_t n, index_t h, double eps, const T* squares,
                    T* rstd) {
  launch_index(launch, LnRstdOp<T>{squares, rstd, static_cast<T>(h), static_cast<T>(eps)}, n,
               "layernorm_rstd");
}

template <class T>
void layernorm_apply(const Launch& launch, DView<const T> X, const acc_of<T>* mean,
                     const acc_of<T>* rstd, const T* gamma, const T* beta, DView<T> Y) {
  const bool vec = vector_ok(X, Y.row_major) && vector_ok(Y, Y.row_major);
  launch_elementwise<T>(launch, LnApplyOp<T>{X, mean, rstd, gamma, beta, Y}, Y.rows, Y.cols,
                        Y.row_major, vec, "layernorm_apply");
}

template <class T>
void layernorm_backward_partials(const Launch& launch, DView<const T> X, DView<const T> dY,
                                 const acc_of<T>* mean, const acc_of<T>* rstd, const T* gamma,
                                 acc_of<T>* a, acc_of<T>* b) {
  launch_reduce(launch, LnBackwardPartialsOp<T>{X, dY, mean, rstd, gamma, a, b}, X, true,
                "layernorm_backward_partials");
}

template <class T>
void layernorm_backward_apply(const Launch& launch, DView<const T> X, DView<const T> dY,
                              const acc_of<T>* mean, const acc_of<T>* rstd, const T* gamma,
                              const acc_of<T>* a, const acc_of<T>* b, index_t h, DView<T> dX) {
  using A = acc_of<T>;
  const A hh = static_cast<A>(h);
  const bool vec =
      vector_ok(X, dX.row_major) && vector_ok(dY, dX.row_major) && vector_ok(dX, dX.row_major);
  launch_elementwise<T>(launch,
                        LnBackwardApplyOp<T>{X, dY, mean, rstd, gamma, a, b, hh, A(1) / hh, dX},
                        dX.rows, dX.cols, dX.row_major, vec, "layernorm_backward_apply");
}

template <class T>
void layernorm_param_partials(const Launch& launch, DView<const T> X, DView<const T> dY,
                              const acc_of<T>* mean, const acc_of<T>* rstd, T* dgamma, T* dbeta) {
  launch_reduce(launch, LnParamPartialsOp<T>{X, dY, mean, rstd, dgamma, dbeta}, X, false,
                "layernorm_param_partials");
}

template <class T>
void gelu_forward(const Launch& launch, DView<const T> X, DView<T> Y) {
  const bool vec = vector_ok(X, Y.row_major) && vector_ok(Y, Y.row_major);
  launch_elementwise<T>(launch, GeluForwardOp<T>{X, Y}, Y.rows, Y.cols, Y.row_major, vec,
                        "gelu_forward");
}

template <class T>
void gelu_backward(const Launch& launch, DView<const T> X, DView<const T> dY, DView<T> dX) {
  const bool vec =
      vector_ok(X, dX.row_major) && vector_ok(dY, dX.row_major) && vector_ok(dX, dX.row_major);
  launch_elementwise<T>(launch, GeluBackwardOp<T>{X, dY, dX}, dX.rows, dX.cols, dX.row_major, vec,
                        "gelu_backward");
}

template <class T>
void softmax_causal(const Launch& launch, DView<const T> S, double scale, DView<T> P) {
  launch_rows<T>(launch, S.row_major, P.rows, softmax_causal_kernel<32, T>,
                 softmax_causal_kernel<1, T>, "softmax_causal", S, static_cast<acc_of<T>>(scale),
                 P);
}

template <class T>
void softmax_causal_backward(const Launch& launch, DView<const T> P, DView<const T> dP,
                             double scale, DView<T> dS) {
  launch_rows<T>(launch, P.row_major, dS.rows, softmax_causal_backward_kernel<32, T>,
                 softmax_causal_backward_kernel<1, T>, "softmax_causal_backward", P, dP,
                 static_cast<acc_of<T>>(scale), dS);
}

template <class T>
void row_max(const Launch& launch, DView<const T> Z, acc_of<T>* out) {
  launch_reduce(launch, RowMaxOp<T>{Z, out}, Z, true, "row_max");
}

template <class T>
void row_sum_exp(const Launch& launch, DView<const T> Z, const acc_of<T>* max, acc_of<T>* out) {
  launch_reduce(launch, RowSumExpOp<T>{Z, max, out}, Z, true, "row_sum_exp");
}

template <class T>
struct PickTargetsOp {
  DView<const T> z;
  const std::int32_t* targets;
  index_t col0;
  acc_of<T>* out;
  __device__ void operator()(index_t r) const {
    const index_t c = local_index(targets[r], col0, z.cols);
    out[r] = c >= 0 ? widen(z(r, c)) : acc_of<T>(0);
  }
};

template <class T>
void pick_targets(const Launch& launch, DView<const T> Z, const std::int32_t* targets, index_t col0,
                  acc_of<T>* out) {
  launch_index(launch, PickTargetsOp<T>{Z, targets, col0, out}, Z.rows, "pick_targets");
}

template <class T>
struct CrossEntropyTermOp {
  const T *max, *sum, *picked;
  __device__ double operator()(index_t r) const {
    return log(static_cast<double>(sum[r])) + static_cast<double>(max[r]) -
           static_cast<double>(picked[r]);
  }
};

template <class T>
void cross_entropy_sum(const Launch& launch, index_t n, const T* max, const T* sum, const T* picked,
                       double* partials) {
  launch_sum(launch, CrossEntropyTermOp<T>{max, sum, picked}, n, partials, "cross_entropy_sum");
}

template <class T>
void cross_entropy_grad(const Launch& launch, DView<T> Z, const acc_of<T>* max,
                        const acc_of<T>* sum, const std::int32_t* targets, index_t col0,
                        double scale) {
  launch_elementwise<T>(
      launch, CrossEntropyGradOp<T>{Z, max, sum, targets, col0, static_cast<acc_of<T>>(scale)},
      Z.rows, Z.cols, Z.row_major, vector_ok(Z, Z.row_major), "cross_entropy_grad");
}

template <class T>
void gather_rows(const Launch& launch, const std::int32_t* ids, index_t row0, DView<const T> table,
                 bool accumulate, DView<T> out) {
  const bool vec = out.row_major && vector_ok(table, true) && vector_ok(out, true);
  launch_elementwise<T>(launch, GatherRowsOp<T>{ids, row0, table, accumulate, out}, out.rows,
                        out.cols, out.row_major, vec, "gather_rows");
}

template <class T>
void scatter_add_rows(const Launch& launch, const std::int32_t* ids, index_t row0,
                      DView<const T> src, DView<T> table) {
  if (src.rows == 0 || src.cols == 0) return;
  // Enough threads to fill the GPU (about 16 per SM-lane group), never more
  // buckets than table rows: each scans every id, so more costs more scanning.
  const index_t col_blocks = (src.cols + 31) / 32;
  const index_t want =
      (static_cast<index_t>(launch.sm_count) * 2048 + 32 * col_blocks - 1) / (32 * col_blocks);
  index_t buckets = want < 1 ? 1 : (want > 64 ? 64 : want);
  if (buckets > table.rows) buckets = table.rows < 1 ? 1 : table.rows;
  const dim3 grid(
      static_cast<unsigned>(col_blocks),
      static_cast<unsigned>((buckets + kScatterBucketsPerBlock - 1) / kScatterBucketsPerBlock));
  const dim3 block(32, kScatterBucketsPerBlock);
  scatter_add_rows_kernel<T>
      <<<grid, block, 0, launch.stream>>>(ids, row0, src, table, static_cast<int>(buckets));
  check_launch("scatter_add_rows");
}

template <class T>
struct SquareOp {
  const T* x;
  __device__ double operator()(index_t i) const {
    const double v = static_cast<double>(widen(x[i]));
    return v * v;
  }
};

// Term i of a row-major rows x cols block with leading dimension ld.
template <class T>
struct StridedSquareOp {
  const T* x;
  index_t cols, ld;
  __device__ double operator()(index_t i) const {
    const double v = static_cast<double>(widen(x[(i / cols) * ld + i % cols]));
    return v * v;
  }
};

template <class T>
void sum_of_squares(const Launch& launch, const T* x, index_t rows, index_t cols, index_t ld,
                    double* partials) {
  if (ld == cols || rows <= 1)
    launch_sum(launch, SquareOp<T>{x}, rows * cols, partials, "sum_of_squares");
  else
    launch_sum(launch, StridedSquareOp<T>{x, cols, ld}, rows * cols, partials, "sum_of_squares");
}

template <class T>
struct ScaleInPlaceOp {
  T* x;
  acc_of<T> factor;
  __device__ void operator()(index_t i) const { x[i] = narrow<T>(widen(x[i]) * factor); }
};

template <class T>
void scale_in_place(const Launch& launch, T* x, index_t n, double factor) {
  launch_index(launch, ScaleInPlaceOp<T>{x, static_cast<acc_of<T>>(factor)}, n, "scale_in_place");
}

template <class S, class D>
struct ConvertOp {
  DView<const S> src;
  DView<D> dst;
  template <int N>  // launched with N == 1 only
  __device__ void apply(index_t r, index_t c, int, int) const {
    dst(r, c) = narrow<D>(static_cast<acc_of<D>>(widen(src(r, c))));
  }
};

template <class S, class D>
void convert(const Launch& launch, DView<const S> src, DView<D> dst) {
  launch_elementwise<D>(launch, ConvertOp<S, D>{src, dst}, dst.rows, dst.cols, dst.row_major, false,
                        "convert");
}
template void convert<float, __nv_bfloat16>(const Launch&, DView<const float>,
                                            DView<__nv_bfloat16>);
template void convert<__nv_bfloat16, float>(const Launch&, DView<const __nv_bfloat16>,
                                            DView<float>);

// ---- bf16 optimizer updates with fp32 master weights ------------------------------------

__global__ void __launch_bounds__(kThreads)
    adamw_bf16_kernel(__nv_bfloat16* param, const __nv_bfloat16* grad, float* exp_avg,
                      float* exp_avg_sq, float* master, index_t n, float decay, float beta1,
                      float one_minus_beta1, float beta2, float one_minus_beta2, float eps,
                      float step_size, float bias_correction2_sqrt) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float g = __bfloat162float(grad[i]);
    const float m = beta1 * exp_avg[i] + one_minus_beta1 * g;
    const float v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = sqrtf(v) / bias_correction2_sqrt + eps;
    const float p = master[i] * decay - step_size * m / denom;
    master[i] = p;
    param[i] = __float2bfloat16_rn(p);
  }
}

__global__ void __launch_bounds__(kThreads)
    sgd_bf16_kernel(__nv_bfloat16* param, const __nv_bfloat16* grad, float* momentum_buffer,
                    float* master, index_t n, float lr, float weight_decay, float momentum,
                    bool nesterov) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float p = master[i];
    const float d = __bfloat162float(grad[i]) + weight_decay * p;
    const float b = momentum * momentum_buffer[i] + d;
    momentum_buffer[i] = b;
    const float updated = p - lr * (nesterov ? d + momentum * b : b);
    master[i] = updated;
    param[i] = __float2bfloat16_rn(updated);
  }
}

void adamw_update_bf16(const Launch& launch, __nv_bfloat16* param, const __nv_bfloat16* grad,
                       float* exp_avg, float* exp_avg_sq, float* master, index_t n, float decay,
                       float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                       float eps, float step_size, float bias_correction2_sqrt) {
  if (n <= 0) return;
  adamw_bf16_kernel<<<grid_for(n, kThreads, launch), kThreads, 0, launch.stream>>>(
      param, grad, exp_avg, exp_avg_sq, master, n, decay, beta1, one_minus_beta1, beta2,
      one_minus_beta2, eps, step_size, bias_correction2_sqrt);
  check_launch("adamw_update (bf16)");
}

void sgd_update_bf16(const Launch& launch, __nv_bfloat16* param, const __nv_bfloat16* grad,
                     float* momentum_buffer, float* master, index_t n, float lr, float weight_decay,
                     float momentum, bool nesterov) {
  if (n <= 0) return;
  sgd_bf16_kernel<<<grid_for(n, kThreads, launch), kThreads, 0, launch.stream>>>(
      param, grad, momentum_buffer, master, n, lr, weight_decay, momentum, nesterov);
  check_launch("sgd_update (bf16)");
}

// Every element type T (float, double, __nv_bfloat16; A = acc_of<T>).
#define SUMMA_CUDA_INSTANTIATE(T)                                                                  \
  template void axpby<T>(const Launch&, acc_of<T>, DView<const T>, acc_of<T>, DView<T>);           \
  template void scale<T>(const Launch&, acc_of<T>, DView<T>);                                      \
  template void add_bias<T>(const Launch&, DView<T>, const T*);                                    \
  template void column_sums<T>(const Launch&, DView<const T>, acc_of<T>, T*);                      \
  template void layernorm_partial_sums<T>(const Launch&, DView<const T>, const acc_of<T>*,         \
                                          acc_of<T>*);                                             \
  template void layernorm_apply<T>(const Launch&, DView<const T>, const acc_of<T>*,                \
                                   const acc_of<T>*, const T*, const T*, DView<T>);                \
  template void layernorm_backward_partials<T>(const Launch&, DView<const T>, DView<const T>,      \
                                               const acc_of<T>*, const acc_of<T>*, const T*,       \
                                               acc_of<T>*, acc_of<T>*);                            \
  template void layernorm_backward_apply<T>(                                                       \
      const Launch&, DView<const T>, DView<const T>, const acc_of<T>*, const acc_of<T>*, const T*, \
      const acc_of<T>*, const acc_of<T>*, index_t, DView<T>);                                      \
  template void layernorm_param_partials<T>(const Launch&, DView<const T>, DView<const T>,         \
                                            const acc_of<T>*, const acc_of<T>*, T*, T*);           \
  template void gelu_forward<T>(const Launch&, DView<const T>, DView<T>);                          \
  template void gelu_backward<T>(const Launch&, DView<const T>, DView<const T>, DView<T>);         \
  template void softmax_causal<T>(const Launch&, DView<const T>, double, DView<T>);                \
  template void softmax_causal_backward<T>(const Launch&, DView<const T>, DView<const T>, double,  \
                                           DView<T>);                                              \
  template void row_max<T>(const Launch&, DView<const T>, acc_of<T>*);                             \
  template void row_sum_exp<T>(const Launch&, DView<const T>, const acc_of<T>*, acc_of<T>*);       \
  template void pick_targets<T>(const Launch&, DView<const T>, const std::int32_t*, index_t,       \
                                acc_of<T>*);                                                       \
  template void cross_entropy_grad<T>(const Launch&, DView<T>, const acc_of<T>*, const acc_of<T>*, \
                                      const std::int32_t*, index_t, double);                       \
  template void gather_rows<T>(const Launch&, const std::int32_t*, index_t, DView<const T>, bool,  \
                               DView<T>);                                                          \
  template void scatter_add_rows<T>(const Launch&, const std::int32_t*, index_t, DView<const T>,   \
                                    DView<T>);                                                     \
  template void sum_of_squares<T>(const Launch&, const T*, index_t, index_t, index_t, double*);    \
  template void scale_in_place<T>(const Launch&, T*, index_t, double);

// Statistics-only kernels: float and double.
#define SUMMA_CUDA_INSTANTIATE_STATS(T)                                                \
  template void layernorm_mean(const Launch&, index_t, index_t, const T*, T*);         \
  template void layernorm_rstd(const Launch&, index_t, index_t, double, const T*, T*); \
  template void cross_entropy_sum(const Launch&, index_t, const T*, const T*, const T*, double*);

SUMMA_CUDA_INSTANTIATE(float)
SUMMA_CUDA_INSTANTIATE(double)
SUMMA_CUDA_INSTANTIATE(__nv_bfloat16)
SUMMA_CUDA_INSTANTIATE_STATS(float)
SUMMA_CUDA_INSTANTIATE_STATS(double)
#undef SUMMA_CUDA_INSTANTIATE
#undef SUMMA_CUDA_INSTANTIATE_STATS

}  // namespace summa::cuda_detail

// ---- Optimizer updates (summa::cuda) -------------------------------------------------------

namespace summa::cuda {

namespace {

using cuda_detail::check_launch;
using cuda_detail::kThreads;

// Grid of the optimizer kernels (no backend at hand for the SM count): enough
// blocks for any current GPU, grid-stride beyond.
unsigned optimizer_grid(index_t n) {
  return static_cast<unsigned>(std::min<index_t>((n + kThreads - 1) / kThreads, 8192));
}

template <class T, class M>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(T* param, const T* grad, M* exp_avg, M* exp_avg_sq, index_t n, M decay, M beta1,
                 M one_minus_beta1, M beta2, M one_minus_beta2, M eps, M step_size,
                 M bias_correction2_sqrt) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const M g = static_cast<M>(grad[i]);
    const M m = beta1 * exp_avg[i] + one_minus_beta1 * g;
    const M v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const M denom = cuda_detail::dsqrt(v) / bias_correction2_sqrt + eps;
    const M p = static_cast<M>(param[i]) * decay;
    param[i] = static_cast<T>(p - step_size * m / denom);
  }
}

template <class T, class M>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(T* param, const T* grad, M* momentum_buffer, index_t n, M lr, M weight_decay,
               M momentum, bool nesterov) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const M p = static_cast<M>(param[i]);
    const M d = static_cast<M>(grad[i]) + weight_decay * p;
    const M b = momentum * momentum_buffer[i] + d;
    momentum_buffer[i] = b;
    param[i] = static_cast<T>(p - lr * (nesterov ? d + momentum * b : b));
  }
}

}  // namespace

template <class T, class M>
void adamw_update(T* param, const T* grad, M* exp_avg, M* exp_avg_sq, index_t n,
                  const optim::AdamWCoefficients& c, void* stream) {
  if (n <= 0) return;
  adamw_kernel<T, M><<<optimizer_grid(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      param, grad, exp_avg, exp_avg_sq, n, static_cast<M>(1.0 - c.lr * c.weight_decay),
      static_cast<M>(c.beta1), static_cast<M>(1.0 - c.beta1), static_cast<M>(c.beta2),
      static_cast<M>(1.0 - c.beta2), static_cast<M>(c.eps), static_cast<M>(c.step_size),
      static_cast<M>(c.bias_correction2_sqrt));
  check_launch("adamw_update");
}

template <class T, class M>
void sgd_update(T* param, const T* grad, M* momentum_buffer, index_t n,
                const optim::SgdCoefficients& c, void* stream) {
  if (n <= 0) return;
  sgd_kernel<T, M><<<optimizer_grid(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      param, grad, momentum_buffer, n, static_cast<M>(c.lr), static_cast<M>(c.weight_decay),
      static_cast<M>(c.momentum), c.nesterov);
  check_launch("sgd_update");
}

template void adamw_update(float*, const float*, float*, float*, index_t,
                           const optim::AdamWCoefficients&, void*);
template void adamw_update(double*, const double*, double*, double*, index_t,
                           const optim::AdamWCoefficients&, void*);
template void sgd_update(float*, const float*, float*, index_t, const optim::SgdCoefficients&,
                         void*);
template void sgd_update(double*, const double*, double*, index_t, const optim::SgdCoefficients&,
                         void*);

}  // namespace summa::cuda
