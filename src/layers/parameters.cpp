#include "summa/layers/parameters.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace summa {

index_t ParamShard::global_size() const {
  index_t n = global_shape.empty() ? 0 : 1;
  for (index_t d : global_shape) n *= d;
  return n;
}

namespace {

/// A run of a split dimension: `length` elements at global `global`, local `local`.
struct Run {
  index_t global, local, length;
};

/// The runs of a dimension of global `extent` split as `d`, in local order.
std::vector<Run> runs(index_t extent, const DimSplit& d) {
  const index_t group = extent / d.groups;  // a group's global extent
  const index_t w = group / d.parts;        // this rank's block of one group
  const index_t kept = d.local(extent);     // of the blocks side by side, part sub_block
  const index_t lo = d.sub_block * kept, hi = lo + kept;
  std::vector<Run> out;
  for (index_t g = 0; g < d.groups; ++g) {
    const index_t a = std::max(lo, g * w), b = std::min(hi, (g + 1) * w);  // local, unkept offset
    if (a >= b) continue;
    out.push_back({g * group + d.block * w + (a - g * w), a - lo, b - a});
  }
  return out;
}

}  // namespace

ParamShard split_shard(std::string name, std::vector<index_t> shape, DimSplit rows, DimSplit cols,
                       bool owner) {
  ParamShard s;
  s.name = std::move(name);
  s.global_shape = std::move(shape);
  s.owner = owner;
  const index_t R = s.global_rows(), C = s.global_cols();
  s.local_rows = rows.local(R);
  s.local_cols = cols.local(C);
  for (const Run& r : runs(R, rows))
    for (const Run& c : runs(C, cols))
      s.pieces.push_back({.global_row = r.global,
                          .global_col = c.global,
                          .local_row = r.local,
                          .local_col = c.local,
                          .rows = r.length,
                          .cols = c.length});
  return s;
}

template <class T>
index_t ParameterStore<T>::padded_elements(const std::vector<Param<T>*>& params, index_t multiple) {
  require(multiple >= 1,
          [&] { return fmt::format("ParameterStore: multiple={} must be >= 1", multiple); });
  index_t total = 0;
  for (const Param<T>* p : params) total += p->shard.local_size();
  return (total + multiple - 1) / multiple * multiple;
}

template <class T>
std::size_t ParameterStore<T>::bytes_for(const std::vector<Param<T>*>& params, index_t multiple) {
  return ByteCount<T>().add(padded_elements(params, multiple)).bytes();
}

template <class T>
ParameterStore<T>::ParameterStore(Backend& backend, std::vector<Param<T>*> params, bool gradients,
                                  index_t multiple)
    : params_(std::move(params)),
      backend_(&backend),
      has_gradients_(gradients),
      padded_(padded_elements(params_, multiple)),
      values_("parameters", backend, bytes_for(params_, multiple)),
      grads_("gradients", backend, gradients ? bytes_for(params_, multiple) : 0) {
  // Packed: the parameters follow each other without padding, so the
  // gradients of consecutive parameters (a block's) form one contiguous range;
  // the padding (zero) follows the last.
  const auto total = static_cast<std::size_t>(padded_);
  T* values = values_.take<T>(total);
  T* grads = gradients ? grads_.take<T>(total) : nullptr;
  index_t offset = 0;
  for (Param<T>* p : params_) {
    require(p != nullptr, "ParameterStore: null parameter");
    p->backend = &backend;
    if (!p->held()) {
      p->value = p->grad = nullptr;
      continue;
    }
    p->value = values + offset;
    p->grad = gradients ? grads + offset : nullptr;
    offset += p->shard.local_size();
  }
  const auto all = MatrixView<T>::dense(values, 1, static_cast<index_t>(total), Order::row_major);
  backend.scale(acc_t<T>(0), all);
  if (gradients)
    backend.scale(acc_t<T>(0),
                  MatrixView<T>::dense(grads, 1, static_cast<index_t>(total), Order::row_major));
}

template <class T>
Param<T>& ParameterStore<T>::find(std::string_view name) const {
  for (Param<T>* p : params_)
    if (p->shard.name == name) return *p;
  throw Error(fmt::format("ParameterStore: no parameter named '{}'", name));
}

