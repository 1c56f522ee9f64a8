// scaling_study: weak and strong scaling studies of the stacked transformer
// layers (Optimus Tables 2 and 3) and of whole GPT steps (AxoNN's weak
// scaling), predicted by the step-time model (summa/model/step_time.hpp) on
// a machine file (machines/*.json), side by side with the papers' published
// figures where a preset has them (docs/scaling.md).
//
//   scaling_study --preset optimus-weak --predict machines/frontera-rtx.json
//   scaling_study --preset optimus-strong --predict machines/frontera-rtx.json --json
//   scaling_study --study my_study.json --predict machines/h100-cluster.json --csv out.csv
//   mpirun -np 4 scaling_study --preset local-weak --predict machines/dev-2core.json --run
//   scaling_study --preset optimus-weak --predict machines/frontera-rtx.json --plot /tmp/opt
//   scaling_study --preset axonn-summit-weak --predict machines/summit.json
//
// --run measures every point whose device count fits the launch, one after
// the other on the first `gpus` ranks (a sub-communicator; the others
// wait): forward and backward of whole training steps (embedding and LM
// head included; no optimizer), median of --reps, beside the prediction for
// the same whole step with the launch's ranks per device. Points that need
// more ranks than the launch are listed at the end with the command that
// runs them on a cluster (srun / mpirun with --gpus N).
// --plot PREFIX writes PREFIX.jsonl and the plots PREFIX-throughput.png and
// PREFIX-efficiency.png (scripts/plot_scaling.py, python3-matplotlib).
//
// A study file: {"name": ..., "kind": "weak"|"strong", "stem_only": bool,
// "dtype": "f32"|"bf16"|"f64", "recompute": "full"|"selective"|"none"
// (or the older "checkpoint": true = full, false = none), "placement":
// "natural"|"bunched", "offload_bucket": elements (0: the optimizer state
// on the device), "max_stages": the most pipeline stages "auto" tries
// (default 8), "points": [{"gpus": 4, "scheme": "2d:q=2", "batch": 96,
// "seq": 512, "layers": 24, "hidden": 2048, "heads": 32, "vocab": 50304,
// "paper_fwd_per_sample_s": ..., "paper_bwd_per_sample_s": ..., "framework":
// "AxoNN", "paper_percent_of_peak": 52.1 or [49.4, 54.78], "offload_bucket":
// this point's (else the study's), "implementation": this point's (else
// the study's)}, ...], "implementation": "summa" (default) | "optimus-2021"
// | "megatron-2021" | "axonn": the code the prediction prices
// (model/implementation.hpp); a published system's adds the columns impl
// and summa/smp (this library's fwd+bwd per sample on the same point)}.
// "ranks_per_device": ranks sharing a device in the predictions (default 1;
// 2 prices 4 ranks on a 2-core machine). Where the machine file records a
// calibration's spreads, --json gives each point's step at both ends of
// them (predicted_step_s_low, predicted_step_s_high).
// Points with a paper's forward and backward figures end the table with
// the held-out validation: each such point's error, the rows within one
// node (those a machine file may be fitted to) apart from the rest. A study with a framework or a
// paper's % of peak on any point prints the columns framework, %peak (the
// model flops per GPU over the machine's peak for the dtype) and paper%.
// "scheme" may be "auto": every scheme of the point's rank count, planned
// (the scheme's own checks; its memory within the device's) and ranked by
// predicted step time (the best is reported, the top 3 in --json's "top").
// Every point's memory per device is the memory planner's, for the busiest
// rank, computed without launching the ranks (plan-only grids).
#include <mpi.h>

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../examples/flag_checks.hpp"
#include "bench_device.hpp"
#include "summa/comm/consensus.hpp"
#include "summa/comm/mpi_init.hpp"
#include "summa/io/files.hpp"
#include "summa/io/machine_file.hpp"
#include "summa/model/implementation.hpp"
#include "summa/model/step_time.hpp"
#include "summa/optim/optimizer.hpp"
#include "summa/parallel/auto_scheme.hpp"
#include "summa/schemes/spec.hpp"

