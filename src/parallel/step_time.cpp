// The step-time model: the step of step.hpp priced on a machine
// (docs/scaling.md has the equations).
#include "summa/model/step_time.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "step.hpp"
#include "summa/core/error.hpp"
#include "summa/schemes/registry.hpp"

namespace summa::model {

std::string_view name_of(Phase p) {
  switch (p) {
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::recompute:
      return "recompute";
    case Phase::optimizer:
      return "optimizer";
  }
  return "?";
}

double OpTime::comm_total_s() const {
  return std::accumulate(comm_s.begin(), comm_s.end(), 0.0);
}

namespace {

using cost::u64;
using cost::Work;
using detail::StepOp;

constexpr std::size_t axis_index(CommAxis a) {
  return static_cast<std::size_t>(a);
}

// Which grid coordinates vary within a group of each axis.
struct Varying {
  bool data, depth, row, col;
};
Varying varying(CommAxis a) {
  switch (a) {
    case CommAxis::data:
      return {true, false, false, false};
    case CommAxis::depth:
      return {false, true, false, false};
    case CommAxis::mesh_row:
      return {false, false, false, true};
    case CommAxis::mesh_col:
      return {false, false, true, false};
    case CommAxis::mesh:
      return {false, false, true, true};
    case CommAxis::tensor:
      return {false, true, true, true};
    case CommAxis::world:
    case CommAxis::pipe:  // not a grid axis (parallel/pipeline.hpp): priced apart
    case CommAxis::other:
      break;
  }
  return {true, true, true, true};
}

// For every rank and axis: does the rank's group on that axis span more
// than one node under the placement, and how many groups of that axis leave
// the rank's node (they share its network links: AxoNN eq. 7)?
class Links {
 public:
  Links(const GridShape& shape, Placement placement, int per_node) : shape_(shape) {
    const std::vector<GridCoords> slots = place(shape, placement, per_node);
    const auto nodes = static_cast<std::size_t>((slots.size() + per_node - 1) / per_node);
    node_.assign(static_cast<std::size_t>(shape.size()), 0);
    for (std::size_t s = 0; s < slots.size(); ++s)
      node_[index(slots[s])] = static_cast<int>(s) / per_node;
    for (std::size_t a = 0; a < comm_axis_count; ++a) {
      const auto axis = static_cast<CommAxis>(a);
      auto& span = spans_[a];
      span.assign(static_cast<std::size_t>(shape.size()), {-1, -1});
      for (std::size_t s = 0; s < slots.size(); ++s) {
        const int node = static_cast<int>(s) / per_node;
        auto& [lo, hi] = span[key(slots[s], axis)];
        lo = lo < 0 ? node : std::min(lo, node);
        hi = std::max(hi, node);
      }
      // groups leaving each node: distinct spanning groups with a member there
      std::vector<std::vector<std::size_t>> leaving(nodes);
      for (std::size_t s = 0; s < slots.size(); ++s) {
        const std::size_t k = key(slots[s], axis);
        auto& on = leaving[s / static_cast<std::size_t>(per_node)];
        if (span[k].first != span[k].second && std::find(on.begin(), on.end(), k) == on.end())
          on.push_back(k);
      }
      flows_[a].resize(nodes);
      for (std::size_t n = 0; n < nodes; ++n)
        flows_[a][n] = std::max<int>(1, static_cast<int>(leaving[n].size()));
    }
  }
  bool spans_nodes(const GridCoords& c, CommAxis a) const {
    const auto& [lo, hi] = spans_[axis_index(a)][key(c, a)];
    return lo != hi;
  }
  /// Groups of axis `a` that leave the node of the rank at `c` (at least 1).
  int flows(const GridCoords& c, CommAxis a) const {
    return flows_[axis_index(a)][static_cast<std::size_t>(node_[index(c)])];
  }

