#include "summa/model/machine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace summa::model {

std::string_view name_of(Collective c) {
  switch (c) {
    case Collective::broadcast:
      return "broadcast";
    case Collective::reduce:
      return "reduce";
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::all_gather:
      return "all_gather";
    case Collective::reduce_scatter:
      return "reduce_scatter";
  }
  return "?";
}

std::string_view name_of(Pointwise f) {
  switch (f) {
    case Pointwise::gelu:
      return "gelu";
    case Pointwise::gelu_grad:
      return "gelu_grad";
    case Pointwise::softmax:
      return "softmax";
    case Pointwise::exp:
      return "exp";
    case Pointwise::layernorm:
      return "layernorm";
    case Pointwise::layernorm_grad:
      return "layernorm_grad";
  }
  return "?";
}

std::string_view name_of(GemmMode m) {
  switch (m) {
    case GemmMode::nn:
      return "nn";
    case GemmMode::nt:
      return "nt";
    case GemmMode::tn:
      return "tn";
  }
  return "?";
}

std::string_view name_of(Algorithm a) {
  switch (a) {
    case Algorithm::ring:
      return "ring";
    case Algorithm::tree:
      return "tree";
    case Algorithm::direct:
      return "direct";
  }
  return "?";
}

CollectiveCost CollectiveCost::at(double bytes) const {
  CollectiveCost out = *this;
  out.ranges.clear();
  if (ranges.empty()) return out;
  const auto r = std::find_if(ranges.begin(), ranges.end(),
                              [&](const Range& x) { return bytes <= x.up_to_bytes; });
  const Range& use = r == ranges.end() ? ranges.back() : *r;
  out.alpha_s = use.alpha_s;
  out.beta_bytes_s = use.beta_bytes_s;
  return out;
}

void CollectiveCost::share_bandwidth(double f) {
  beta_bytes_s /= f;
  for (Range& r : ranges) r.beta_bytes_s /= f;
}

double collective_seconds(const CollectiveCost& sized, Collective c, std::int64_t g, double bytes) {
  if (g <= 1) return 0;
  const CollectiveCost cost = sized.at(bytes);
  const double a = cost.alpha_s, n = bytes / cost.beta_bytes_s, steps = static_cast<double>(g - 1);
  const double share = steps / static_cast<double>(g);
  switch (cost.algorithm) {
    case Algorithm::ring:
      switch (c) {
        case Collective::all_reduce:
          return 2 * steps * a + 2 * share * n;
        case Collective::all_gather:
        case Collective::reduce_scatter:
          return steps * a + share * n;
        case Collective::broadcast:
        case Collective::reduce:
          return steps * a + n;
      }
      break;
    case Algorithm::tree: {
      const double depth = std::ceil(std::log2(static_cast<double>(g)));
      return (c == Collective::all_reduce ? 2 : 1) * depth * (a + n);
    }
    case Algorithm::direct:
      return steps * a + (c == Collective::all_reduce ? 2 : 1) * share * n;
  }
  return 0;
}

double direct_seconds(const CollectiveCost& sized, std::int64_t g, double sent, double received) {
  if (g <= 1) return 0;
  const CollectiveCost cost = sized.at((sent + received) / 2);
  return static_cast<double>(g - 1) * cost.alpha_s + (sent + received) / (2 * cost.beta_bytes_s);
}

double GemmModel::efficiency(index_t m, index_t n, index_t k, index_t batch, GemmMode mode) const {
  if (!table.empty()) {
    const auto l = [](index_t v) { return std::log(static_cast<double>(std::max<index_t>(v, 1))); };
    double best = std::numeric_limits<double>::infinity(), eff = table.front().efficiency;
    const bool measured =
        std::any_of(table.begin(), table.end(), [&](const Point& p) { return p.mode == mode; });
    for (const Point& p : table) {
      if (measured && p.mode != mode) continue;
      const double d =
          std::pow(l(m) - l(p.m), 2) + std::pow(l(n) - l(p.n), 2) + std::pow(l(k) - l(p.k), 2);
      if (d < best) {
        best = d;
        eff = p.efficiency;
      }
    }
    return eff;
  }
  const double f = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
                   static_cast<double>(std::max<index_t>(batch, 1));
  return max_efficiency * f / (f + half_flops);
}

double GemmModel::seconds(index_t m, index_t n, index_t k, index_t batch, GemmMode mode) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0;
  const double f = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
                   static_cast<double>(batch);
  return f / (peak_flops * efficiency(m, n, k, batch, mode));
}

double overlapped_seconds(const Contention& c, double compute_s, double comm_s) {
  const double comm = comm_s * (1 + c.comm);
  return std::max(compute_s + c.compute * std::min(compute_s, comm), comm);
}

const GemmModel& DeviceModel::gemm_of(DType t) const {
  return gemm[static_cast<std::size_t>(t)];
}
GemmModel& DeviceModel::gemm_of(DType t) {
  return gemm[static_cast<std::size_t>(t)];
}

}  // namespace summa::model

namespace summa::model {

bool Spread::any() const {
  const auto positive = [](double v) { return v > 0; };
  return std::any_of(gemm.begin(), gemm.end(), positive) ||
         std::any_of(pointwise.begin(), pointwise.end(), positive) || memory_bandwidth > 0 ||
         intra_node > 0 || inter_node > 0 || contention > 0;
}

Machine at_spread(const Machine& m, int end) {
  Machine out = m;
  if (end == 0) return out;
  // a rate at the slow end: divided by 1 + s; at the fast end: times it
  const auto rate = [&](double& v, double s) {
    const double f = 1 + std::max(0.0, s);
    v = end > 0 ? v / f : v * f;
  };
  for (std::size_t t = 0; t < out.device.gemm.size(); ++t) {
    rate(out.device.gemm[t].peak_flops, m.spread.gemm[t]);
    for (double& r : out.device.pointwise[t]) rate(r, m.spread.pointwise[t]);
  }
  rate(out.device.memory_bandwidth, m.spread.memory_bandwidth);
  for (auto [level, s] : {std::pair{&out.intra_node, m.spread.intra_node},
                          std::pair{&out.inter_node, m.spread.inter_node}})
    for (CollectiveCost& c : level->collectives) {
      const double f = 1 + std::max(0.0, s);  // latency: the other way
      rate(c.beta_bytes_s, s);
      c.alpha_s = end > 0 ? c.alpha_s * f : c.alpha_s / f;
      for (CollectiveCost::Range& r : c.ranges) {
        rate(r.beta_bytes_s, s);
        r.alpha_s = end > 0 ? r.alpha_s * f : r.alpha_s / f;
      }
    }
  // overlap's contention: an absolute spread of the factors
  for (double* f : {&out.contention.compute, &out.contention.comm})
    if (*f > 0 || end > 0)
      *f = std::max(0.0, *f + (end > 0 ? 1 : -1) * std::max(0.0, m.spread.contention));
  return out;
}

}  // namespace summa::model