namespace {

using nlohmann::json;

struct Point {
  int gpus = 1;
  std::string scheme;
  long batch = 1, seq = 512, layers = 24, hidden = 1024, heads = 16, vocab = 50304;
  std::optional<double> paper_fwd = {}, paper_bwd = {};  // seconds per sample
  /// The system a point stands for ("AxoNN", "Megatron-LM": a paper's
  /// configuration of it; empty: none), and the % of the device's peak the
  /// paper reports for it, a figure or a range (low, high).
  std::string framework = {};
  std::optional<double> paper_peak_low = {}, paper_peak_high = {};
  /// This point's optimizer offload (elements per bucket), else the study's.
  std::optional<long> offload_bucket = {};
  /// The implementation this point's prediction prices
  /// (model/implementation.hpp), else the study's.
  std::optional<summa::model::Implementation> implementation = {};
};

struct Study {
  std::string name, kind = "weak";
  bool stem_only = true;
  summa::Recompute recompute = summa::Recompute::full;
  summa::DType dtype = summa::DType::f32;
  summa::Placement placement = summa::Placement::natural;
  /// The optimizer offloaded (OptimizerOptions::offload_bucket, elements per
  /// bucket; 0: not): its state off the device, priced over the host link.
  long offload_bucket = 0;
  /// "auto": pipelines of up to this many stages in the search
  /// (AutoSchemeOptions::max_stages).
  int max_stages = 8;
  /// The implementation the points price unless a point names its own:
  /// this library's by default, or a published system's profile.
  summa::model::Implementation implementation = summa::model::Implementation::summa;
  /// Ranks sharing one device in the predictions
  /// (StepTimeOptions::ranks_per_device: an oversubscribed launch, such as
  /// 4 ranks on this 2-core machine); --run prices as the launch ran.
  int ranks_per_device = 1;
  std::vector<Point> points = {};
};

// ---------------------------------------------------------------- presets

// GPT-2's vocabulary as the presets' 1D points use it: 50304 (50257 padded
// to a multiple of 128) where p divides it, otherwise padded to a multiple
// of 128 p as Megatron pads it (50688 for p = 36). Only the memory plan sees
// it in a stem-only study.
long megatron_vocab(int p) {
  const long gpt2 = 50257, padded = 50304;
  if (padded % p == 0) return padded;
  const long unit = 128L * p;
  return (gpt2 + unit - 1) / unit * unit;
}

// Optimus (Xu et al. 2021) Tables 2 and 3: 24 layers, seq 512, the stacked
// transformer layers timed, TACC Frontera rtx nodes (4 GPUs each), bunched
// placement for 2D. Published forward and backward time per sample. The
// paper measured its own 2021 code: the 1D rows price Megatron-LM's
// (megatron-2021), the 2D rows Optimus's (optimus-2021); the table's
// summa/smp column prices this library's on the same points.
Study optimus_weak() {
  Study s{.name = "Optimus Table 2 (weak scaling)", .kind = "weak"};
  s.placement = summa::Placement::bunched;
  struct Row {
    int gpus, q;
    long h, heads, batch_1d, batch_2d;
    double fwd_1d, bwd_1d, fwd_2d, bwd_2d;
  };
  const Row rows[] = {
      {4, 2, 2048, 32, 60, 96, 0.0793, 0.2613, 0.0985, 0.2979},
      {16, 4, 4096, 64, 60, 192, 0.2081, 0.5149, 0.1764, 0.5312},
      {36, 6, 6120, 72, 40, 288, 0.3379, 0.7955, 0.1901, 0.5759},
      {64, 8, 8192, 128, 30, 384, 0.4638, 1.0963, 0.2589, 0.7935},
  };
  for (const Row& r : rows) {
    s.points.push_back({.gpus = r.gpus,
                        .scheme = fmt::format("1d:p={}", r.gpus),
                        .batch = r.batch_1d,
                        .hidden = r.h,
                        .heads = r.heads,
                        .vocab = megatron_vocab(r.gpus),
                        .paper_fwd = r.fwd_1d,
                        .paper_bwd = r.bwd_1d,
                        .implementation = summa::model::Implementation::megatron_2021});
    s.points.push_back({.gpus = r.gpus,
                        .scheme = fmt::format("2d:q={}", r.q),
                        .batch = r.batch_2d,
                        .hidden = r.h,
                        .heads = r.heads,
                        .paper_fwd = r.fwd_2d,
                        .paper_bwd = r.bwd_2d,
                        .implementation = summa::model::Implementation::optimus_2021});
  }
  return s;
}

Study optimus_strong() {
  Study s{.name = "Optimus Table 3 (strong scaling)", .kind = "strong"};
  s.placement = summa::Placement::bunched;
  struct Row {
    int gpus, q;
    long h_1d, heads_1d;
    double fwd_1d, bwd_1d, fwd_2d, bwd_2d;
  };
  const Row rows[] = {
      {4, 2, 3072, 64, 0.1225, 0.4749, 0.1888, 0.5691},
      {16, 4, 3072, 64, 0.1143, 0.4293, 0.1950, 0.5704},
      {36, 6, 3096, 72, 0.1212, 0.4512, 0.1625, 0.4764},
      {64, 8, 3072, 64, 0.1195, 0.5306, 0.1253, 0.3716},
  };
  for (const Row& r : rows) {
    s.points.push_back({.gpus = r.gpus,
                        .scheme = fmt::format("1d:p={}", r.gpus),
                        .batch = 12,
                        .hidden = r.h_1d,
                        .heads = r.heads_1d,
                        .vocab = megatron_vocab(r.gpus),
                        .paper_fwd = r.fwd_1d,
                        .paper_bwd = r.bwd_1d,
                        .implementation = summa::model::Implementation::megatron_2021});
    s.points.push_back({.gpus = r.gpus,
                        .scheme = fmt::format("2d:q={}", r.q),
                        .batch = 24,
                        .hidden = 3072,
                        .heads = 24,
                        .paper_fwd = r.fwd_2d,
                        .paper_bwd = r.bwd_2d,
                        .implementation = summa::model::Implementation::optimus_2021});
  }
  return s;
}

// AxoNN (Singh et al. 2024) weak scaling on Perlmutter, Table II models on
// 512 to 4096 GPUs, bf16, whole training steps, the scheme chosen by the
// model's ranking (AxoNN's configuration search). Sequence 2048 and one
// sequence per GPU per step are this preset's assumptions (the paper's
// batch is not in the text).
Study axonn_weak() {
  Study s{.name = "AxoNN weak scaling (Perlmutter)", .kind = "weak"};
  s.stem_only = false;
  s.dtype = summa::DType::bf16;
  struct Row {
    int gpus;
    long layers, h, heads;
  };
  const Row rows[] = {
      {512, 24, 4096, 32}, {1024, 32, 5120, 40}, {2048, 32, 7168, 56}, {4096, 38, 9216, 72}};
  for (const Row& r : rows)
    s.points.push_back({.gpus = r.gpus,
                        .scheme = "auto",
                        .batch = r.gpus,
                        .seq = 2048,
                        .layers = r.layers,
                        .hidden = r.h,
                        .heads = r.heads});
  return s;
}

// AxoNN (Singh and Bhatele, IPDPS 2022) on Summit (machines/summit.json):
// the Table I models (sequence 512, vocabulary 51200, half precision) in
// each framework's Table II configuration, G_intra x G_inter x G_data as
// tensor (1D) x pipe x data with its microbatch size, whole training steps.
// Weak: batch 16384 at 48-384 GPUs. Strong: the 12B model, batch 4096 at
// 48 GPUs to 32768 at 384, the same G_intra and G_inter and G_data scaled
// with the GPUs (section VII-C). AxoNN: no tensor parallelism, the
// message-driven schedule, its optimizer offloaded in buckets of bsize = 4
// million (section VI-C); Megatron-LM: 1F1B; DeepSpeed: 1F1B with ZeRO
// (zero=1). The paper gives % of peak as ranges per framework (section
// VII-B: AxoNN 49.4-54.78, DeepSpeed 39-42, Megatron-LM 21-41; its
// Figure 9 is not in the text); each point carries its framework's range.
// A stage's pipeline limit is AxoNN's default here (the stage count; the
// paper does not give it); Megatron pads the vocabulary to a multiple of
// 128 G_intra.
Study axonn_summit(const std::string& kind) {
  Study s{.name = fmt::format("AxoNN {} scaling (Summit; Singh and Bhatele 2022)", kind),
          .kind = kind};
  s.stem_only = false;
  s.dtype = summa::DType::bf16;
  struct Model {
    int gpus;
    long layers, h, heads;
  };
  const Model models[] = {
      {48, 48, 4512, 24}, {96, 48, 6336, 36}, {192, 96, 6528, 48}, {384, 96, 9360, 60}};
  struct Config {  // Table II: framework, microbatch size, G_intra, G_inter, G_data
    const char* framework;
    long micro_batch;
    int intra, inter, data;
  };
  const Config table2[4][3] = {
      {{"AxoNN", 8, 1, 6, 8}, {"DeepSpeed", 2, 3, 2, 8}, {"Megatron-LM", 8, 3, 16, 1}},
      {{"AxoNN", 4, 1, 12, 8}, {"DeepSpeed", 2, 3, 4, 8}, {"Megatron-LM", 1, 3, 16, 2}},
      {{"AxoNN", 4, 1, 24, 8}, {"DeepSpeed", 1, 3, 16, 4}, {"Megatron-LM", 8, 6, 32, 1}},
      {{"AxoNN", 2, 1, 48, 8}, {"DeepSpeed", 1, 3, 32, 4}, {"Megatron-LM", 4, 12, 32, 1}}};
  const auto vocab = [](int p) {  // 51200 padded to a multiple of 128 p
    const long unit = 128L * p;
    return (51200 + unit - 1) / unit * unit;
  };
  const auto range = [](const std::string& f) {
    if (f == "AxoNN") return std::pair{49.4, 54.78};
    if (f == "DeepSpeed") return std::pair{39.0, 42.0};
    return std::pair{21.0, 41.0};
  };
  for (int gpus : {48, 96, 192, 384}) {
    const int row = kind == "weak" ? (gpus == 48 ? 0 : gpus == 96 ? 1 : gpus == 192 ? 2 : 3) : 0;
    const Model& m = models[row];
    const long batch = kind == "weak" ? 16384 : 4096L * gpus / 48;
    for (const Config& c : table2[row]) {
      const int data = kind == "weak" ? c.data : c.data * gpus / 48;
      const long micro = batch / (c.micro_batch * data);
      const bool axonn = std::string_view(c.framework) == "AxoNN";
      const std::string zero = std::string_view(c.framework) == "DeepSpeed" ? ":zero=1" : "";
      Point pt{.gpus = gpus,
               .scheme = fmt::format("{}pipe={}:micro={}:schedule={},1d:p={}",
                                     data > 1 ? fmt::format("data={}{},", data, zero) : "", c.inter,
                                     micro, axonn ? "axonn" : "1f1b", c.intra),
               .batch = batch,
               .seq = 512,
               .layers = m.layers,
               .hidden = m.h,
               .heads = m.heads,
               .vocab = vocab(c.intra),
               .framework = c.framework};
      if (kind == "weak") std::tie(pt.paper_peak_low, pt.paper_peak_high) = range(c.framework);
      if (axonn) pt.offload_bucket = 4000000;
      s.points.push_back(pt);
    }
  }
  return s;
}

// The configuration search on the same weak-scaling points: "auto" ranks
// every scheme, data axis and pipeline of up to n_layer stages (this
// library's implementation of each), with AxoNN's optimizer offload
// (bsize 4 million) so that its memory is the one AxoNN planned for.
Study axonn_summit_search() {
  Study s = axonn_summit("weak");
  s.name = "AxoNN weak scaling (Summit), configuration search";
  s.max_stages = 96;
  s.offload_bucket = 4000000;
  std::vector<Point> points;
  for (const Point& p : s.points)
    if (p.framework == "AxoNN") {
      Point q = p;
      q.scheme = "auto";
      q.framework = "search";
      q.vocab = 51200;
      q.offload_bucket.reset();
      points.push_back(q);
    }
  s.points = points;
  return s;
}

// A small study that fits this machine's launch (1, 2 and 4 ranks).
Study local(const std::string& kind) {
  Study s{.name = "local " + kind, .kind = kind};
  s.stem_only = false;  // whole steps: what --run measures
  for (int gpus : {1, 2, 4})
    for (const std::string& scheme :
         {fmt::format("1d:p={}", gpus), fmt::format("3d:1x1x{}", gpus)}) {
      const long batch = kind == "weak" ? 4 * gpus : 8;
      s.points.push_back({.gpus = gpus,
                          .scheme = scheme,
                          .batch = batch,
                          .seq = 64,
                          .layers = 4,
                          .hidden = 256,
                          .heads = 8,
                          .vocab = 512});
    }
  for (int q : {1, 2}) {
    const int gpus = q * q;
    const long batch = kind == "weak" ? 4 * gpus : 8;
    s.points.push_back({.gpus = gpus,
                        .scheme = fmt::format("2d:q={}", q),
                        .batch = batch,
                        .seq = 64,
                        .layers = 4,
                        .hidden = 256,
                        .heads = 8,
                        .vocab = 512});
  }
  return s;
}

summa::DType parse_dtype(const std::string& t) {
  if (t == "f32") return summa::DType::f32;
  if (t == "f64") return summa::DType::f64;
  if (t == "bf16") return summa::DType::bf16;
  throw summa::Error(fmt::format("study: dtype '{}' is not f32, f64 or bf16", t));
}

summa::GptConfig config_of(const Point& p);

Study read_study(const std::string& path) {
  summa::io::require_regular_file(path, "study file");
  std::ifstream in(path);
  if (!in) throw summa::Error(fmt::format("study file {}: cannot be opened", path));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {  // without nlohmann's "[json.exception.…] " tag
    const std::string_view what = e.what();
    const auto tag =
        what.starts_with("[json.exception.") ? what.find("] ") : std::string_view::npos;
    throw summa::Error(fmt::format("study file {}: not valid JSON: {}", path,
                                   tag == std::string_view::npos ? what : what.substr(tag + 2)));
  }
  Study s;
  // a whole number in a JSON integer (not 4.7, not 1e18 read as a double)
  std::size_t k = 0;  // the point being read
  const auto integer = [&](const json& p, const char* key, long fallback, bool required) {
    if (!p.contains(key)) {
      if (required)
        throw summa::Error(fmt::format("study file {}: point {} has no {}", path, k, key));
      return fallback;
    }
    const json& v = p.at(key);
    if (!v.is_number_integer() || v.get<long long>() < 1 ||
        v.get<long long>() > std::numeric_limits<int>::max())
      throw summa::Error(
          fmt::format("study file {}: point {}: {}={} is not an integer between 1 "
                      "and {}",
                      path, k, key, v.dump(), std::numeric_limits<int>::max()));
    return static_cast<long>(v.get<long long>());
  };
  if (!j.is_object())
    throw summa::Error(fmt::format("study file {}: not a JSON object (it is {} {})", path,
                                   j.is_array() ? "an" : "a", j.type_name()));
  // a study-wide field of the type it must have, naming it (was: nlohmann's
  // "type must be boolean, but is string")
  const auto field = [&]<class V>(const char* key, V fallback) -> V {
    if (!j.contains(key)) return fallback;
    const json& v = j.at(key);
    if constexpr (std::is_same_v<V, bool>) {
      if (!v.is_boolean())
        throw summa::Error(
            fmt::format("study file {}: \"{}\" is {}, not true or false", path, key, v.dump()));
    } else if (!v.is_string()) {
      throw summa::Error(
          fmt::format("study file {}: \"{}\" is {}, not a string", path, key, v.dump()));
    }
    return v.get<V>();
  };
  try {
    s.name = field("name", path);
    s.kind = field("kind", std::string("weak"));
    if (s.kind != "weak" && s.kind != "strong")
      throw summa::Error(
          fmt::format("study file {}: kind '{}' is not weak or strong", path, s.kind));
    s.stem_only = field("stem_only", true);
    if (j.contains("checkpoint") && j.contains("recompute"))
      throw summa::Error(fmt::format(
          "study file {}: \"checkpoint\" and \"recompute\" both given; keep \"recompute\"", path));
    s.recompute = field("checkpoint", true) ? summa::Recompute::full : summa::Recompute::none;
    if (j.contains("recompute"))
      s.recompute = summa::parse_recompute(field("recompute", std::string("full")),
                                           fmt::format("study file {}: \"recompute\"", path));
    s.dtype = parse_dtype(field("dtype", std::string("f32")));
    const std::string placement = field("placement", std::string("natural"));
    if (placement != "natural" && placement != "bunched")
      throw summa::Error(
          fmt::format("study file {}: placement '{}' is not natural or bunched", path, placement));
    s.placement = placement == "bunched" ? summa::Placement::bunched : summa::Placement::natural;
    if (j.contains("offload_bucket")) {
      const json& v = j.at("offload_bucket");
      if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > (1LL << 40))
        throw summa::Error(
            fmt::format("study file {}: \"offload_bucket\" is {}, not an integer between 0 and {}",
                        path, v.dump(), 1LL << 40));
      s.offload_bucket = static_cast<long>(v.get<long long>());
    }
    if (j.contains("max_stages")) {
      const json& v = j.at("max_stages");
      if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > 4096)
        throw summa::Error(
            fmt::format("study file {}: \"max_stages\" is {}, not an integer between 1 and 4096",
                        path, v.dump()));
      s.max_stages = static_cast<int>(v.get<long long>());
    }
    if (j.contains("ranks_per_device")) {
      const json& v = j.at("ranks_per_device");
      if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > 1024)
        throw summa::Error(fmt::format(
            "study file {}: \"ranks_per_device\" is {}, not an integer between 1 and 1024", path,
            v.dump()));
      s.ranks_per_device = static_cast<int>(v.get<long long>());
    }
    if (j.contains("implementation"))
      s.implementation = summa::model::parse_implementation(
          field("implementation", std::string("summa")),
          fmt::format("study file {}: \"implementation\"", path));
    if (!j.contains("points") || !j.at("points").is_array())
      throw summa::Error(fmt::format("study file {}: no \"points\" array", path));
    for (const json& p : j.at("points")) {
      Point pt;
      pt.gpus = static_cast<int>(integer(p, "gpus", 0, true));
      // was: nlohmann's "key 'scheme' not found"
      if (!p.contains("scheme") || !p.at("scheme").is_string())
        throw summa::Error(fmt::format(
            "study file {}: point {} has no scheme (a text such as \"2d:q=2\", or \"auto\")", path,
            k));
      pt.scheme = p.at("scheme").get<std::string>();
      pt.batch = integer(p, "batch", 0, true);
      pt.seq = integer(p, "seq", pt.seq, false);
      pt.layers = integer(p, "layers", pt.layers, false);
      pt.hidden = integer(p, "hidden", 0, true);
      pt.heads = integer(p, "heads", 0, true);
      pt.vocab = integer(p, "vocab", pt.vocab, false);
      // a paper's figure: a positive finite number of seconds (was: -1 or a
      // string printed, or nlohmann's type_error)
      const auto seconds = [&](const char* key, std::optional<double>& out) {
        if (!p.contains(key)) return;
        const nlohmann::json& v = p.at(key);
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
          throw summa::Error(
              fmt::format("study file {}: point {}: {} is {}, not a positive number of seconds",
                          path, k, key, v.dump()));
        out = v.get<double>();
      };
      seconds("paper_fwd_per_sample_s", pt.paper_fwd);
      seconds("paper_bwd_per_sample_s", pt.paper_bwd);
      if (p.contains("framework")) {
        if (!p.at("framework").is_string())
          throw summa::Error(fmt::format("study file {}: point {}: framework is {}, not a string",
                                         path, k, p.at("framework").dump()));
        pt.framework = p.at("framework").get<std::string>();
      }
      // a percentage, or a range [low, high]
      if (p.contains("paper_percent_of_peak")) {
        const json& v = p.at("paper_percent_of_peak");
        const auto percent = [](const json& x) {
          return x.is_number() && std::isfinite(x.get<double>()) && x.get<double>() > 0 &&
                 x.get<double>() <= 100;
        };
        const bool one = percent(v), two = v.is_array() && v.size() == 2 && percent(v[0]) &&
                                           percent(v[1]) &&
                                           v[0].get<double>() <= v[1].get<double>();
        if (!one && !two)
          throw summa::Error(fmt::format(
              "study file {}: point {}: paper_percent_of_peak is {}, not a percentage in (0, "
              "100] or a range [low, high]",
              path, k, v.dump()));
        pt.paper_peak_low = one ? v.get<double>() : v[0].get<double>();
        pt.paper_peak_high = one ? v.get<double>() : v[1].get<double>();
      }
      if (p.contains("offload_bucket")) {
        const json& v = p.at("offload_bucket");
        if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > (1LL << 40))
          throw summa::Error(fmt::format(
              "study file {}: point {}: offload_bucket is {}, not an integer between 0 and {}",
              path, k, v.dump(), 1LL << 40));
        pt.offload_bucket = static_cast<long>(v.get<long long>());
      }
      if (p.contains("implementation")) {
        if (!p.at("implementation").is_string())
          throw summa::Error(
              fmt::format("study file {}: point {}: implementation is {}, not a string", path, k,
                          p.at("implementation").dump()));
        pt.implementation =
            summa::model::parse_implementation(p.at("implementation").get<std::string>(),
                                               fmt::format("study file {}: point {}", path, k));
      }
      s.points.push_back(pt);
      ++k;
    }
  } catch (const json::exception& e) {
    throw summa::Error(fmt::format("study file {}: {}", path, e.what()));
  }
  if (s.points.empty()) throw summa::Error(fmt::format("study file {}: no points", path));
  // every size a positive int and the model well formed, before anything
  // divides by it or sizes memory from it (was: SIGFPE in compose_step for
  // heads 0, hidden 0 or vocab 0; hidden 2^40 wrapped)
  for (std::size_t k = 0; k < s.points.size(); ++k) {
    const Point& p = s.points[k];
    const std::pair<const char*, long> sizes[] = {
        {"gpus", p.gpus},     {"batch", p.batch}, {"seq", p.seq},    {"layers", p.layers},
        {"hidden", p.hidden}, {"heads", p.heads}, {"vocab", p.vocab}};
    for (const auto& [name, value] : sizes)
      if (value < 1 || value > std::numeric_limits<int>::max())
        throw summa::Error(
            fmt::format("study file {}: point {}: {}={} is not an integer between 1 and {}", path,
                        k, name, value, std::numeric_limits<int>::max()));
    // the model is priced layer by layer: a count past this would take
    // hours, not a refusal (no study of the papers comes near it)
    constexpr long kMaxLayers = 100000;
    if (p.layers > kMaxLayers)
      throw summa::Error(
          fmt::format("study file {}: point {}: layers={} is more than this study tool prices ({})",
                      path, k, p.layers, kMaxLayers));
    // "auto" plans and prices every scheme of the point's rank count: past
    // this, minutes instead of seconds (was: no output for over 40 s at
    // 2^20 GPUs)
    constexpr long kMaxAutoGpus = 65536;
    if (p.scheme == "auto" && p.gpus > kMaxAutoGpus)
      throw summa::Error(fmt::format(
          "study file {}: point {}: scheme \"auto\" searches at most {} GPUs (gpus={}); give the "
          "point a scheme",
          path, k, kMaxAutoGpus, p.gpus));
    // any scheme: the model prices ranks apart (was: gpus 2147483647 took
    // memory for every rank, then std::bad_alloc)
    constexpr long kMaxGpus = 1L << 20;
    if (p.gpus > kMaxGpus)
      throw summa::Error(
          fmt::format("study file {}: point {}: gpus={} is more than this study tool prices ({})",
                      path, k, p.gpus, kMaxGpus));
    try {
      config_of(p).validate();
      if (p.scheme != "auto") {
        const summa::SchemeSpec spec = summa::SchemeSpec::parse(p.scheme);
        if (spec.ranks() != p.gpus)
          throw summa::Error(fmt::format("scheme '{}' runs on {} ranks, the point has gpus={}",
                                         p.scheme, spec.ranks(), p.gpus));
        if (p.batch % spec.data != 0)  // was: predict_step_time's message, naming no point
          throw summa::Error(fmt::format("batch={} must be divisible by the scheme's data={}",
                                         p.batch, spec.data));
        (void)summa::model::implement(p.implementation.value_or(s.implementation), spec,
                                      {.recompute = s.recompute}, {});
      } else if (p.implementation.value_or(s.implementation) !=
                 summa::model::Implementation::summa) {
        throw summa::Error(fmt::format(
            "scheme \"auto\" searches this library's schemes; implementation '{}' prices one "
            "system's: give the point a scheme",
            summa::model::to_string(p.implementation.value_or(s.implementation))));
      }
    } catch (const summa::Error& e) {
      throw summa::Error(fmt::format("study file {}: point {}: {}", path, k, e.what()));
    }
  }
  return s;
}