 private:
  std::size_t index(const GridCoords& c) const {
    return static_cast<std::size_t>(
        ((c.data * shape_.depth + c.depth) * shape_.rows + c.row) * shape_.cols + c.col);
  }
  std::size_t key(GridCoords c, CommAxis a) const {
    const Varying v = varying(a);
    if (v.data) c.data = 0;
    if (v.depth) c.depth = 0;
    if (v.row) c.row = 0;
    if (v.col) c.col = 0;
    return index(c);
  }
  GridShape shape_;
  std::vector<int> node_;  // by index(): the rank's node
  std::array<std::vector<std::pair<int, int>>, comm_axis_count> spans_;
  std::array<std::vector<int>, comm_axis_count> flows_;  // by node
};

// The local products' mode of a SUMMA form: C = A B, A Bᵀ, Aᵀ B.
GemmMode mode_of(Form f) {
  switch (f) {
    case Form::AB:
      return GemmMode::nn;
    case Form::ABt:
      return GemmMode::nt;
    case Form::AtB:
      return GemmMode::tn;
  }
  return GemmMode::nn;
}

// Prices one rank's work.
class Pricer {
 public:
  Pricer(const Machine& m, DType dtype, const Links& links, const GridCoords& c,
         int ranks_per_device, bool overlap, bool batch_calls, std::set<GemmShape>* shapes)
      : machine_(m),
        dtype_(dtype),
        shapes_(shapes),
        gemm_(m.device.gemm_of(dtype)),
        links_(links),
        coords_(c),
        share_(static_cast<double>(ranks_per_device)),
        overlap_(overlap),
        batch_calls_(batch_calls) {}

  // Collective c on axis a for this rank: the intra-node figures, or the
  // inter-node ones with β shared by the axis's groups leaving the node.
  CollectiveCost cost_of(CommAxis a, Collective c) const {
    if (!links_.spans_nodes(coords_, a)) return machine_.intra_node[c];
    CollectiveCost cost = machine_.inter_node[c];
    cost.share_bandwidth(static_cast<double>(links_.flows(coords_, a)));
    return cost;
  }
  double collective(const Work& w) const {
    const CollectiveCost cost = cost_of(w.axis, w.collective);
    const auto g = static_cast<std::int64_t>(w.group);
    if (cost.algorithm == Algorithm::direct)
      return direct_seconds(cost, g, static_cast<double>(w.sent), static_cast<double>(w.received));
    return collective_seconds(cost, w.collective, g, static_cast<double>(w.bytes));
  }
  // `calls` calls of `batch` products each, in `mode`
  double gemm(GemmMode mode, u64 m, u64 n, u64 k, u64 batch = 1, u64 calls = 1) const {
    if (batch_calls_) {  // StepTimeOptions::batch_calls: one call of every product
      batch *= calls;
      calls = 1;
    }
    const auto i = [](u64 v) { return static_cast<index_t>(v); };
    if (shapes_ != nullptr && m > 0 && n > 0 && k > 0)
      shapes_->insert({i(m), i(n), i(k), i(batch), mode});
    return share_ * static_cast<double>(calls) *
           (gemm_.seconds(i(m), i(n), i(k), i(batch), mode) + machine_.device.launch_s);
  }
  // One kernel call's overhead beyond its work (DeviceModel::launch_s).
  double launch() const { return share_ * machine_.device.launch_s; }
  double memory(u64 bytes) const {
    return share_ * static_cast<double>(bytes) / machine_.device.memory_bandwidth;
  }
  // Bytes one way between the device and host memory (0: a CPU, whose
  // host memory is its own).
  double host_copy(u64 bytes) const {
    const double bw = machine_.device.host_bandwidth > 0 ? machine_.device.host_bandwidth
                                                         : machine_.device.memory_bandwidth;
    return share_ * static_cast<double>(bytes) / bw;
  }
  // A compute-bound kernel: its bytes, or its elements at the kernel's rate.
  double pointwise(Pointwise f, u64 elements, u64 bytes) const {
    const double rate = machine_.device.pointwise_rate(dtype_, f);
    return std::max(memory(bytes), rate > 0 ? share_ * static_cast<double>(elements) / rate : 0.0);
  }