template <class T>
void ParameterStore<T>::init_gpt(std::uint64_t seed, const GptConfig& config) {
  if constexpr (std::is_same_v<T, bf16>) {
    // bf16: the reference value rounded to float, then to bf16 (the rounding
    // of bf16(double)), through a float host image of each parameter: the
    // reference fills float, never bf16.
    std::vector<bf16> narrow;
    std::vector<float> wide;
    for (Param<T>* p : params_) {
      if (!p->held()) continue;
      const auto n = static_cast<std::size_t>(p->shard.local_size());
      narrow.resize(n);
      wide.resize(n);
      // Elements outside the pieces keep their values.
      backend_->download(narrow.data(), p->value, n * sizeof(bf16));
      for (std::size_t k = 0; k < n; ++k) wide[k] = float(narrow[k]);
      const auto local = MatrixView<float>::dense(wide.data(), p->shard.local_rows,
                                                  p->shard.local_cols, Order::row_major);
      for (const ShardPiece& piece : p->shard.pieces)
        init_fill_block<float>(
            seed, p->shard.name, piece.global_row, piece.global_col,
            local.block(piece.local_row, piece.local_col, piece.rows, piece.cols), config);
      for (std::size_t k = 0; k < n; ++k) narrow[k] = bf16(wide[k]);
      backend_->upload(p->value, narrow.data(), n * sizeof(bf16));
    }
  } else {
    const bool direct = backend_->host_accessible();
    std::vector<T> staging;  // a device backend's values are filled on the host, then uploaded
    for (Param<T>* p : params_) {
      if (!p->held()) continue;
      MatrixView<T> local = p->value_view();
      if (!direct) {
        // Elements outside the pieces keep their values, as on the host.
        staging.resize(static_cast<std::size_t>(p->shard.local_size()));
        backend_->download(staging.data(), p->value, staging.size() * sizeof(T));
        local = MatrixView<T>::dense(staging.data(), p->shard.local_rows, p->shard.local_cols,
                                     Order::row_major);
      }
      for (const ShardPiece& piece : p->shard.pieces)
        init_fill_block<T>(seed, p->shard.name, piece.global_row, piece.global_col,
                           local.block(piece.local_row, piece.local_col, piece.rows, piece.cols),
                           config);
      if (!direct) backend_->upload(p->value, staging.data(), staging.size() * sizeof(T));
    }
  }
}

double uniform_init_value(std::uint64_t seed, std::string_view name, index_t index, double scale) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a of the name
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  std::uint64_t z = seed + h * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(index);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;  // splitmix64 finaliser
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
  return scale * (2 * u - 1);
}

template <class T>
void ParameterStore<T>::init_uniform(std::uint64_t seed, double scale) {
  std::vector<T> host;  // through the host, whatever the backend's memory
  for (Param<T>* p : params_) {
    if (!p->held()) continue;
    const ParamShard& s = p->shard;
    host.resize(static_cast<std::size_t>(s.local_size()));
    backend_->download(host.data(), p->value, host.size() * sizeof(T));
    for (const ShardPiece& piece : s.pieces)
      for (index_t r = 0; r < piece.rows; ++r)
        for (index_t c = 0; c < piece.cols; ++c) {
          const index_t global = (piece.global_row + r) * s.global_cols() + piece.global_col + c;
          host[static_cast<std::size_t>((piece.local_row + r) * s.local_cols + piece.local_col +
                                        c)] =
              static_cast<T>(static_cast<float>(uniform_init_value(seed, s.name, global, scale)));
        }
    backend_->upload(p->value, host.data(), host.size() * sizeof(T));
  }
}

template <class T>
void ParameterStore<T>::zero_grads() {
  const index_t total = local_elements();
  if (total > 0 && has_gradients_)
    backend_->scale(acc_t<T>(0), MatrixView<T>::dense(grads_base(), 1, total, Order::row_major));
}

template <class T>
index_t ParameterStore<T>::local_elements() const {
  index_t n = 0;
  for (const Param<T>* p : params_) n += p->shard.local_size();
  return n;
}