// ---------------------------------------------------------------- prediction

struct Result {
  Point point;
  std::string scheme;                 // the one priced (auto: the best)
  double fwd = 0, bwd = 0, step = 0;  // seconds per step (of the timed part)
  double flops_per_step = 0;
  /// The implementation priced, the scheme text as it runs it (its
  /// profile's options set: "1d:p=4,dc=on"), and, for a published system's
  /// profile, this library's prediction of the same point (seconds per step
  /// of the timed part).
  summa::model::Implementation implementation = summa::model::Implementation::summa;
  std::string priced_scheme = {};
  std::optional<double> summa_fwd = {}, summa_bwd = {};
  /// The step priced at the fast and slow ends of the machine's spreads
  /// (a calibration's; model::at_spread), where it records them.
  std::optional<double> step_low = {}, step_high = {};
  std::vector<std::pair<std::string, double>> ranked = {};  // auto: top schemes and steps
  // --run: the measured whole step (forward, backward) and the prediction
  // of that same whole step with the launch's ranks per device
  std::optional<double> measured_fwd = {}, measured_bwd = {}, predicted_whole = {};
  std::optional<double> measured_inference_fwd = {};  // the forward of an inference build
  std::string run_note = {};                          // why a point that fits was not measured
  // The busiest rank's planned memory (model buffers and AdamW state;
  // launch-free), or why the scheme refuses the point.
  std::optional<std::uint64_t> memory_bytes = {};
  std::uint64_t inference_memory_bytes = 0;  // built for inference (no gradients, optimizer)
  std::string plan_note = {};
  // --largest-batch: the largest global batch of the scheme within the
  // device's memory (0: none), or why there is no figure
  std::optional<long> largest_batch = {};
  std::string largest_note = {};
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------- outputs

constexpr std::string_view kCsvHeader =
    "gpus,scheme,batch,hidden,heads,fwd_per_sample_s,paper_fwd_per_sample_s,"
    "bwd_per_sample_s,paper_bwd_per_sample_s,throughput,inference_throughput,"
    "efficiency,speedup_2d_1d,tflops_per_gpu,memory_per_gpu_bytes,predicted_whole_step_s,"
    "measured_step_s";

constexpr std::size_t kCsvColumns = 17;

// A CSV field as RFC 4180 writes it: quoted when it holds a comma, a quote
// or a line break (was: a scheme text "data=8,3d:2x2x1" written bare, the
// row one field longer than the header).
std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\r\n") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// The fields of one CSV line (quoted fields may hold commas).
constexpr std::size_t csv_fields(std::string_view line) {
  std::size_t n = 1;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    if (c == ',' && !quoted) ++n;
  }
  return quoted ? 0 : n;
}
static_assert(csv_fields(kCsvHeader) == kCsvColumns);