  // One SUMMA call (engine.hpp): q outer steps, each cut into panels; with
  // overlap, panel s+1's collectives run during panel s's product.
  struct Summa {
    double gemm_s = 0, row_s = 0, col_s = 0, total_s = 0;
  };
  Summa summa(const Work& w) const {
    const SummaOptions& o = w.summa;
    const u64 q = w.group, mb = w.m / q, nb = w.n / q, kb = w.k / q, e = w.element;
    Summa out;
    if (q == 1) {
      out.gemm_s = out.total_s = gemm(mode_of(w.form), w.m, w.n, w.k);
      return out;
    }
    // The panelled dimension and, per panel of width x: the product and the
    // collectives on the mesh row and column (a broadcast, or a reduce of C).
    const u64 dim = w.form == Form::AB ? kb : w.form == Form::ABt ? nb : mb;
    if (dim == 0)  // a model smaller than the mesh (calibrate --ranks 4096: was SIGFPE)
      throw Error(fmt::format(
          "SUMMA {}x{}x{} on a {}x{} mesh: a block has no {} (the model is smaller than the mesh)",
          w.m, w.n, w.k, q, q, w.form == Form::AtB ? "rows" : "columns"));
    const u64 full =
        o.panel <= 0 || static_cast<u64>(o.panel) > dim ? dim : static_cast<u64>(o.panel);
    const u64 slices = o.overlap ? static_cast<u64>(std::max(1, o.progress_slices)) : 1;
    // A panel's broadcast or reduce. Every rank is the root of one of the
    // q outer steps, so under the direct algorithm a step is priced with
    // the rank's average: (q-1)/q of the panel sent and received.
    const auto panel = [&](Collective c, CommAxis a, u64 elements) {
      const CollectiveCost cost = cost_of(a, c);
      const double bytes = static_cast<double>(elements * e);
      const auto g = static_cast<std::int64_t>(q);
      if (cost.algorithm != Algorithm::direct) return collective_seconds(cost, c, g, bytes);
      const double share = static_cast<double>(q - 1) / static_cast<double>(q) * bytes;
      return direct_seconds(cost, g, share, share);
    };
    const auto bcast = [&](CommAxis a, u64 elements) {
      return panel(Collective::broadcast, a, elements);
    };
    const auto reduce = [&](CommAxis a, u64 elements) {
      return panel(Collective::reduce, a, elements);
    };
    struct Step {
      double gemm, row, col;
    };
    const auto step = [&](u64 x) -> Step {
      switch (w.form) {
        case Form::AB:
          return {slices * gemm(GemmMode::nn, mb, std::max<u64>(nb / slices, 1), x),
                  bcast(CommAxis::mesh_row, mb * x), bcast(CommAxis::mesh_col, x * nb)};
        case Form::ABt:
          return {slices * gemm(GemmMode::nt, mb, std::max<u64>(x / slices, 1), kb),
                  reduce(CommAxis::mesh_row, mb * x), bcast(CommAxis::mesh_col, x * kb)};
        case Form::AtB:
          return {slices * gemm(GemmMode::tn, x, std::max<u64>(nb / slices, 1), kb),
                  bcast(CommAxis::mesh_row, kb * x), reduce(CommAxis::mesh_col, x * nb)};
      }
      return {};
    };
    const u64 panels_full = dim / full, rest = dim % full;
    const std::array<std::pair<Step, u64>, 2> steps = {std::pair{step(full), q * panels_full},
                                                       std::pair{step(rest), rest > 0 ? q : 0}};
    double pipelined = 0, fill = std::numeric_limits<double>::infinity();
    for (const auto& [s, count] : steps) {
      if (count == 0) continue;
      const double n = static_cast<double>(count), comm = s.row + s.col;
      out.gemm_s += n * s.gemm;
      out.row_s += n * s.row;
      out.col_s += n * s.col;
      pipelined += n * overlapped_seconds(machine_.contention, s.gemm, comm);
      fill = std::min(fill, std::min(s.gemm, comm));
    }
    out.total_s = o.overlap ? pipelined + fill : out.gemm_s + out.row_s + out.col_s;
    if (o.consensus_checks) {  // the shape agreement: one small all-reduce on the mesh
      const double check = collective({.kind = Work::Kind::collective,
                                       .collective = Collective::all_reduce,
                                       .axis = CommAxis::mesh,
                                       .group = q * q,
                                       .sent = 72,
                                       .received = 72,
                                       .bytes = 72});
      out.total_s += check;
      out.row_s += check;  // reported with the mesh row's
    }
    return out;
  }

