#pragma once
/// \file spec.hpp
/// A tensor-parallel scheme, its grid and its options as one runtime value,
/// parsed from a short text (the schemes themselves are rows of the registry,
/// schemes/registry.hpp).
///
/// Grammar (items separated by commas, in any order, exactly one scheme):
///   1d:p=P          Megatron-LM 1D over P ranks
///   2d:q=Q          Optimus 2D SUMMA on a Q x Q mesh
///   3d:XxYxZ        AxoNN 3D parallel matrix multiply on an X x Y x Z grid
///   data=D          D data-parallel groups on top (default 1)
///   data=D:zero=Z   ... with the data axis sharded (ZeRO): Z = 0 none
///                   (default), 1 the optimizer state (and bf16's fp32
///                   master weights) split over the D groups, 2 the
///                   gradients too (each group keeps its chunk of them,
///                   reduced onto it; ZeRO-2), 3 the parameters too;
///                   needs D > 1
///   pipe=P[:micro=M][:limit=L][:schedule=S][:split=B1+B2+...]
///                   a pipeline of P stages (PipelineSpec;
///                   parallel/pipeline.hpp): the batch in M microbatches
///                   (default 1), S = axonn (the message-driven schedule,
///                   the default, at most L microbatches in flight, default
///                   P), gpipe or 1f1b, the blocks per stage B1..BP (default:
///                   balanced)
/// and the options of the chosen scheme:
///   1d  sp=on|off      Megatron's sequence parallelism (default off): the
///                      outer activations split by tokens over the P ranks
///       dc=on|off      Megatron's distributed activation checkpoints (default
///                      off; with recompute full, not with sp=on): each rank
///                      keeps 1/P of every block's checkpointed input
///   2d  panel=N        SUMMA panel width (0: a whole block per step; default 256)
///       overlap=on|off SUMMA's double-buffered collectives (default on)
///   3d  overlap=LIST   the AxoNN overlaps on, '+'-separated from oar, ors,
///                      oag, or 'none' (default: oar; see Axonn3DOptions)
/// e.g. "2d:q=3", "1d:p=4", "1d:p=4,sp=on", "1d:p=4,dc=on", "3d:2x2x2", "data=2,2d:q=2",
/// "pipe=4:micro=8:limit=4,2d:q=2", "data=2,pipe=2:micro=4:schedule=1f1b,1d:p=2",
/// "data=4:zero=1,1d:p=2", "2d:q=2,panel=128,overlap=off", "3d:1x1x4,overlap=oar+ors+oag". Each
/// scheme's options are its own type (Megatron1DSpec, Summa2DSpec, Axonn3DSpec in
/// schemes/<scheme>/spec.hpp), read with spec.as<...>().

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "summa/core/error.hpp"

namespace summa {

/// A scheme's own options (its grid's sizes and its switches), as that
/// scheme's type, defined in its folder (schemes/<scheme>/spec.hpp) by
/// deriving from SchemeOptionsOf<Self>. SchemeSpec holds one.
class SchemeOptions {
 public:
  virtual ~SchemeOptions() = default;
  virtual std::unique_ptr<SchemeOptions> clone() const = 0;
  virtual bool equals(const SchemeOptions& other) const = 0;
};

/// The base of a scheme's options type `Self` (a struct with a defaulted
/// operator==): copying and comparing through SchemeOptions.
template <class Self>
class SchemeOptionsOf : public SchemeOptions {
 public:
  std::unique_ptr<SchemeOptions> clone() const override {
    return std::make_unique<Self>(static_cast<const Self&>(*this));
  }
  bool equals(const SchemeOptions& other) const override {
    const auto* o = dynamic_cast<const Self*>(&other);
    return o != nullptr && *o == static_cast<const Self&>(*this);
  }
  friend bool operator==(const SchemeOptionsOf&, const SchemeOptionsOf&) { return true; }
};

/// A pipeline's schedule (parallel/pipeline.hpp).
enum class PipeSchedule : std::uint8_t {
  axonn,        ///< AxoNN's message-driven schedule
  gpipe,        ///< all forwards, then all backwards
  one_f_one_b,  ///< PipeDream-flush (Megatron-LM's 1F1B)
};

/// "axonn", "gpipe" or "1f1b".
std::string_view to_string(PipeSchedule s);
/// The inverse of to_string; anything else throws summa::Error naming
/// `text` and `what`.
PipeSchedule parse_pipe_schedule(std::string_view text, std::string_view what);

/// The pipeline axis of a scheme (the text's pipe= item; PipelineGpt).
struct PipelineSpec {
  int stages = 1;  ///< P
  int micro = 1;   ///< microbatches per batch, M (the batch divides into them)
  /// axonn: microbatches in flight at most (AxoNN's pipeline_limit); 0:
  /// `stages`. Capped at `micro`.
  int limit = 0;
  PipeSchedule schedule = PipeSchedule::axonn;
  /// Blocks per stage (P values adding up to n_layer, each >= 1); empty:
  /// pipeline_split's balance.
  std::vector<int> split;
  /// More than one stage or microbatch: the model runs through PipelineGpt.
  bool active() const { return stages > 1 || micro > 1; }
  friend bool operator==(const PipelineSpec&, const PipelineSpec&) = default;
};

struct SchemeSpec {
  /// The scheme: its registry row's tag ("1d", "2d", "3d"; schemes/registry.hpp).
  std::string scheme;
  int data = 1;  ///< data-parallel groups
  /// Sharding of the data axis (ZeRO level): 0 none, 1 the optimizer state
  /// split over the data groups, 2 the gradients too, 3 the parameters too
  /// (docs/training.md, "Sharded data parallelism"). parse() refuses levels
  /// above 3 and a level > 0 with data = 1.
  int zero = 0;
  /// The pipeline axis (inactive by default: one stage, one microbatch).
  PipelineSpec pipeline;