enum class OutputKind { csv, jsonl, png };

// Throws UsageError unless `path` is missing, empty, or an earlier output of
// scaling_study of that kind (a CSV with its header, JSON lines whose first
// is a point's record, a PNG).
// Whether a PNG carries the mark scripts/plot_scaling.py writes: a tEXt chunk
// "Software" whose text starts with kPlotSoftware, before the image data (a
// PNG of anything else, a photo or another matplotlib figure, is not ours).
constexpr std::string_view kPlotSoftware = "summa scaling_study";
bool png_of_scaling_study(std::istream& in) {
  char signature[8];
  if (!in.read(signature, 8) || std::string_view(signature, 8) != "\x89PNG\r\n\x1a\n") return false;
  for (int chunk = 0; chunk < 64; ++chunk) {  // the ancillary chunks before IDAT
    unsigned char head[8];
    if (!in.read(reinterpret_cast<char*>(head), 8)) return false;
    const std::uint32_t length = (std::uint32_t{head[0]} << 24) | (std::uint32_t{head[1]} << 16) |
                                 (std::uint32_t{head[2]} << 8) | std::uint32_t{head[3]};
    const std::string_view type(reinterpret_cast<const char*>(head + 4), 4);
    if (type == "IDAT" || type == "IEND" || length > (1u << 20)) return false;
    std::string data(length, '\0');
    if (!in.read(data.data(), length) || !in.ignore(4)) return false;  // the CRC
    if (type == "tEXt" && data.starts_with(std::string_view("Software\0", 9)) &&
        std::string_view(data).substr(9).starts_with(kPlotSoftware))
      return true;
  }
  return false;
}

void require_replaceable(const std::string& path, const char* flag, OutputKind kind) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec) || std::filesystem::file_size(path, ec) == 0)
    return;  // missing, or not a regular file (refused as such where it is opened)
  std::ifstream in(path, std::ios::binary);
  // Every line of a table or of the points, not the first alone (was: a
  // user's notes appended after them lost without a word); such outputs
  // are small, a larger file is not one.
  constexpr std::uintmax_t kMaxText = 64 << 20;
  const bool small = std::filesystem::file_size(path, ec) <= kMaxText;
  std::string line;
  bool ours = small && kind != OutputKind::png;
  switch (kind) {
    case OutputKind::csv:
      for (bool first = true; ours && std::getline(in, line); first = false)
        ours = first ? line == kCsvHeader : csv_fields(line) == kCsvColumns;
      break;
    case OutputKind::jsonl:
      while (ours && std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        ours = j.is_object() && j.contains("gpus") && j.contains("scheme") &&
               j.contains("memory_per_gpu_bytes");
      }
      break;
    case OutputKind::png:
      ours = png_of_scaling_study(in);
      break;
  }
  if (!ours)
    throw UsageError(fmt::format(
        "{}: '{}' holds something other than {} of scaling_study: refusing to replace it; "
        "choose another path, or remove the file",
        flag, path,
        kind == OutputKind::csv     ? "a table (--csv)"
        : kind == OutputKind::jsonl ? "the points (--plot's .jsonl)"
                                    : "a plot (a PNG)"));
}

// Model flops of one training step of the timed part as Narayanan et al.
// 2021 count them, and with them Megatron-LM and AxoNN, whose % of peak the
// presets are compared with: 2 per multiply-add; each layer's forward,
// 24 b s h^2 + 4 b s^2 h, four times (forward, backward twice, the
// recomputation once: 96 b s h^2 (1 + s/6h)); the LM head's 2 b s h V
// three times. The same count whatever the study recomputes (`recompute`),
// so the TFLOP/s column compares the recompute modes by their step time.
double step_flops(const Point& p, const Study& s) {
  const double b = static_cast<double>(p.batch), sq = static_cast<double>(p.seq),
               h = static_cast<double>(p.hidden);
  const double layer = 2 * (12 * b * sq * h * h + 2 * b * sq * sq * h);
  const double head = s.stem_only ? 0 : 2 * b * sq * h * static_cast<double>(p.vocab);
  return 4 * static_cast<double>(p.layers) * layer + 3 * head;
}

summa::GptConfig config_of(const Point& p) {
  summa::GptConfig c;
  c.n_layer = static_cast<int>(p.layers);
  c.n_embd = static_cast<int>(p.hidden);
  c.n_head = static_cast<int>(p.heads);
  c.n_positions = static_cast<int>(p.seq);
  c.vocab_size = static_cast<int>(p.vocab);
  return c;
}

// Bytes per rank of the AdamW state beside the planned model (two moments
// in master_t<T>, plus the fp32 master weights of a bf16 model), as
// gpt_train counts it.
template <class T>
constexpr std::uint64_t adamw_bytes_per_parameter = sizeof(summa::master_t<T>) *
                                                    (std::is_same_v<T, summa::bf16> ? 3 : 2);

// AdamW's state of a rank's parameters on the device (a sharded data axis,
// zero=1: its chunk; offloaded: the two buckets' staging buffers alone).
long offload_of(const Point& p, const Study& s) {
  return p.offload_bucket.value_or(s.offload_bucket);
}

template <class T>
std::uint64_t adamw_state_bytes(const summa::MemoryReport& plan, const summa::SchemeSpec& spec,
                                long offload) {
  if (offload > 0) return summa::offload_staging_bytes<T>({.offload_bucket = offload});
  const std::uint64_t shards = spec.zero > 0 ? static_cast<std::uint64_t>(spec.data) : 1;
  return plan.parameter_elements / shards * adamw_bytes_per_parameter<T>;
}

// The memory plan of the point's busiest rank (launch-free: a plan-only
// grid per rank of one tensor group) for the study's element type; for
// "auto", every scheme planned and priced (summa::rank_schemes), those
// whose plan exceeds the machine's device memory rejected.
struct Planned {
  std::uint64_t memory_bytes = 0;
  std::uint64_t inference_bytes = 0;  // the same model built for inference (forward only)
  std::vector<summa::SchemeCandidate> ranking = {};  // auto only
};

template <class T>
Planned plan_point(const Point& p, const Study& s, const summa::model::Machine& m,
                   const summa::model::StepTimeOptions& time) {
  summa::CpuBackend backend;  // the plan's workspaces as the CPU backend sizes them
  const summa::GptConfig c = config_of(p);
  const summa::GptOptions options{.recompute = s.recompute};
  Planned out;
  if (p.scheme != "auto") {
    const summa::SchemeSpec spec = summa::SchemeSpec::parse(p.scheme);
    const summa::RankMemory r =
        summa::plan_memory_busiest<T>(spec, backend, c, p.batch, p.seq, options);
    out.memory_bytes = r.report.total() + adamw_state_bytes<T>(r.report, spec, offload_of(p, s));
    if (!spec.pipeline.active())  // a pipeline trains only (no inference plan)
      out.inference_bytes =
          summa::plan_memory_busiest<T>(spec, backend, c, p.batch, p.seq,
                                        {.recompute = s.recompute, .inference = true})
              .report.total();
    return out;
  }
  const std::uint64_t budget = m.device.memory_bytes > 0 ? m.device.memory_bytes : ~0ull;
  out.ranking = summa::rank_schemes<T>(
      p.gpus, backend, c, p.batch, p.seq, options, m,
      {.budget_bytes = budget,
       .state_bytes_per_parameter = offload_of(p, s) > 0 ? 0 : adamw_bytes_per_parameter<T>,
       .state_bytes_fixed = summa::offload_staging_bytes<T>({.offload_bucket = offload_of(p, s)}),
       .time = time,
       .max_stages = s.max_stages});
  return out;
}

Planned plan_point(const Point& p, const Study& s, const summa::model::Machine& m,
                   const summa::model::StepTimeOptions& time) {
  switch (s.dtype) {
    case summa::DType::f32:
      return plan_point<float>(p, s, m, time);
    case summa::DType::f64:
      return plan_point<double>(p, s, m, time);
    case summa::DType::bf16:
      break;
  }
  return plan_point<summa::bf16>(p, s, m, time);
}