template <class T>
std::vector<T> gather_global(const Param<T>& p, ProcessGrid& grid, bool grad) {
  const ParamShard& s = p.shard;
  const index_t cols = s.global_cols(), total = s.global_size();
  // Sent and placed in acc_t<T> (bf16 widened exactly, and back), so that
  // no bf16 collective is needed.
  using G = acc_t<T>;
  std::optional<std::string> error;
  const T* local = grad ? p.grad : p.value;
  if (p.held() && local == nullptr)
    error = fmt::format("gather_global '{}': the local {} is not bound", s.name,
                        grad ? "gradient" : "value");
  std::vector<T> host;  // the local shard, downloaded from a device backend
  if (!error && p.held() && s.owner && p.backend != nullptr && !p.backend->host_accessible()) {
    host.resize(static_cast<std::size_t>(s.local_size()));
    p.backend->download(host.data(), local, host.size() * sizeof(T));
    local = host.data();
  }
  // This rank's owned pieces (global row, column, rows, columns), placed
  // into a zeroed whole tensor.
  std::vector<G> global(static_cast<std::size_t>(total), G(0));
  std::vector<index_t> mine;
  for (const ShardPiece& piece : s.pieces) {
    if (error || !s.owner) break;
    if (piece.global_row < 0 || piece.global_col < 0 || piece.rows < 0 || piece.cols < 0 ||
        piece.global_row + piece.rows > s.global_rows() || piece.global_col + piece.cols > cols ||
        piece.local_row + piece.rows > s.local_rows ||
        piece.local_col + piece.cols > s.local_cols) {
      error = fmt::format("gather_global '{}': a shard piece lies outside the tensor", s.name);
      break;
    }
    mine.insert(mine.end(), {piece.global_row, piece.global_col, piece.rows, piece.cols});
    for (index_t r = 0; r < piece.rows; ++r) {
      const T* row = local + (piece.local_row + r) * s.local_cols + piece.local_col;
      G* to = global.data() + (piece.global_row + r) * cols + piece.global_col;
      for (index_t c = 0; c < piece.cols; ++c) to[c] = static_cast<G>(row[c]);
    }
  }
  grid.agree(CommAxis::tensor, error);
  // The elements: one all-reduce (each has one nonzero term when the pieces
  // tile the tensor). The ownership check needs only the pieces: every
  // rank's are all-gathered (a few numbers each; as doubles, exact: every
  // offset and extent of a tensor that fits a rank is below 2^53) and each
  // element's owners counted locally.
  Communicator& group = grid.tensor();
  group.all_reduce(global.data(), global.data(), global.size());
  const auto n = static_cast<std::size_t>(group.size());
  double most = static_cast<double>(mine.size());
  group.all_reduce(&most, &most, 1, ReduceOp::max);
  const auto meta_count = static_cast<std::size_t>(most) + 1;  // + the field count
  std::vector<double> meta(meta_count, 0.0), all_meta(n * meta_count);
  meta[0] = static_cast<double>(mine.size());
  for (std::size_t k = 0; k < mine.size(); ++k) meta[k + 1] = static_cast<double>(mine[k]);
  group.all_gather(meta.data(), all_meta.data(), meta_count);
  const auto for_each_piece = [&](auto&& body) {  // body(row0, col0, rows, cols)
    for (std::size_t r = 0; r < n; ++r) {
      const double* f = all_meta.data() + r * meta_count;
      for (std::size_t k = 0; k + 4 <= static_cast<std::size_t>(f[0]); k += 4)
        body(static_cast<index_t>(f[1 + k]), static_cast<index_t>(f[2 + k]),
             static_cast<index_t>(f[3 + k]), static_cast<index_t>(f[4 + k]));
    }
  };
  std::vector<std::uint8_t> held(static_cast<std::size_t>(total), 0);  // saturates at 2
  for_each_piece([&](index_t row0, index_t col0, index_t rows, index_t width) {
    for (index_t i = 0; i < rows; ++i) {
      std::uint8_t* h = held.data() + (row0 + i) * cols + col0;
      for (index_t c = 0; c < width; ++c) h[c] = static_cast<std::uint8_t>(h[c] < 2 ? h[c] + 1 : 2);
    }
  });
  const auto bad = std::find_if(held.begin(), held.end(), [](std::uint8_t h) { return h != 1; });
  require(bad == held.end(), [&] {
    const index_t k = bad - held.begin(), row = k / cols, col = k % cols;
    long long owners = 0;  // the exact count, for the message
    for_each_piece([&](index_t row0, index_t col0, index_t rows, index_t width) {
      owners += row >= row0 && row < row0 + rows && col >= col0 && col < col0 + width;
    });
    return fmt::format(
        "gather_global '{}': element {} is held by {} ranks (every element needs exactly one "
        "owner)",
        s.name, k, owners);
  });
  if constexpr (std::is_same_v<G, T>) {
    return global;
  } else {
    std::vector<T> narrow(global.size());
    for (std::size_t k = 0; k < global.size(); ++k) narrow[k] = T(global[k]);
    return narrow;
  }
}

template class ParameterStore<float>;
template class ParameterStore<double>;
template std::vector<float> gather_global(const Param<float>&, ProcessGrid&, bool);
template std::vector<double> gather_global(const Param<double>&, ProcessGrid&, bool);
template class ParameterStore<bf16>;
template std::vector<bf16> gather_global(const Param<bf16>&, ProcessGrid&, bool);

}  // namespace summa