  OpTime price(const StepOp& op) const {
    OpTime t{.op = op.name, .phase = op.phase, .count = op.count};
    double overlapped = 0;
    for (const Work& w : op.work) {
      switch (w.kind) {
        case Work::Kind::gemm:
          t.compute_s += gemm(w.mode, w.m, w.n, w.k, w.batch, w.calls);
          break;
        case Work::Kind::memory:
          t.compute_s += memory(w.bytes) + launch();
          break;
        case Work::Kind::pointwise:
          t.compute_s += pointwise(w.function, w.elements, w.bytes) + launch();
          break;
        case Work::Kind::summa: {
          const Summa s = summa(w);
          t.compute_s += s.gemm_s;
          t.comm_s[axis_index(CommAxis::mesh_row)] += s.row_s;
          t.comm_s[axis_index(CommAxis::mesh_col)] += s.col_s;
          t.exposed_s += s.total_s - s.gemm_s;
          break;
        }
        case Work::Kind::collective: {
          const double c = collective(w);
          t.comm_s[axis_index(w.axis)] += c;
          (w.overlapped && overlap_ ? overlapped : t.exposed_s) += c;
          break;
        }
      }
    }
    // Overlapped collectives hide behind the op's compute (slowing it and
    // slowed by it as the machine's contention says).
    if (overlapped > 0)
      t.exposed_s += overlapped_seconds(machine_.contention, t.compute_s, overlapped) - t.compute_s;
    return t;
  }