// --largest-batch: the largest global batch of the point's scheme whose
// plan (the busiest rank's buffers plus AdamW state, as the GiB/gpu column)
// fits the device's memory: a multiple of the scheme's batch granularity,
// at most 1 << 24 sequences, found by doubling then bisection (memory grows
// with the batch); 0 when even the smallest does not fit (Optimus Fig. 9's
// comparison).
template <class T>
long largest_batch(const Point& p, const std::string& scheme, const Study& s,
                   std::uint64_t budget) {
  summa::CpuBackend backend;
  const summa::SchemeSpec spec = summa::SchemeSpec::parse(scheme);
  const summa::GptConfig c = config_of(p);
  const long step = summa::batch_granularity(spec), max_units = (1L << 24) / step;
  const auto fits = [&](long units, bool first) {
    try {
      const summa::RankMemory r = summa::plan_memory_busiest<T>(spec, backend, c, units * step,
                                                                p.seq, {.recompute = s.recompute});
      return r.report.total() + adamw_state_bytes<T>(r.report, spec, offload_of(p, s)) <= budget;
    } catch (const summa::Error&) {
      if (first) throw;  // the scheme refuses the model: said
      return false;      // sizes past what any machine holds
    }
  };
  if (!fits(1, true)) return 0;
  long good = 1, bad = 2;
  while (bad <= max_units && fits(bad, false)) {
    good = bad;
    bad *= 2;
  }
  if (bad > max_units) {
    if (fits(max_units, false)) return max_units * step;
    bad = max_units;
  }
  while (bad - good > 1) {
    const long mid = good + (bad - good) / 2;
    (fits(mid, false) ? good : bad) = mid;
  }
  return good * step;
}

void find_largest_batch(Result& r, const Study& s, const summa::model::Machine& m) {
  // the scheme as the priced implementation runs it (its plan is GiB/gpu's)
  const std::string& planned = r.priced_scheme.empty() ? r.scheme : r.priced_scheme;
  if (m.device.memory_bytes == 0) {
    r.largest_note = "the machine file gives no device memory";
    return;
  }
  try {
    switch (s.dtype) {
      case summa::DType::f32:
        r.largest_batch = largest_batch<float>(r.point, planned, s, m.device.memory_bytes);
        return;
      case summa::DType::f64:
        r.largest_batch = largest_batch<double>(r.point, planned, s, m.device.memory_bytes);
        return;
      case summa::DType::bf16:
        break;
    }
    r.largest_batch = largest_batch<summa::bf16>(r.point, planned, s, m.device.memory_bytes);
  } catch (const summa::Error& e) {
    r.largest_note = e.what();
  }
}

// `share`: ranks per device (a --run point priced as it ran).
Result predict(const Point& p, const Study& s, const summa::model::Machine& m, int share = 0) {
  if (share == 0) share = s.ranks_per_device;
  const summa::GptConfig c = config_of(p);
  const summa::model::StepTimeOptions options{.placement = s.placement,
                                              .optimizer = !s.stem_only,
                                              .offload_bucket = offload_of(p, s),
                                              .ranks_per_device = share};
  const auto price = [&](const summa::SchemeSpec& given, Result& r,
                         summa::model::Implementation impl, const summa::model::Machine& machine) {
    const summa::model::Implemented run =
        summa::model::implement(impl, given, {.recompute = s.recompute}, machine, options);
    const summa::SchemeSpec& spec = run.spec;
    if (spec.pipeline.active()) {  // the schedule's span, split by the stages' shares
      const auto t = summa::model::predict_pipeline_step_time(
          spec, c, p.batch, p.seq, {.recompute = s.recompute}, s.dtype, run.machine, run.time);
      double f = 0, b = 0;
      for (const auto& stage : t.stages) {
        f += stage.forward_s;
        b += stage.backward_s;
      }
      r.step = s.stem_only ? t.pipeline_s : t.step_s;
      r.fwd = f + b > 0 ? t.pipeline_s * f / (f + b) : 0;
      r.bwd = r.step - r.fwd;
      return;
    }
    const auto t = summa::model::predict_step_time(
        spec, c, p.batch, p.seq, {.recompute = s.recompute}, s.dtype, run.machine, run.time);
    r.fwd = r.bwd = 0;
    for (const auto& op : t.ops) {
      if (s.stem_only && !op.op.starts_with("block.")) continue;
      const double sec = op.seconds() * static_cast<double>(op.count);
      (op.phase == summa::model::Phase::forward ? r.fwd : r.bwd) += sec;
    }
    r.step = r.fwd + r.bwd;
  };
  Result r{.point = p, .scheme = p.scheme};
  r.flops_per_step = step_flops(p, s);
  r.implementation = p.implementation.value_or(s.implementation);
  if (p.scheme != "auto") {
    const summa::SchemeSpec given = summa::SchemeSpec::parse(p.scheme);
    price(given, r, r.implementation, m);
    if (m.spread.any()) {  // the interval: the machine at both ends of its spreads
      for (int end : {-1, 1}) {
        Result bound = r;
        price(given, bound, r.implementation, summa::model::at_spread(m, end));
        (end < 0 ? r.step_low : r.step_high) = bound.step;
      }
    }
    Point priced = p;  // the system's own scheme options: its memory too
    priced.scheme = r.priced_scheme =
        summa::model::implement(r.implementation, given, {.recompute = s.recompute}, m, options)
            .spec.str();
    if (r.implementation != summa::model::Implementation::summa) {
      Result ours = r;
      price(given, ours, summa::model::Implementation::summa, m);
      r.summa_fwd = ours.fwd;
      r.summa_bwd = ours.bwd;
    }
    try {  // the scheme's own checks of the model, as a launch makes them
      const Planned planned = plan_point(priced, s, m, options);
      r.memory_bytes = planned.memory_bytes;
      r.inference_memory_bytes = planned.inference_bytes;
    } catch (const summa::Error& e) {
      r.plan_note = e.what();
    }
    return r;
  }
  // Every scheme of the rank count, planned (its own checks and its memory
  // against the device's) and ranked by predicted step. The ranking prices
  // whole steps; a stem-only study reranks the choices by their stem.
  const Planned planned = plan_point(p, s, m, options);
  std::vector<std::tuple<double, std::string, std::uint64_t>> all;
  for (const summa::SchemeCandidate& x : planned.ranking) {
    if (!x.rejected.empty()) continue;
    Result trial = r;
    price(x.spec, trial, summa::model::Implementation::summa, m);
    all.emplace_back(trial.step, x.spec.str(), x.memory_bytes);
  }
  if (all.empty()) {
    std::string why;
    for (const summa::SchemeCandidate& x : planned.ranking)
      why += fmt::format("\n  {}: {}", x.spec.str(), x.rejected);
    throw summa::Error(fmt::format("no scheme of {} ranks takes the point (batch {}, hidden {}):{}",
                                   p.gpus, p.batch, p.hidden, why));
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  r.scheme = r.priced_scheme = std::get<1>(all.front());
  price(summa::SchemeSpec::parse(r.scheme), r, summa::model::Implementation::summa, m);
  if (m.spread.any()) {  // the chosen scheme's interval (the choice itself held fixed)
    for (int end : {-1, 1}) {
      Result bound = r;
      price(summa::SchemeSpec::parse(r.scheme), bound, summa::model::Implementation::summa,
            summa::model::at_spread(m, end));
      (end < 0 ? r.step_low : r.step_high) = bound.step;
    }
  }
  Point chosen = p;
  chosen.scheme = r.scheme;
  const Planned chosen_plan = plan_point(chosen, s, m, options);
  r.memory_bytes = chosen_plan.memory_bytes;
  r.inference_memory_bytes = chosen_plan.inference_bytes;
  for (std::size_t k = 0; k < std::min<std::size_t>(3, all.size()); ++k)
    r.ranked.emplace_back(std::get<1>(all[k]), std::get<0>(all[k]));
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// --run: one point on the first `gpus` ranks of the launch (the others only
// take part in the split). Forward and backward of whole steps, each timed
// from a barrier to the slowest rank; the median of `reps` after a warm-up.
// The barrier and the all-reduce of the times wait under the grid's watchdog
// (--watchdog; summa::wait_guarded), like the grid's own collectives.
template <class T>
void measure(Result& r, const Study& s, const summa::model::Machine& machine,
             summa::Backend& backend, const summa::GridOptions& grid, int reps) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool member = rank < r.point.gpus;
  // blocking calls no watchdog polls: under --watchdog's limit (was: a rank
  // stopped before the split or the closing barrier hung the job)
  const double limit = grid.watchdog.limit_s();
  MPI_Comm sub = summa::split_under_limit(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, rank,
                                          "scaling_study's MPI_Comm_split of a point", limit);
  if (member) {
    const summa::SchemeSpec spec = summa::SchemeSpec::parse(r.scheme);
    const summa::GptConfig c = config_of(r.point);
    const summa::GptOptions options{.recompute = s.recompute};
    try {
      // sizes checked before memory (summa/parallel/memory_check.hpp): a
      // point this node cannot hold is noted with the bytes, not bad_alloc
      summa::require_memory_fits<T>(sub, spec, backend, c, r.point.batch, r.point.seq, options,
                                    grid,
                                    {.bytes = summa::available_memory_per_rank(sub, backend),
                                     .source = summa::available_memory_source(backend)},
                                    "");
      summa::ParallelGpt<T> run(sub, spec, backend, c, r.point.batch, r.point.seq, options, grid);
      summa::GptModel<T>& model = run.model();
      model.init(1234);
      const auto count = static_cast<std::size_t>(r.point.batch * r.point.seq);
      std::vector<std::int32_t> tokens(count), targets(count);
      for (std::size_t i = 0; i < count; ++i) {
        tokens[i] = static_cast<std::int32_t>((i * 7919) % static_cast<std::size_t>(c.vocab_size));
        targets[i] =
            static_cast<std::int32_t>((i * 104729 + 1) % static_cast<std::size_t>(c.vocab_size));
      }
      const auto timed = [&](auto&& call) {
        MPI_Request request;
        MPI_Ibarrier(sub, &request);
        summa::wait_guarded(request, sub, "scaling_study's timing barrier", 0);
        const auto t0 = std::chrono::steady_clock::now();
        call();
        backend.synchronize();
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        MPI_Iallreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, sub, &request);
        summa::wait_guarded(request, sub, "scaling_study's step-time all-reduce", sizeof dt);
        return dt;
      };
      std::vector<double> fwd, bwd;
      for (int k = 0; k <= reps; ++k) {  // the first is the warm-up
        const double f = timed([&] { (void)model.forward(tokens, targets); });
        const double b = timed([&] { model.backward(); });
        if (k > 0) {
          fwd.push_back(f);
          bwd.push_back(b);
        }
      }
      r.measured_fwd = median(fwd);
      r.measured_bwd = median(bwd);
      {  // inference (Optimus's definition): the forward of a model built for it
        summa::ParallelGpt<T> infer(sub, spec, backend, c, r.point.batch, r.point.seq,
                                    {.inference = true}, grid);
        infer.model().init(1234);
        std::vector<double> only;
        for (int k = 0; k <= reps; ++k) {
          const double f = timed([&] { infer.model().forward_logits(tokens); });
          if (k > 0) only.push_back(f);
        }
        r.measured_inference_fwd = median(only);
      }
      const int share = summa::ranks_per_device(sub, backend);
      // the predicted columns as the point ran (ranks per device)
      Point as_run = r.point;
      as_run.scheme = r.scheme;
      const Result again = predict(as_run, s, machine, share);
      r.fwd = again.fwd;
      r.bwd = again.bwd;
      r.step = again.step;
      r.predicted_whole =
          summa::model::predict_step_time(
              spec, c, r.point.batch, r.point.seq, options, summa::dtype_v<T>, machine,
              {.placement = s.placement, .optimizer = false, .ranks_per_device = share})
              .step_s;
    } catch (const summa::Error& e) {  // the scheme refuses the point, alike on every member
      r.run_note = e.what();
    }
    MPI_Comm_free(&sub);
  }
  // The ranks that sat out wait here asleep (a spinning MPI_Barrier would
  // take the cores of an oversubscribed launch from the measured ranks), for
  // as long as the point runs; the members, done together, under the limit.
  MPI_Request done = MPI_REQUEST_NULL;
  MPI_Ibarrier(MPI_COMM_WORLD, &done);
  summa::wait_sleeping(done, "scaling_study's barrier after a point", member ? limit : 0);
}

