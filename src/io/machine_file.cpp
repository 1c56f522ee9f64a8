#include "summa/io/machine_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <set>
#include <sstream>

#include "json.hpp"
#include "summa/core/error.hpp"
#include "summa/io/atomic_file.hpp"
#include "summa/io/files.hpp"

namespace summa::io {

namespace {

using detail::describe;
using detail::Json;
using detail::OrderedJson;

constexpr std::string_view kSchema = "summa-machine/1";

// A JSON object being read: every key must be known, the required ones present.
class Reader {
 public:
  Reader(const Json& j, std::string path, std::string_view file)
      : j_(j), path_(std::move(path)), file_(file) {
    if (!j.is_object()) fail(fmt::format("is {}, expected an object", describe(j)));
  }
  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(
        fmt::format("machine file {}: {} {}", file_, path_.empty() ? "the top level" : path_, msg));
  }
  const Json* find(std::string_view key) {
    seen_.insert(std::string(key));
    const auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  const Json& need(std::string_view key) {
    const Json* v = find(key);
    if (v == nullptr) fail(fmt::format("has no \"{}\"", key));
    return *v;
  }
  std::string child(std::string_view key) const {
    return path_.empty() ? fmt::format("\"{}\"", key) : fmt::format("{}.\"{}\"", path_, key);
  }
  Reader object(std::string_view key) { return Reader(need(key), child(key), file_); }
  std::string string(std::string_view key, bool required = true) {
    const Json* v = required ? &need(key) : find(key);
    if (v == nullptr) return {};
    if (!v->is_string()) Reader(*v, child(key), file_).fail_value("a string");
    return v->get<std::string>();
  }
  double positive(std::string_view key, bool allow_zero = false) {
    const Json& v = need(key);
    if (!v.is_number() || !(v.get<double>() > 0 || (allow_zero && v.get<double>() == 0)))
      Reader::value_error(v, child(key), file_, allow_zero ? "a number >= 0" : "a number > 0");
    return v.get<double>();
  }
  std::uint64_t count(std::string_view key,
                      std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) {
    const Json& v = need(key);
    const auto n = detail::as_uint64(v);
    if (!n || *n == 0 || *n > max)
      value_error(v, child(key), file_,
                  max == std::numeric_limits<std::uint64_t>::max()
                      ? std::string("a positive integer")
                      : fmt::format("a positive integer up to {}", max));
    return *n;
  }
  /// Every key of the object was asked for.
  void done() const {
    for (const auto& [key, value] : j_.items())
      if (seen_.count(key) == 0) fail(fmt::format("has an unknown key \"{}\"", key));
  }
  [[noreturn]] void fail_value(std::string_view expected) const {
    value_error(j_, path_, file_, expected);
  }
  [[noreturn]] static void value_error(const Json& v, const std::string& path,
                                       std::string_view file, std::string_view expected) {
    throw Error(
        fmt::format("machine file {}: {} is {}, expected {}", file, path, describe(v), expected));
  }
  std::string_view file() const { return file_; }

 private:
  const Json& j_;
  std::string path_;
  std::string_view file_;
  std::set<std::string, std::less<>> seen_;
};

constexpr std::array<std::string_view, 3> kDTypeKeys = {"f32", "f64", "bf16"};

model::GemmModel read_gemm(Reader r) {
  model::GemmModel g;
  g.peak_flops = r.positive("peak_flops");
  g.max_efficiency = r.positive("max_efficiency");
  if (g.max_efficiency > 1) r.fail("\"max_efficiency\" is above 1");
  g.half_flops = r.positive("half_flops", true);
  if (const Json* t = r.find("table")) {
    if (!t->is_array()) Reader::value_error(*t, r.child("table"), r.file(), "an array");
    for (std::size_t i = 0; i < t->size(); ++i) {
      const Json& e = (*t)[i];
      const std::string at = fmt::format("{}[{}]", r.child("table"), i);
      if (!e.is_array() || (e.size() != 4 && e.size() != 5))
        Reader::value_error(e, at, r.file(),
                            "[m, n, k, efficiency] or [m, n, k, efficiency, mode]");
      model::GemmModel::Point p;
      index_t* dims[3] = {&p.m, &p.n, &p.k};
      for (int d = 0; d < 3; ++d) {
        const auto v = detail::as_uint64(e[static_cast<std::size_t>(d)]);
        if (!v || *v == 0)
          Reader::value_error(e, at, r.file(), "[m, n, k, efficiency] with m, n, k > 0");
        *dims[d] = static_cast<index_t>(*v);
      }
      if (!e[3].is_number() || !(e[3].get<double>() > 0) || e[3].get<double>() > 1)
        Reader::value_error(e, at, r.file(), "[m, n, k, efficiency] with 0 < efficiency <= 1");
      p.efficiency = e[3].get<double>();
      if (e.size() == 5) {
        const auto mode = std::find_if(
            model::all_gemm_modes.begin(), model::all_gemm_modes.end(),
            [&](model::GemmMode x) { return e[4].is_string() && e[4] == model::name_of(x); });
        if (mode == model::all_gemm_modes.end())
          Reader::value_error(e, at, r.file(),
                              "[m, n, k, efficiency, mode] with mode nn, nt or tn");
        p.mode = *mode;
      }
      g.table.push_back(p);
    }
  }
  r.done();
  return g;
}

model::Algorithm read_algorithm(Reader& r) {
  const std::string a = r.string("algorithm");
  for (model::Algorithm alg :
       {model::Algorithm::ring, model::Algorithm::tree, model::Algorithm::direct})
    if (model::name_of(alg) == a) return alg;
  r.fail(fmt::format("has \"algorithm\": \"{}\", expected one of ring, tree, direct", a));
}

model::LinkLevel read_level(Reader r) {
  model::LinkLevel level;
  for (model::Collective c : model::all_collectives) {
    Reader cr = r.object(model::name_of(c));
    model::CollectiveCost& cost = level[c];
    cost.alpha_s = cr.positive("alpha_s", true);
    cost.beta_bytes_s = cr.positive("beta_bytes_s");
    cost.algorithm = read_algorithm(cr);
    if (const Json* t = cr.find("sizes")) {  // [[up_to_bytes, alpha_s, beta_bytes_s], ...]
      const std::string where = cr.child("sizes");
      const char* form =
          "[up_to_bytes, alpha_s, beta_bytes_s] with up_to_bytes and beta > 0, "
          "alpha >= 0";
      if (!t->is_array() || t->empty())
        Reader::value_error(*t, where, cr.file(), "a non-empty array");
      for (std::size_t i = 0; i < t->size(); ++i) {
        const Json& e = (*t)[i];
        const std::string at = fmt::format("{}[{}]", where, i);
        const auto number = [&](std::size_t k) { return e[k].is_number(); };
        if (!e.is_array() || e.size() != 3 || !number(0) || !number(1) || !number(2) ||
            !(e[0].get<double>() > 0) || !(e[1].get<double>() >= 0) || !(e[2].get<double>() > 0))
          Reader::value_error(e, at, cr.file(), form);
        const model::CollectiveCost::Range range{e[0].get<double>(), e[1].get<double>(),
                                                 e[2].get<double>()};
        if (!cost.ranges.empty() && !(range.up_to_bytes > cost.ranges.back().up_to_bytes))
          Reader::value_error(e, at, cr.file(),
                              fmt::format("up_to_bytes above the previous range's {}",
                                          cost.ranges.back().up_to_bytes));
        cost.ranges.push_back(range);
      }
    }
    cr.done();
  }
  r.done();
  return level;
}

}  // namespace

model::Machine parse_machine(std::string_view text, std::string_view what) {
  Json root;
  try {
    root = detail::parse_json(text);
  } catch (const Error& e) {
    throw Error(fmt::format("machine file {}: {}", what, e.what()));
  }
  Reader r(root, "", what);
  if (const std::string schema = r.string("schema"); schema != kSchema)
    r.fail(fmt::format("has \"schema\": \"{}\", expected \"{}\"", schema, kSchema));
  model::Machine m;
  m.name = r.string("name");
  m.source = r.string("source", false);
  // stored in an int (was: 2147483648 wrapped, then "incomplete description")
  m.devices_per_node = static_cast<int>(
      r.count("devices_per_node", static_cast<std::uint64_t>(std::numeric_limits<int>::max())));
  {
    Reader d = r.object("device");
    m.device.name = d.string("name");
    m.device.gemm_library = d.string("gemm_library", false);
    m.device.memory_bytes = d.count("memory_bytes");
    m.device.memory_bandwidth = d.positive("memory_bandwidth");
    if (d.find("host_bandwidth") != nullptr)  // optional: 0 (a CPU) when absent
      m.device.host_bandwidth = d.positive("host_bandwidth", true);
    if (d.find("launch_s") != nullptr)  // optional: 0 (free) when absent
      m.device.launch_s = d.positive("launch_s", true);
    Reader g = d.object("gemm");
    bool any = false;
    for (std::size_t t = 0; t < kDTypeKeys.size(); ++t)
      if (g.find(kDTypeKeys[t]) != nullptr) {
        m.device.gemm[t] = read_gemm(g.object(kDTypeKeys[t]));
        any = true;
      }
    g.done();
    if (!any) g.fail("has none of \"f32\", \"f64\", \"bf16\"");
    if (d.find("pointwise") != nullptr) {  // optional: rates of compute-bound kernels
      Reader p = d.object("pointwise");
      for (std::size_t t = 0; t < kDTypeKeys.size(); ++t)
        if (p.find(kDTypeKeys[t]) != nullptr) {
          Reader rates = p.object(kDTypeKeys[t]);
          for (model::Pointwise f : model::all_pointwise)
            if (rates.find(model::name_of(f)) != nullptr)
              m.device.pointwise[t][static_cast<std::size_t>(f)] =
                  rates.positive(model::name_of(f));
          rates.done();
        }
      p.done();
    }
    d.done();
  }
  {
    Reader links = r.object("links");
    m.intra_node = read_level(links.object("intra_node"));
    m.inter_node = read_level(links.object("inter_node"));
    links.done();
  }
  if (r.find("spread") != nullptr) {  // optional: a calibration's spreads (relative)
    Reader sp = r.object("spread");
    // a relative spread: 0.05 is 5 % (above 1 where the repetitions'
    // quartiles lie further apart than their median)
    const auto fraction = [&](Reader& at, std::string_view key) { return at.positive(key, true); };
    for (const auto& [key, per_type] :
         {std::pair{"gemm", &m.spread.gemm}, std::pair{"pointwise", &m.spread.pointwise}})
      if (sp.find(key) != nullptr) {
        Reader t = sp.object(key);
        for (std::size_t k = 0; k < kDTypeKeys.size(); ++k)
          if (t.find(kDTypeKeys[k]) != nullptr) (*per_type)[k] = fraction(t, kDTypeKeys[k]);
        t.done();
      }
    for (const auto& [key, value] : {std::pair{"memory_bandwidth", &m.spread.memory_bandwidth},
                                     std::pair{"intra_node", &m.spread.intra_node},
                                     std::pair{"inter_node", &m.spread.inter_node},
                                     std::pair{"contention", &m.spread.contention}})
      if (sp.find(key) != nullptr) *value = fraction(sp, key);
    sp.done();
  }
  if (r.find("contention") != nullptr) {  // optional: overlap's slowdowns (relative)
    Reader c = r.object("contention");
    m.contention.compute = c.positive("compute", true);
    m.contention.comm = c.positive("comm", true);
    c.done();
  }
  r.done();
  return m;
}

model::Machine load_machine(const std::string& path) {
  // a machine file is a few kilobytes: 16 MiB is far beyond any real one
  return parse_machine(read_small_file(path, std::uint64_t{16} << 20, "machine file"), path);
}

std::string machine_json(const model::Machine& m) {
  OrderedJson root;
  root["schema"] = kSchema;
  root["name"] = m.name;
  if (!m.source.empty()) root["source"] = m.source;
  root["devices_per_node"] = m.devices_per_node;
  OrderedJson device;
  device["name"] = m.device.name;
  if (!m.device.gemm_library.empty()) device["gemm_library"] = m.device.gemm_library;
  device["memory_bytes"] = m.device.memory_bytes;
  device["memory_bandwidth"] = m.device.memory_bandwidth;
  if (m.device.host_bandwidth > 0) device["host_bandwidth"] = m.device.host_bandwidth;
  if (m.device.launch_s > 0) device["launch_s"] = m.device.launch_s;
  OrderedJson gemm = OrderedJson::object();
  for (std::size_t t = 0; t < kDTypeKeys.size(); ++t) {
    const model::GemmModel& g = m.device.gemm[t];
    if (g.peak_flops <= 0) continue;
    OrderedJson o;
    o["peak_flops"] = g.peak_flops;
    o["max_efficiency"] = g.max_efficiency;
    o["half_flops"] = g.half_flops;
    if (!g.table.empty()) {
      OrderedJson table = OrderedJson::array();
      for (const auto& p : g.table) {
        if (p.mode == model::GemmMode::nn)  // the 4-entry form: as before modes
          table.push_back({p.m, p.n, p.k, p.efficiency});
        else
          table.push_back({p.m, p.n, p.k, p.efficiency, model::name_of(p.mode)});
      }
      o["table"] = table;
    }
    gemm[std::string(kDTypeKeys[t])] = o;
  }
  device["gemm"] = gemm;
  OrderedJson pointwise = OrderedJson::object();
  for (std::size_t t = 0; t < kDTypeKeys.size(); ++t) {
    OrderedJson rates = OrderedJson::object();
    for (model::Pointwise f : model::all_pointwise)
      if (const double r = m.device.pointwise[t][static_cast<std::size_t>(f)]; r > 0)
        rates[std::string(model::name_of(f))] = r;
    if (!rates.empty()) pointwise[std::string(kDTypeKeys[t])] = rates;
  }
  if (!pointwise.empty()) device["pointwise"] = pointwise;
  root["device"] = device;
  OrderedJson links;
  for (auto [name, level] :
       {std::pair{"intra_node", &m.intra_node}, std::pair{"inter_node", &m.inter_node}}) {
    OrderedJson l;
    for (model::Collective c : model::all_collectives) {
      const model::CollectiveCost& cost = (*level)[c];
      OrderedJson one = {{"alpha_s", cost.alpha_s},
                         {"beta_bytes_s", cost.beta_bytes_s},
                         {"algorithm", model::name_of(cost.algorithm)}};
      if (!cost.ranges.empty()) {
        OrderedJson sizes = OrderedJson::array();
        for (const model::CollectiveCost::Range& r : cost.ranges)
          sizes.push_back({r.up_to_bytes, r.alpha_s, r.beta_bytes_s});
        one["sizes"] = sizes;
      }
      l[std::string(model::name_of(c))] = one;
    }
    links[name] = l;
  }
  root["links"] = links;
  if (m.spread.any()) {
    OrderedJson sp;
    for (const auto& [key, per_type] :
         {std::pair{"gemm", &m.spread.gemm}, std::pair{"pointwise", &m.spread.pointwise}}) {
      OrderedJson t = OrderedJson::object();
      for (std::size_t k = 0; k < kDTypeKeys.size(); ++k)
        if ((*per_type)[k] > 0) t[std::string(kDTypeKeys[k])] = (*per_type)[k];
      if (!t.empty()) sp[key] = t;
    }
    for (const auto& [key, value] : {std::pair{"memory_bandwidth", m.spread.memory_bandwidth},
                                     std::pair{"intra_node", m.spread.intra_node},
                                     std::pair{"inter_node", m.spread.inter_node},
                                     std::pair{"contention", m.spread.contention}})
      if (value > 0) sp[key] = value;
    root["spread"] = sp;
  }
  if (m.contention.any())
    root["contention"] = {{"compute", m.contention.compute}, {"comm", m.contention.comm}};
  return root.dump(2) + "\n";
}

void save_machine(const std::string& path, const model::Machine& machine) {
  write_file_atomic(path, machine_json(machine));
}

}  // namespace summa::io