 private:
  const Machine& machine_;
  DType dtype_;
  std::set<GemmShape>* shapes_;
  const GemmModel& gemm_;
  const Links& links_;
  GridCoords coords_;
  double share_;      // ranks time-sharing the device
  bool overlap_;      // StepTimeOptions::overlap_collectives
  bool batch_calls_;  // StepTimeOptions::batch_calls
};

// Bytes of AdamW state per parameter element: the two moments and, for
// bf16, the fp32 master (what an offloaded optimizer copies each way).
u64 optimizer_state_bytes(DType t) {
  return t == DType::f64 ? 2 * 8 : (t == DType::bf16 ? 3 * 4 : 2 * 4);
}

// Bytes the optimizer (AdamW) reads and writes per parameter element:
// parameter, gradient, the two moments and, for bf16, the fp32 master.
u64 optimizer_bytes(DType t) {
  switch (t) {
    case DType::f32:
      return 7 * 4;
    case DType::f64:
      return 7 * 8;
    case DType::bf16:
      return 2 + 2 + 2 + 3 * 8;
  }
  return 0;
}

}  // namespace

namespace {

StepTime predict(const SchemeSpec& spec, const GptConfig& config, index_t batch, index_t seq,
                 const GptOptions& options, DType dtype, const Machine& machine,
                 const StepTimeOptions& time_options, std::set<GemmShape>* shapes) {
  require(machine.device.gemm_of(dtype).peak_flops > 0, [&] {
    return fmt::format("machine '{}' has no GEMM rate for {} (its gemm has no \"{}\")",
                       machine.name, name_of(dtype), name_of(dtype));
  });
  require(machine.devices_per_node >= 1 && machine.device.memory_bandwidth > 0,
          [&] { return fmt::format("machine '{}': incomplete description", machine.name); });
  require(batch > 0 && seq > 0 && batch % spec.data == 0, [&] {
    return fmt::format("predict_step_time: batch={} must be positive and divisible by data={}",
                       batch, spec.data);
  });
  const SchemeRow& row = scheme_row(spec.scheme);
  const GridShape shape = row.grid_shape(spec);
  require(time_options.ranks_per_device >= 1, [&] {
    return fmt::format("predict_step_time: ranks_per_device must be >= 1, got {}",
                       time_options.ranks_per_device);
  });
  const Links links(shape, time_options.placement,
                    machine.devices_per_node * time_options.ranks_per_device);
  const auto u = [](auto v) { return static_cast<u64>(v); };
  const u64 e = u(size_of(dtype));
  const u64 layers = u(config.n_layer);
  const u64 data = u(spec.data);

  // The ranks to evaluate: every rank where a collective's price depends on
  // the rank's own bytes (direct algorithm), otherwise one rank per pattern
  // of node-spanning axes (and the origin, which holds the roots).
  bool direct = false;
  for (const LinkLevel* level : {&machine.intra_node, &machine.inter_node})
    for (const CollectiveCost& c : level->collectives) direct |= c.algorithm == Algorithm::direct;
  std::vector<GridCoords> ranks;
  if (time_options.rank) {
    const GridCoords& c = *time_options.rank;
    require(c.data >= 0 && c.data < shape.data && c.depth >= 0 && c.depth < shape.depth &&
                c.row >= 0 && c.row < shape.rows && c.col >= 0 && c.col < shape.cols,
            [&] {
              return fmt::format("predict_step_time: rank ({}, {}, {}, {}) is not on the {} grid",
                                 c.data, c.depth, c.row, c.col, spec.str());
            });
  }
  {
    std::map<unsigned, bool> seen;
    for (int d = 0; d < shape.data; ++d)
      for (int z = 0; z < shape.depth; ++z)
        for (int r = 0; r < shape.rows; ++r)
          for (int c = 0; c < shape.cols; ++c) {
            const GridCoords at{d, z, r, c};
            unsigned key = 0;
            for (std::size_t a = 0; a < comm_axis_count; ++a)
              key |= (links.spans_nodes(at, static_cast<CommAxis>(a)) ? 1u : 0u) << a;
            if (time_options.rank ? at == *time_options.rank
                                  : direct || at == GridCoords{} || !seen[key])
              ranks.push_back(at);
            seen[key] = true;
          }
  }

  StepTime best;
  best.step_s = -1;
  for (const GridCoords& at : ranks) {
    cost::Tally tally;
    std::vector<StepOp> ops;
    const detail::Buckets buckets =
        detail::walk_step(spec, config, batch, seq, options, dtype, at, tally, &ops);
    const Pricer pricer(machine, dtype, links, at, time_options.ranks_per_device,
                        time_options.overlap_collectives, time_options.batch_calls, shapes);
    StepTime st;
    st.critical = at;
    // Backward's timeline for the data-axis buckets: ln_f's gradients are
    // final after ln_f's backward, a block's after its backward, the
    // embedding's at the end; each bucket's all-reduce starts when it is
    // final and the previous one is done (one communication stream).
    std::vector<double> ready;  // compute time into backward when each bucket is final
    double backward_clock = 0;
    for (const StepOp& o : ops) {
      OpTime t = pricer.price(o);
      const double per_step = t.seconds() * static_cast<double>(t.count);
      st.phase_s[static_cast<std::size_t>(t.phase)] += per_step;
      st.compute_s += t.compute_s * static_cast<double>(t.count);
      st.exposed_s += t.exposed_s * static_cast<double>(t.count);
      for (std::size_t a = 0; a < comm_axis_count; ++a)
        st.comm_s[a] += t.comm_s[a] * static_cast<double>(t.count);
      if (t.phase == Phase::backward || t.phase == Phase::recompute) {
        backward_clock += per_step;
        if (o.name == "ln_f" && t.phase == Phase::backward) ready.push_back(backward_clock);
      }
      st.ops.push_back(t);
    }
    // One block's backward (with its recomputation): the blocks' buckets
    // become final at equal intervals after ln_f's.
    if (data > 1) {
      const double block_s =
          std::accumulate(st.ops.begin(), st.ops.end(), 0.0, [](double s, const OpTime& t) {
            return t.op.starts_with("block.") &&
                           (t.phase == Phase::backward || t.phase == Phase::recompute)
                       ? s + t.seconds()
                       : s;
          });
      const double after_ln_f = ready.empty() ? 0 : ready.front();
      for (u64 l = 1; l <= layers; ++l)
        ready.push_back(after_ln_f + static_cast<double>(l) * block_s);
      ready.push_back(backward_clock);  // the embedding
      if (buckets.defers_gradients || !time_options.overlap_data_axis)
        std::fill(ready.begin(), ready.end(), backward_clock);
      OpTime d{.op = "data_axis", .phase = Phase::backward, .count = 1};
      const auto all_reduce = [&](u64 elements, u64 bytes_per) {
        if (elements == 0) return 0.0;  // an empty bucket is not all-reduced
        std::vector<Work> w;
        cost::Tally data_tally;
        data_tally.log = &w;
        data_tally.all_reduce(CommAxis::data, elements, data, u(at.data), bytes_per);
        return pricer.collective(w.front());
      };
      const double loss = all_reduce(1, sizeof(double));
      std::vector<double> bucket;
      // zero=2, 3: a unit's gradients reduce-scattered; zero=3: its values
      // all-gathered
      const auto unit = [&](detail::Buckets::Span span, bool gather) {
        if (span.count == 0) return 0.0;
        std::vector<Work> w;
        cost::Tally data_tally;
        data_tally.log = &w;
        const u64 piece = detail::Buckets::piece(span, data);
        if (gather)
          data_tally.all_gather(CommAxis::data, piece, data, e);
        else
          data_tally.reduce_scatter(CommAxis::data, piece, data, e);
        return pricer.collective(w.front());
      };
      for (const detail::Buckets::Span& span : buckets.spans(layers))
        bucket.push_back(spec.zero >= 2 ? unit(span, false) : all_reduce(span.count, e));
      // Each bucket when it is ready and the one before it is done; one that
      // starts during the backward runs 1 + contention.comm slower, and the
      // backward itself contention.compute times the time they overlap.
      double clock = 0, beside = 0;
      for (std::size_t k = 0; k < bucket.size(); ++k) {
        const double start = std::max(clock, ready[k]);
        const double run =
            start < backward_clock ? bucket[k] * (1 + machine.contention.comm) : bucket[k];
        clock = start + run;
        beside += std::max(0.0, std::min(clock, backward_clock) - start);
        d.comm_s[axis_index(CommAxis::data)] += bucket[k];
      }
      d.comm_s[axis_index(CommAxis::data)] += loss;
      d.exposed_s =
          loss + std::max(0.0, clock - backward_clock) + machine.contention.compute * beside;
      st.phase_s[static_cast<std::size_t>(Phase::backward)] += d.exposed_s;
      st.exposed_s += d.exposed_s;
      st.comm_s[axis_index(CommAxis::data)] += d.comm_s[axis_index(CommAxis::data)];
      st.ops.push_back(d);
      if (spec.zero >= 3) {
        // zero=3: each unit's values all-gathered. The embedding's gather is
        // exposed; LN_f's runs beside the blocks; each block's beside the
        // block before it (the embedding for block 0) in forward, and the
        // blocks backward gathers again beside the block above them.
        const auto gather = [&](detail::Buckets::Span span) { return unit(span, true); };
        const auto phase_block_s = [&](Phase p) {
          return std::accumulate(st.ops.begin(), st.ops.end(), 0.0, [&](double s, const OpTime& t) {
            return t.op.starts_with("block.") && t.phase == p ? s + t.seconds() : s;
          });
        };
        const auto op_s = [&](std::string_view name, Phase p) {
          double s = 0;
          for (const OpTime& t : st.ops)
            if (t.op == name && t.phase == p) s += t.seconds();
          return s;
        };
        const std::vector<detail::Buckets::Span> spans = buckets.spans(layers);
        const double forward_block = phase_block_s(Phase::forward);
        OpTime f{.op = "data_axis.gather", .phase = Phase::forward, .count = 1};
        OpTime b{.op = "data_axis.gather", .phase = Phase::backward, .count = 1};
        const double embedding = gather(spans.back());
        f.comm_s[axis_index(CommAxis::data)] += embedding + gather(spans.front());
        f.exposed_s = embedding;
        for (u64 l = 0; l < layers; ++l) {  // spans[1 + (layers - 1 - l)] is block l
          const double g = gather(spans[static_cast<std::size_t>(layers - l)]);
          f.comm_s[axis_index(CommAxis::data)] += g;
          const double behind = l == 0 ? op_s("embedding", Phase::forward) : forward_block;
          f.exposed_s += overlapped_seconds(machine.contention, behind, g) - behind;
        }
        const double backward_block = block_s;
        for (u64 k = 0, again = buckets.regathered_blocks(layers); k < again; ++k) {
          const double g = gather(spans[static_cast<std::size_t>(layers - k)]);
          b.comm_s[axis_index(CommAxis::data)] += g;
          b.exposed_s += overlapped_seconds(machine.contention, backward_block, g) - backward_block;
        }
        for (OpTime* o : {&f, &b}) {
          st.phase_s[static_cast<std::size_t>(o->phase)] += o->exposed_s;
          st.exposed_s += o->exposed_s;
          st.comm_s[axis_index(CommAxis::data)] += o->comm_s[axis_index(CommAxis::data)];
          st.ops.push_back(*o);
        }
      }
    }
    if (time_options.optimizer) {
      const u64 params = buckets.ln_f + layers * buckets.block + buckets.embedding;
      // a sharded data axis (zero=1, 2, 3): this rank updates its chunk, then
      // the chunks are all-gathered (exposed: nothing runs beside it): zero=1
      // in one all-gather, zero=2 in one per unit
      const bool sharded = spec.zero > 0 && data > 1;
      // zero=1: a contiguous 1/data of the parameters; zero=2 and 3: piece
      // d of every unit (each padded to data pieces)
      u64 chunk = buckets.parameters / data;
      if (spec.zero >= 2) {
        chunk = 0;
        for (const detail::Buckets::Span& span : buckets.spans(layers))
          chunk += detail::Buckets::piece(span, data);
      }
      OpTime o{.op = "optimizer", .phase = Phase::optimizer, .count = 1};
      const u64 updated = sharded ? chunk : params;
      o.compute_s = pricer.memory(updated * optimizer_bytes(dtype));
      if (const auto bucket = static_cast<u64>(time_options.offload_bucket);
          bucket > 0 && updated > 0) {
        // offloaded: every bucket copied in and out while another is
        // updated; the first copy in and the last copy out are exposed
        const u64 state = optimizer_state_bytes(dtype);
        const double copies = 2 * pricer.host_copy(updated * state);
        o.compute_s =
            std::max(o.compute_s, copies) + 2 * pricer.host_copy(std::min(bucket, updated) * state);
      }
      st.phase_s[static_cast<std::size_t>(Phase::optimizer)] += o.compute_s;
      st.compute_s += o.compute_s;
      if (sharded) {
        std::vector<Work> w;
        cost::Tally gather;
        gather.log = &w;
        // zero=3 keeps the values sharded: the next forward gathers them
        if (spec.zero == 1) gather.all_gather(CommAxis::data, chunk, data, e);
        if (spec.zero == 2)
          for (const detail::Buckets::Span& span : buckets.spans(layers))
            if (span.count > 0)
              gather.all_gather(CommAxis::data, detail::Buckets::piece(span, data), data, e);
        // zero=2: the gradient norm summed over the data groups first
        if (spec.zero >= 2) gather.all_reduce(CommAxis::data, 2, data, u(at.data), sizeof(double));
        double s = 0;
        for (const Work& x : w) s += pricer.collective(x);
        o.comm_s[axis_index(CommAxis::data)] += s;
        o.exposed_s += s;
        st.comm_s[axis_index(CommAxis::data)] += s;
        st.exposed_s += s;
        st.phase_s[static_cast<std::size_t>(Phase::optimizer)] += s;
      }
      st.ops.push_back(o);
    }
    st.step_s = std::accumulate(st.phase_s.begin(), st.phase_s.end(), 0.0);
    if (st.step_s > best.step_s) best = std::move(st);
  }
  return best;
}

}  // namespace

StepTime predict_step_time(const SchemeSpec& spec, const GptConfig& config, index_t batch,
                           index_t seq, const GptOptions& options, DType dtype,
                           const Machine& machine, const StepTimeOptions& time_options) {
  return predict(spec, config, batch, seq, options, dtype, machine, time_options, nullptr);
}

std::vector<GemmShape> step_gemm_shapes(const SchemeSpec& spec, const GptConfig& config,
                                        index_t batch, index_t seq, const GptOptions& options,
                                        DType dtype) {
  // Any machine will do: the shapes do not depend on the rates.
  Machine any;
  any.device.memory_bandwidth = 1;
  any.device.gemm_of(dtype).peak_flops = 1;
  std::set<GemmShape> shapes;
  predict(spec, config, batch, seq, options, dtype, any, {.optimizer = false}, &shapes);
  return {shapes.begin(), shapes.end()};
}

}  // namespace summa::model