std::string scheme_family(const std::string& scheme) {
  const auto comma = scheme.find(',');
  const std::string core = scheme.starts_with("data=") ? scheme.substr(comma + 1) : scheme;
  return core.substr(0, 2);
}

// Held-out validation (docs/scaling.md, "Held-out validation"): a point
// within one node of the machine is a row the machine file's fitted
// figures may have been fitted to; every other point with a paper's
// figures is held out, predicted from figures that never saw it.
bool within_one_node(const Result& r, const summa::model::Machine& m) {
  return r.point.gpus <= m.devices_per_node;
}

// The paper's rows, fitted and held out, with the prediction's error on
// the forward, the backward and their sum per sample; the held-out rows'
// mean and worst, and whether the predicted 2D/1D ratio lies on the
// paper's side of 1 at each device count. Empty when no point has a
// paper's figures.
std::string held_out_table(const std::vector<Result>& results, const summa::model::Machine& m) {
  std::vector<const Result*> rows;
  for (const Result& r : results)
    if (r.point.paper_fwd && r.point.paper_bwd) rows.push_back(&r);
  if (rows.empty()) return "";
  std::string out = fmt::format(
      "# held-out validation: rows within one node ({} devices) are those a machine file may be "
      "fitted to; the others are predicted\n",
      m.devices_per_node);
  out += fmt::format("{:>5} {:>22} {:>13} {:>8} {:>7} {:>7} {:>7}\n", "gpus", "scheme", "impl",
                     "role", "fwd%", "bwd%", "step%");
  std::vector<double> fwd, bwd, step;
  for (const Result* r : rows) {
    const double b = static_cast<double>(r->point.batch), pf = *r->point.paper_fwd,
                 pb = *r->point.paper_bwd;
    const double ef = 100 * (r->fwd / b - pf) / pf, eb = 100 * (r->bwd / b - pb) / pb,
                 es = 100 * (r->step / b - (pf + pb)) / (pf + pb);
    const bool fit = within_one_node(*r, m);
    out += fmt::format("{:>5} {:>22} {:>13} {:>8} {:>+7.1f} {:>+7.1f} {:>+7.1f}\n", r->point.gpus,
                       r->scheme, summa::model::to_string(r->implementation),
                       fit ? "fit" : "held-out", ef, eb, es);
    if (!fit) {
      fwd.push_back(std::abs(ef));
      bwd.push_back(std::abs(eb));
      step.push_back(std::abs(es));
    }
  }
  const auto mean = [](const std::vector<double>& v) {
    return v.empty() ? 0.0
                     : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  };
  const auto worst = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  };
  out += fmt::format(
      "held-out rows: {}; mean / worst |error|: fwd {:.1f} / {:.1f} %, bwd {:.1f} / {:.1f} %, "
      "fwd+bwd {:.1f} / {:.1f} %\n",
      step.size(), mean(fwd), worst(fwd), mean(bwd), worst(bwd), mean(step), worst(step));
  // 2D/1D per device count: the time per sample's ratio, predicted and published
  std::map<int, std::map<std::string, std::pair<double, double>>> at;  // predicted, paper
  for (const Result* r : rows)
    at[r->point.gpus][scheme_family(r->scheme)] = {r->step / static_cast<double>(r->point.batch),
                                                   *r->point.paper_fwd + *r->point.paper_bwd};
  std::string sides;
  int agree = 0, counted = 0;
  for (const auto& [gpus, f] : at) {
    if (!f.count("1d") || !f.count("2d")) continue;
    const double predicted = f.at("1d").first / f.at("2d").first,
                 paper = f.at("1d").second / f.at("2d").second;
    const bool same = (predicted - 1) * (paper - 1) > 0;
    agree += same ? 1 : 0;
    ++counted;
    sides += fmt::format("{}{} GPUs {:.2f} ({:.2f}){}", sides.empty() ? "" : ", ", gpus, predicted,
                         paper, same ? "" : " !");
  }
  if (counted > 0)
    out +=
        fmt::format("2D/1D predicted (paper) by GPUs: {}; on the paper's side of 1 at {} of {}\n",
                    sides, agree, counted);
  return out;
}