  SchemeSpec() = default;
  /// The scheme `tag` with its options `options` (that scheme's type) and
  /// `data` groups.
  template <class O>
  requires std::is_base_of_v<SchemeOptions, O> SchemeSpec(std::string tag, O options, int data = 1)
      : scheme(std::move(tag)), data(data), options_(std::make_unique<O>(std::move(options))) {}
  SchemeSpec(const SchemeSpec& o)
      : scheme(o.scheme),
        data(o.data),
        zero(o.zero),
        pipeline(o.pipeline),
        options_(o.options_ ? o.options_->clone() : nullptr) {}
  SchemeSpec(SchemeSpec&&) noexcept = default;
  SchemeSpec& operator=(const SchemeSpec& o) {
    if (this != &o) *this = SchemeSpec(o);
    return *this;
  }
  SchemeSpec& operator=(SchemeSpec&&) noexcept = default;
  ~SchemeSpec() = default;

  /// The scheme's options as its type O (e.g. Summa2DSpec); throws
  /// summa::Error when the spec holds another scheme's.
  template <class O>
  const O& as() const {
    const auto* o = dynamic_cast<const O*>(options_.get());
    require(o != nullptr, [&] {
      return std::string("SchemeSpec: scheme '") + scheme + "' holds no options of type " +
             typeid(O).name();
    });
    return *o;
  }
  template <class O>
  O& as() {
    return const_cast<O&>(std::as_const(*this).as<O>());
  }
  /// True when the spec holds options of type O.
  template <class O>
  bool holds() const {
    return dynamic_cast<const O*>(options_.get()) != nullptr;
  }
  /// Sets the scheme's options (the row's parse does, with its tag).
  template <class O>
  requires std::is_base_of_v<SchemeOptions, O>
  void set_options(O options) { options_ = std::make_unique<O>(std::move(options)); }

  /// Ranks of one tensor group (P, Q², X·Y·Z).
  std::int64_t tensor_ranks() const;
  /// All ranks: stages · data · tensor_ranks() (64-bit; parse() refuses a
  /// spec whose product exceeds what an MPI communicator holds).
  std::int64_t ranks() const {
    return static_cast<std::int64_t>(pipeline.stages) * data * tensor_ranks();
  }
  /// The same scheme without its pipeline axis: one stage's.
  SchemeSpec stage() const {
    SchemeSpec s(*this);
    s.pipeline = {};
    return s;
  }
  /// Canonical text, parseable back ("data=2,2d:q=2", "data=2:zero=1,...";
  /// "data=1" and "zero=0" omitted).
  std::string str() const;
  /// Throws summa::Error naming the offending item and the grammar.
  static SchemeSpec parse(std::string_view text);
  friend bool operator==(const SchemeSpec& a, const SchemeSpec& b) {
    return a.scheme == b.scheme && a.data == b.data && a.zero == b.zero &&
           a.pipeline == b.pipeline &&
           (a.options_ == nullptr ? b.options_ == nullptr
                                  : b.options_ != nullptr && a.options_->equals(*b.options_));
  }

 private:
  std::unique_ptr<SchemeOptions> options_;
};

/// Every scheme (without a data axis and with every data factor) whose rank
/// count is exactly `ranks`: 1D at p = ranks / data, 2D when ranks / data is
/// a square, 3D for every factorisation X·Y·Z (and every registered scheme's
/// own, SchemeRow::enumerate).
std::vector<SchemeSpec> schemes_for(int ranks);

}  // namespace summa