int study_main(int argc, char** argv, int rank, int world) {
  CLI::App app{
      "Weak and strong scaling studies: predicted by summa's step-time model, measured "
      "with --run"};
  std::string preset, study_file, machine_file, csv, plot, backend_name = "cpu", comm = "nccl";
  bool as_json = false, run = false, tf32 = false, largest = false;
  int only_gpus = 0, reps = 3;
  long offload_bucket = -1;  // --offload-bucket: -1 keeps the study's
  double watchdog = 0;       // --run: seconds a collective may wait (0: off)
  app.add_option("--preset", preset,
                 "optimus-weak | optimus-strong | axonn-weak | axonn-summit-weak | "
                 "axonn-summit-strong | axonn-summit-search | local-weak | local-strong");
  app.add_option("--study", study_file, "A study file (JSON; see the source's header)");
  app.add_option("--predict", machine_file, "Machine file (machines/*.json)")->required();
  app.add_flag("--run", run,
               "Also measure the points whose device count fits the launch (the others: a "
               "command to run them on a cluster)");
  app.add_option("--gpus", only_gpus, "Only the points of this many devices")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--reps", reps, "--run: timed steps per point (median)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--watchdog", watchdog,
                 "--run: seconds a collective may wait before the job is ended with a report "
                 "naming the ranks that did not arrive (0: off)")
      ->check(summa::flags::watchdog_seconds())
      ->capture_default_str();
  app.add_flag("--largest-batch", largest,
               "Also the largest global batch of each point's scheme that fits the device's "
               "memory (the planner's figure, as GiB/gpu; column maxb, JSON largest_batch)");
  app.add_option("--offload-bucket", offload_bucket,
                 "The optimizer state offloaded to host memory in buckets of N elements (0: on "
                 "the device; default: the study file's \"offload_bucket\", else 0): memory "
                 "per device without it, the step with its copies over the machine's "
                 "host_bandwidth")
      ->check(CLI::Range(0L, 1L << 40));
  app.add_flag("--json", as_json, "One JSON object per point and scheme on stdout");
  app.add_option("--csv", csv, "Also write the table as CSV to this file");
  app.add_option("--plot", plot,
                 "Write PREFIX.jsonl and the plots PREFIX-throughput.png, PREFIX-efficiency.png "
                 "(python3-matplotlib, with the Python this build found: SUMMA_PYTHON)");
  summa::bench::add_device_options(app, backend_name, comm, tf32, "", "cuda: TF32 in f32 GEMMs");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return summa::flags::parse_exit(app, e, "scaling_study");
  }
  if (preset.empty() == study_file.empty())
    throw UsageError("give exactly one of --preset and --study");
  Study study;
  if (preset == "optimus-weak")
    study = optimus_weak();
  else if (preset == "optimus-strong")
    study = optimus_strong();
  else if (preset == "axonn-weak")
    study = axonn_weak();
  else if (preset == "axonn-summit-weak")
    study = axonn_summit("weak");
  else if (preset == "axonn-summit-strong")
    study = axonn_summit("strong");
  else if (preset == "axonn-summit-search")
    study = axonn_summit_search();
  else if (preset == "local-weak" || preset == "local")
    study = local("weak");
  else if (preset == "local-strong")
    study = local("strong");
  else if (!preset.empty())
    throw UsageError(
        fmt::format("--preset '{}' is not optimus-weak, optimus-strong, axonn-weak, "
                    "axonn-summit-weak, axonn-summit-strong, axonn-summit-search, local-weak or "
                    "local-strong",
                    preset));
  else
    study = read_study(study_file);
  if (offload_bucket >= 0) {  // every point's
    study.offload_bucket = offload_bucket;
    for (Point& p : study.points) p.offload_bucket.reset();
  }
  if (only_gpus > 0)
    std::erase_if(study.points, [&](const Point& p) { return p.gpus != only_gpus; });
  if (study.points.empty()) throw UsageError(fmt::format("no point has --gpus {}", only_gpus));
  const summa::model::Machine machine = summa::io::load_machine(machine_file);
  // An output never replaces an input (was: --csv naming the study or the
  // machine file replaced it with the table).
  const auto same_file = [](const std::string& a, const std::string& b) {
    std::error_code e;
    return !a.empty() && !b.empty() &&
           (std::filesystem::weakly_canonical(a, e) == std::filesystem::weakly_canonical(b, e) ||
            std::filesystem::equivalent(a, b, e));
  };
  for (const auto& [flag, output] : {std::pair<const char*, std::string>{"--csv", csv},
                                     {"--plot", plot.empty() ? plot : plot + ".jsonl"}})
    for (const auto& [input_flag, input] :
         {std::pair<const char*, std::string>{"--study", study_file}, {"--predict", machine_file}})
      if (same_file(output, input))
        throw UsageError(
            fmt::format("{} {} is the file of {}: it is read, never replaced; "
                        "choose another path",
                        flag, output, input_flag));
  // Nor do two outputs share a file (was: --csv x-throughput.png --plot x
  // wrote the table over the start of the plot, exit 0).
  if (!plot.empty())
    for (const char* suffix : {".jsonl", "-throughput.png", "-efficiency.png"})
      if (same_file(csv, plot + suffix))
        throw UsageError(fmt::format(
            "--csv {} is also a file --plot {} writes ({}{}): choose another path for one of them",
            csv, plot, plot, suffix));

  // Nor a file that is not an earlier output of this tool (was: a user's
  // notes, CSV or picture at the path silently replaced): the table by its
  // header, the points by their first record, a plot by PNG's signature.
  for (const auto& [flag, output, kind] :
       {std::tuple<const char*, std::string, OutputKind>{"--csv", csv, OutputKind::csv},
        {"--plot", plot.empty() ? plot : plot + ".jsonl", OutputKind::jsonl},
        {"--plot", plot.empty() ? plot : plot + "-throughput.png", OutputKind::png},
        {"--plot", plot.empty() ? plot : plot + "-efficiency.png", OutputKind::png}})
    if (!output.empty()) require_replaceable(output, flag, kind);

  std::vector<Result> results;
  for (std::size_t k = 0; k < study.points.size(); ++k) {
    try {  // named with its point (was: "GPT (1D): n_embd (hidden)=4 ...", no point or file)
      results.push_back(predict(study.points[k], study, machine));
      if (largest) find_largest_batch(results.back(), study, machine);
    } catch (const summa::Error& e) {
      throw summa::Error(fmt::format("{}{}{}point {} (gpus={}, scheme {}): {}",
                                     study_file.empty() ? "" : "study file ", study_file,
                                     study_file.empty() ? "" : ": ", k, study.points[k].gpus,
                                     study.points[k].scheme, e.what()));
    }
  }

  std::vector<int> cluster;  // device counts beyond this launch
  if (run) {
    // the device's agreement, before any grid, waits under --watchdog too
    summa::WatchdogOptions setup_limit;
    setup_limit.timeout_s = watchdog;
    const summa::Watchdog setup_watchdog(MPI_COMM_WORLD, setup_limit);
    summa::bench::BenchBackend dev = summa::bench::make_backend<UsageError>(
        backend_name, comm, tf32, app.count("--comm") > 0, "scaling_study");
    dev.grid.watchdog.timeout_s = watchdog;
    for (Result& r : results) {
      if (r.point.gpus > world) {
        if (std::find(cluster.begin(), cluster.end(), r.point.gpus) == cluster.end())
          cluster.push_back(r.point.gpus);
        continue;
      }
      if (rank == 0)
        std::fprintf(stderr, "scaling_study: running %d device(s), %s, batch %ld\n", r.point.gpus,
                     r.scheme.c_str(), r.point.batch);
      switch (study.dtype) {
        case summa::DType::f32:
          measure<float>(r, study, machine, *dev.backend, dev.grid, reps);
          break;
        case summa::DType::f64:
          measure<double>(r, study, machine, *dev.backend, dev.grid, reps);
          break;
        case summa::DType::bf16:
          measure<summa::bf16>(r, study, machine, *dev.backend, dev.grid, reps);
          break;
      }
    }
  }
  if (rank != 0) return 0;

  // efficiency against the first point of the same scheme family, and
  // 2D / 1D throughput at equal GPU counts
  // (a point standing for a framework: that framework's first point)
  const auto family = [](const Result& r) {
    return r.point.framework.empty() ? scheme_family(r.scheme) : r.point.framework;
  };
  std::map<std::string, const Result*> first;
  std::map<int, std::map<std::string, double>> throughput_at;
  for (const Result& r : results) {
    first.emplace(family(r), &r);
    throughput_at[r.point.gpus][scheme_family(r.scheme)] =
        static_cast<double>(r.point.batch) / r.step;
  }
  // % of the device's peak for the study's element type (the model flops
  // per GPU over the machine file's peak_flops), beside the paper's
  const bool peaks = std::any_of(results.begin(), results.end(), [](const Result& r) {
    return !r.point.framework.empty() || r.point.paper_peak_low.has_value();
  });
  const double peak = machine.device.gemm_of(study.dtype).peak_flops;
  const auto paper_peak = [](const Point& p) {
    if (!p.paper_peak_low) return std::string("-");
    if (*p.paper_peak_high == *p.paper_peak_low) return fmt::format("{:.1f}", *p.paper_peak_low);
    return fmt::format("{:g}-{:g}", *p.paper_peak_low, *p.paper_peak_high);
  };
  const bool any_measured = std::any_of(results.begin(), results.end(),
                                        [](const Result& r) { return r.measured_fwd.has_value(); });
  // a published system's profile on any point: its name, and this
  // library's prediction of the same point beside it
  const bool profiles = std::any_of(results.begin(), results.end(), [](const Result& r) {
    return r.implementation != summa::model::Implementation::summa;
  });
  std::ostringstream table;
  table << fmt::format(
      "# {} on {} ({}; {}{})\n", study.name, machine.name,
      study.stem_only ? "stacked transformer layers" : "whole step", summa::name_of(study.dtype),
      (study.recompute == summa::Recompute::full
           ? std::string()
           : fmt::format("; recompute {}", summa::to_string(study.recompute))) +
          (study.offload_bucket > 0
               ? fmt::format("; optimizer offloaded, buckets of {}", study.offload_bucket)
               : std::string()) +
          (std::any_of(
               results.begin(), results.end(),
               [&](const Result& r) { return offload_of(r.point, study) != study.offload_bucket; })
               ? std::string("; offload per point: *")
               : std::string()));
  table << fmt::format(
      "{:>5} {:>22} {:>6} {:>6} {:>5} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>6} {:>6} {:>8}",
      "gpus", "scheme", "batch", "hidden", "heads", "fwd/smp", "paper", "bwd/smp", "paper", "thru",
      "infer", "eff", "2d/1d", "TF/gpu");
  table << fmt::format(" {:>8}", "GiB/gpu");
  if (largest) table << fmt::format(" {:>8}", "maxb");
  if (peaks) table << fmt::format(" {:>12} {:>6} {:>11}", "framework", "%peak", "paper%");
  if (profiles) table << fmt::format(" {:>13} {:>9}", "impl", "summa/smp");
  if (any_measured) table << fmt::format(" {:>9} {:>9} {:>7}", "pred_s", "meas_s", "err%");
  table << "\n";
  std::ofstream csv_out;
  if (!csv.empty()) {
    summa::io::require_regular_file(csv, "--csv");  // a FIFO would block here forever
    errno = 0;
    csv_out.open(csv);
    if (!csv_out)  // with the reason (was: none; "nodir/x.csv" is a missing folder)
      throw UsageError(fmt::format("--csv {}: cannot be written: {}", csv,
                                   errno != 0 ? std::strerror(errno) : "unknown reason"));
    csv_out << kCsvHeader << "\n";
  }
  std::ofstream plot_out;
  if (!plot.empty()) {
    // the plots too: the plotting script writing into a FIFO would block
    // (was: a Python traceback and a hint about matplotlib)
    for (const char* suffix : {".jsonl", "-throughput.png", "-efficiency.png"})
      summa::io::require_regular_file(plot + suffix, "--plot");
    plot_out.open(plot + ".jsonl");
    if (!plot_out) throw UsageError(fmt::format("--plot {}.jsonl: cannot be written", plot));
  }
  for (const Result& r : results) {
    const double b = static_cast<double>(r.point.batch);
    const double thru = b / r.step, infer = b / r.fwd;
    const Result& f = *first.at(family(r));
    const double f_thru = static_cast<double>(f.point.batch) / f.step;
    // Efficiency against the first point of the scheme family: weak, the
    // model flop/s per GPU relative to the first's; strong (the same
    // problem), the speedup over the first divided by the GPU ratio.
    const double per_gpu = r.flops_per_step / r.step / r.point.gpus;
    const double first_per_gpu = f.flops_per_step / f.step / f.point.gpus;
    const double gpu_ratio = static_cast<double>(r.point.gpus) / f.point.gpus;
    const double eff = study.kind == "weak" ? per_gpu / first_per_gpu : (thru / f_thru) / gpu_ratio;
    const auto& at = throughput_at[r.point.gpus];
    const double speedup =
        at.count("2d") && at.count("1d") ? at.at("2d") / at.at("1d") : std::nan("");
    const double tflops = r.flops_per_step / r.step / r.point.gpus / 1e12;
    const auto paper = [](const std::optional<double>& v) {
      return v ? fmt::format("{:.4f}", *v) : std::string("-");
    };
    const bool was_run = r.measured_fwd.has_value();
    const double measured =
        was_run ? r.measured_fwd.value() + r.measured_bwd.value() : std::nan("");
    const double whole = was_run ? r.predicted_whole.value() : std::nan("");
    table << fmt::format(
        "{:>5} {:>22} {:>6} {:>6} {:>5} {:>9.4f} {:>9} {:>9.4f} {:>9} {:>8.4f} {:>8.4f} "
        "{:>6.3f} {:>6} {:>8.2f}",
        r.point.gpus, r.scheme, r.point.batch, r.point.hidden, r.point.heads, r.fwd / b,
        paper(r.point.paper_fwd), r.bwd / b, paper(r.point.paper_bwd), thru, infer, eff,
        std::isnan(speedup) ? std::string("-") : fmt::format("{:.3f}", speedup), tflops);
    // the busiest rank's plan; '!' past the device's memory
    const bool fits = !r.memory_bytes || machine.device.memory_bytes == 0 ||
                      *r.memory_bytes <= machine.device.memory_bytes;
    table << (r.memory_bytes ? fmt::format(" {:>7.2f}{}",
                                           static_cast<double>(*r.memory_bytes) /
                                               static_cast<double>(1ull << 30),
                                           fits ? " " : "!")
                             : fmt::format(" {:>8}", "-"));
    if (largest)
      table << fmt::format(" {:>8}", r.largest_batch ? std::to_string(*r.largest_batch) : "-");
    const double percent = peak > 0 ? 100 * tflops * 1e12 / peak : std::nan("");
    if (peaks)
      table << fmt::format(" {:>12} {:>6.1f} {:>11}",
                           (r.point.framework.empty() ? std::string("-") : r.point.framework) +
                               (offload_of(r.point, study) != study.offload_bucket ? "*" : ""),
                           percent, paper_peak(r.point));
    if (profiles)
      table << fmt::format(" {:>13} {:>9}", summa::model::to_string(r.implementation),
                           r.summa_fwd ? fmt::format("{:.4f}", (*r.summa_fwd + *r.summa_bwd) / b)
                                       : std::string("-"));
    if (any_measured) {
      if (was_run)
        table << fmt::format(" {:>9.4f} {:>9.4f} {:>+7.1f}", whole, measured,
                             100 * (whole - measured) / measured);
      else
        table << fmt::format(" {:>9} {:>9} {:>7}", "-", "-", "-");
    }
    table << "\n";
    if (csv_out)
      csv_out << fmt::format(
          "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", r.point.gpus, csv_field(r.scheme),
          r.point.batch, r.point.hidden, r.point.heads, r.fwd / b,
          r.point.paper_fwd ? fmt::format("{}", *r.point.paper_fwd) : "", r.bwd / b,
          r.point.paper_bwd ? fmt::format("{}", *r.point.paper_bwd) : "", thru, infer, eff,
          std::isnan(speedup) ? std::string() : fmt::format("{}", speedup), tflops,
          r.memory_bytes ? fmt::format("{}", *r.memory_bytes) : "",
          was_run ? fmt::format("{}", whole) : "", was_run ? fmt::format("{}", measured) : "");
    json o{{"study", study.name},      {"kind", study.kind},
           {"machine", machine.name},  {"gpus", r.point.gpus},
           {"scheme", r.scheme},       {"batch", r.point.batch},
           {"seq", r.point.seq},       {"layers", r.point.layers},
           {"hidden", r.point.hidden}, {"heads", r.point.heads},
           {"vocab", r.point.vocab},   {"predicted_step_s", r.step},
           {"predicted_fwd_s", r.fwd}, {"predicted_bwd_s", r.bwd},
           {"throughput", thru},       {"inference_throughput", infer},
           {"efficiency", eff},        {"tflops_per_gpu", tflops}};
    if (r.step_low) {
      o["predicted_step_s_low"] = *r.step_low;
      o["predicted_step_s_high"] = *r.step_high;
    }
    if (!std::isnan(speedup)) o["speedup_2d_1d"] = speedup;
    if (!std::isnan(percent)) o["percent_of_peak"] = percent;
    if (!r.point.framework.empty()) o["framework"] = r.point.framework;
    if (r.point.paper_peak_low) {
      o["paper_percent_of_peak_low"] = *r.point.paper_peak_low;
      o["paper_percent_of_peak_high"] = *r.point.paper_peak_high;
    }
    if (offload_of(r.point, study) > 0) o["offload_bucket"] = offload_of(r.point, study);
    o["implementation"] = summa::model::to_string(r.implementation);
    if (r.priced_scheme != r.scheme) o["priced_scheme"] = r.priced_scheme;
    if (r.summa_fwd) {
      o["summa_fwd_s"] = *r.summa_fwd;
      o["summa_bwd_s"] = *r.summa_bwd;
      o["summa_step_s"] = *r.summa_fwd + *r.summa_bwd;
    }
    if (r.memory_bytes) {
      o["memory_per_gpu_bytes"] = *r.memory_bytes;
      o["memory_fits"] = fits;
      o["inference_memory_per_gpu_bytes"] = r.inference_memory_bytes;
    }
    if (!r.plan_note.empty()) o["plan_note"] = r.plan_note;
    if (r.largest_batch) {
      o["largest_batch"] = *r.largest_batch;
      o["batch_granularity"] = summa::batch_granularity(summa::SchemeSpec::parse(r.scheme));
    }
    if (!r.largest_note.empty()) o["largest_batch_note"] = r.largest_note;
    if (r.point.paper_fwd && r.point.paper_bwd) {
      o["validation_role"] = within_one_node(r, machine) ? "fit" : "held-out";
      o["step_error"] = (r.step / b - (*r.point.paper_fwd + *r.point.paper_bwd)) /
                        (*r.point.paper_fwd + *r.point.paper_bwd);
      o["paper_fwd_per_sample_s"] = *r.point.paper_fwd;
      o["paper_bwd_per_sample_s"] = *r.point.paper_bwd;
      o["paper_throughput"] = 1 / (*r.point.paper_fwd + *r.point.paper_bwd);
      o["paper_inference_throughput"] = 1 / *r.point.paper_fwd;
    }
    if (was_run) {
      // the measured whole step, efficiency against the family's first
      // measured point the way the predicted one is defined
      const Result& fm = *std::find_if(results.begin(), results.end(), [&](const Result& x) {
        return scheme_family(x.scheme) == scheme_family(r.scheme) && x.measured_fwd;
      });
      const double fm_step = *fm.measured_fwd + *fm.measured_bwd;
      const double fm_thru = static_cast<double>(fm.point.batch) / fm_step;
      const double m_thru = b / measured;
      const double m_ratio = static_cast<double>(r.point.gpus) / fm.point.gpus;
      o["predicted_whole_step_s"] = whole;
      o["measured_step_s"] = measured;
      o["measured_fwd_s"] = *r.measured_fwd;
      o["measured_bwd_s"] = *r.measured_bwd;
      o["measured_throughput"] = m_thru;
      o["measured_inference_throughput"] =
          b / (r.measured_inference_fwd ? *r.measured_inference_fwd : *r.measured_fwd);
      o["measured_efficiency"] = study.kind == "weak"
                                     ? (r.flops_per_step / measured / r.point.gpus) /
                                           (fm.flops_per_step / fm_step / fm.point.gpus)
                                     : (m_thru / fm_thru) / m_ratio;
      o["prediction_error"] = (whole - measured) / measured;
    }
    if (!r.run_note.empty()) o["run_note"] = r.run_note;
    if (!r.ranked.empty()) {
      json top = json::array();
      for (const auto& [scheme, step] : r.ranked)
        top.push_back({{"scheme", scheme}, {"predicted_step_s", step}});
      o["top"] = top;
    }
    if (as_json) std::cout << o.dump() << "\n";
    if (plot_out) plot_out << o.dump() << "\n";
  }
  if (!as_json) std::cout << table.str() << held_out_table(results, machine);
  std::cout.flush();  // before the notes on stderr
  for (const Result& r : results)
    if (!r.plan_note.empty())
      std::cerr << fmt::format("scaling_study: {} on {} device(s): the scheme refuses it: {}\n",
                               r.scheme, r.point.gpus, r.plan_note);
  for (const Result& r : results)
    if (!r.largest_note.empty() && r.plan_note.empty())
      std::cerr << fmt::format("scaling_study: {} on {} device(s): no largest batch: {}\n",
                               r.scheme, r.point.gpus, r.largest_note);
  if (std::any_of(results.begin(), results.end(), [&](const Result& r) {
        return r.memory_bytes && machine.device.memory_bytes > 0 &&
               *r.memory_bytes > machine.device.memory_bytes;
      }))
    std::cerr << fmt::format(
        "scaling_study: '!' marks plans beyond the {:.1f} GiB of a {} device (model buffers "
        "and AdamW state of the busiest rank)\n",
        static_cast<double>(machine.device.memory_bytes) / static_cast<double>(1ull << 30),
        machine.name);
  for (const Result& r : results)
    if (!r.run_note.empty())
      std::cerr << fmt::format("scaling_study: {} on {} device(s) not run: {}\n", r.scheme,
                               r.point.gpus, r.run_note);
  if (!cluster.empty()) {
    std::string args;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a != "--run") args += " " + a;
    }
    std::cerr << "scaling_study: points beyond this launch of " << world
              << " rank(s); on a cluster, one job per device count:\n";
    for (int g : cluster)
      std::cerr << fmt::format("  srun -n {} {} --run --gpus {}{}\n", g, argv[0], g, args);
  }
  if (plot_out) {
    plot_out.close();
    // the interpreter chosen at configure time (cmake/SummaPython.cmake)
    const std::string python = SUMMA_PYTHON_EXECUTABLE;
    if (python.empty())
      throw UsageError(
          fmt::format("--plot: this build found no Python 3 (wrote {}.jsonl; "
                      "reconfigure with -DSUMMA_PYTHON=/path/to/python3)",
                      plot));
    const std::string command =
        fmt::format("'{}' '{}' '{}.jsonl' --out '{}'", python, SUMMA_PLOT_SCALING, plot, plot);
    if (std::system(command.c_str()) != 0)
      throw UsageError(
          fmt::format("--plot: '{}' failed (can {} import matplotlib? Debian: "
                      "python3-matplotlib)",
                      command, python));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  summa::init_mpi(&argc, &argv, 0);  // MPI_Init under --watchdog's limit (default off)
  int rank = 0, world = 1, code = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  try {
    code = study_main(argc, argv, rank, world);
  } catch (const std::exception& e) {  // usage and summa errors: alike on every rank
    if (rank == 0) std::cerr << "scaling_study: error: " << e.what() << "\n";
    code = 2;
  }
  summa::finalize_mpi();
  return code;
}
