// gpt_generate: text from a GPT-2 trained with summa (a checkpoint of
// gpt_train, saved under any scheme) or from a Hugging Face GPT-2 directory,
// under any tensor-parallel scheme (docs/inference.md).
//
//   mpirun -np 4 gpt_generate --checkpoint gpt_train_out/checkpoints --prompt "The weather"
//   mpirun -np 4 gpt_generate --hf gpt2_dir --scheme 1d:p=4 --prompt-file prompts.txt --json
//
// The prompts run as one batch (rounded up to the scheme's granularity with
// dummy rows) on a model built for inference with a key/value cache
// (GptOptions::kv_cache) of the longest prompt plus --max-new-tokens
// positions; summa::generate decodes one position a step. Prompt plus new
// tokens must fit n_positions: checked before the model is built (the default
// --max-new-tokens shrinks to fit; an explicit one too large is refused). Tokens: GPT-2's
// BPE where the --hf directory (or --tokenizer) has vocab.json + merges.txt
// or encoder.json + vocab.bpe, bytes otherwise (gpt_train's tokenizer). A
// single prompt streams its continuation; at the end the prefill and decode
// rates. --json prints one object per prompt: prompt, tokens, text.
#include <mpi.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flag_checks.hpp"
#include "summa/comm/mpi_init.hpp"
#include "summa/summa.hpp"

namespace {

namespace fs = std::filesystem;

struct Cli {
  std::string checkpoint, hf, tokenizer, prompt_file, scheme, dtype = "float", backend = "cpu",
                                                              comm, cpu_gemm;
  int threads = 1;
  std::vector<std::string> prompts;
  summa::index_t max_new_tokens = 0;  // 0: up to 32, as many as fit the positions
  bool greedy = false, json = false, no_cache = false;
  double temperature = 1.0, top_p = 1.0;
  double watchdog = 600;  // seconds a collective may wait (0: off)
  std::int64_t top_k = 0;
  std::uint64_t seed = 0;
  std::int64_t eos = -2;  // -2: the tokenizer's; -1: none
};

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// 2D on a square rank count, 1D otherwise (as gpt_train).
std::string default_scheme(int ranks) {
  const int q = static_cast<int>(std::lround(std::sqrt(static_cast<double>(ranks))));
  return q * q == ranks ? "2d:q=" + std::to_string(q) : "1d:p=" + std::to_string(ranks);
}

// GPT-2's BPE or gpt_train's bytes.
struct Tokenizer {
  std::optional<summa::io::Gpt2Tokenizer> bpe;
  std::vector<std::int32_t> encode(const std::string& text) const {
    if (bpe) return bpe->encode(text);
    const auto ids = summa::io::ByteTokenizer().encode(text);
    return {ids.begin(), ids.end()};
  }
  std::string decode(std::span<const std::int32_t> ids) const {
    if (bpe) return bpe->decode(ids);
    std::vector<std::uint16_t> bytes(ids.begin(), ids.end());
    return summa::io::ByteTokenizer().decode(bytes);
  }
  int vocab() const { return bpe ? bpe->vocab_size() : summa::io::ByteTokenizer::base_vocab; }
  std::int32_t eos() const { return bpe ? bpe->eos_id() : -1; }
  const char* name() const { return bpe ? "GPT-2 BPE" : "bytes"; }
};

// Where the GPT-2 tokenizer files are, if anywhere.
// A directory flag that names a symbolic link loop or a dangling link: said
// so (was: a raw filesystem_error on every rank, then MPI_ABORT).
void require_reachable(const std::string& dir, const char* flag) {
  if (!dir.empty()) summa::io::require_not_broken_link(dir, flag);
}

std::optional<fs::path> tokenizer_dir(const Cli& cli) {
  // the directories read: each named when it is not one (was: "config file
  // '/x': no such file" for --hf /x, "holds neither vocab.json …" for a
  // --tokenizer that is missing or a FIFO)
  if (!cli.tokenizer.empty()) summa::io::require_directory(cli.tokenizer, "--tokenizer");
  if (!cli.hf.empty()) summa::io::require_directory(cli.hf, "--hf");
  require_reachable(cli.checkpoint, "--checkpoint");
  if (!cli.tokenizer.empty()) return fs::path(cli.tokenizer);
  if (!cli.hf.empty()) {
    const fs::path d(cli.hf);
    std::error_code ec;  // an unreadable entry is "not there": the loader says why
    const auto has = [&](const char* name) { return fs::exists(d / name, ec); };
    if ((has("vocab.json") && has("merges.txt")) || (has("encoder.json") && has("vocab.bpe")))
      return d;
  }
  return std::nullopt;
}

std::string rate(summa::index_t tokens, double seconds) {
  return seconds > 0 ? fmt::format("{:.1f} tokens/s", static_cast<double>(tokens) / seconds)
                     : std::string("-");
}

template <class T>
int run(const Cli& cli) {
  const MPI_Comm world = MPI_COMM_WORLD;
  const bool root = world_rank() == 0;
  // The set-up's agreements (files, prompts, lengths) wait under a watchdog
  // on the whole job: a rank stopped before the model's grid exists ends the
  // job with the report, not a hang (the grid's own watchdog guards the
  // generation).
  summa::WatchdogOptions setup_limit;
  setup_limit.timeout_s = cli.watchdog;
  const summa::Watchdog setup_watchdog(world, setup_limit);
  // Every rank reads the same files and agrees on every error.
  Tokenizer tok;
  std::vector<std::string> texts = cli.prompts;
  summa::GptConfig config;
  {
    std::optional<std::string> error;
    try {
      if (cli.checkpoint.empty() == cli.hf.empty())
        throw summa::Error("give exactly one of --checkpoint DIR and --hf DIR");
      for (std::size_t k = 0; k < cli.prompts.size(); ++k)  // (was: "generate: prompt 0 is empty")
        if (cli.prompts[k].empty())
          throw summa::Error(
              cli.prompts.size() == 1
                  ? std::string("--prompt is empty: give the text to continue")
                  : fmt::format("--prompt number {} (of {}) is empty", k + 1, cli.prompts.size()));
      if (const auto dir = tokenizer_dir(cli)) tok.bpe = summa::io::Gpt2Tokenizer::load(*dir);
      if (!cli.prompt_file.empty()) {
        summa::io::require_regular_file(cli.prompt_file, "--prompt-file");
        // Each prompt fits the model's positions (a few KB of text): a file of
        // more than 64 MiB is a mistake (a corpus, a disk image), refused by
        // its size before it is read into memory.
        std::error_code size_error;
        const std::uintmax_t bytes = fs::file_size(cli.prompt_file, size_error);
        if (!size_error && bytes > (std::uintmax_t{64} << 20))
          throw summa::Error(fmt::format(
              "--prompt-file {}: {} bytes, more than 64 MiB of prompts (one per line, each "
              "within the model's positions); is it the right file?",
              cli.prompt_file, bytes));
        std::ifstream in(cli.prompt_file);
        if (!in) throw summa::Error("--prompt-file " + cli.prompt_file + ": cannot be read");
        for (std::string line; std::getline(in, line);)
          if (!line.empty()) texts.push_back(line);
      }
      if (texts.empty())
        throw summa::Error(cli.prompt_file.empty()
                               ? std::string("no prompt: give --prompt TEXT or --prompt-file F")
                               : "--prompt-file " + cli.prompt_file +
                                     " holds no prompt (no line that is not empty)");
      if (cli.hf.empty()) {
        const summa::CheckpointInfo info = summa::read_checkpoint_info(cli.checkpoint);
        try {  // the manifest's model, named (was: "n_head=0 ...", no file)
          config = summa::config_from_meta(info.meta);
          config.validate();
        } catch (const summa::Error& e) {
          throw summa::Error("--checkpoint " + cli.checkpoint + ": its manifest: " + e.what());
        }
      } else {
        config = summa::io::read_hf_gpt2_config(cli.hf);
      }
      if (tok.vocab() > config.vocab_size)
        throw summa::Error(
            fmt::format("the tokenizer ({}) has {} ids, the model's vocabulary only {}", tok.name(),
                        tok.vocab(), config.vocab_size));
      // An end token the model cannot produce would never stop a prompt.
      if (cli.eos >= tok.vocab())
        throw summa::Error(fmt::format(
            "--eos {}: not an id the model can generate (the tokenizer ({}) has ids 0..{}; "
            "-1: never stop)",
            cli.eos, tok.name(), tok.vocab() - 1));
    } catch (const summa::Error& e) {
      error = e.what();
    } catch (const fs::filesystem_error& e) {  // a path the checks above did not foresee
      error = e.what();
    }
    summa::agree_on(world, error);
  }
  std::vector<std::vector<std::int32_t>> prompts;
  std::size_t longest = 0;
  for (const std::string& t : texts) {
    prompts.push_back(tok.encode(t));
    longest = std::max(longest, prompts.back().size());
  }
  summa::SchemeSpec spec;
  try {  // the same text on every rank: the same outcome
    spec = summa::SchemeSpec::parse(cli.scheme.empty() ? default_scheme(world_size()) : cli.scheme);
  } catch (const summa::Error& e) {
    throw summa::CollectiveError(std::string("--scheme: ") + e.what());
  }
  if (spec.ranks() != world_size())
    throw summa::CollectiveError(fmt::format("--scheme {} needs {} ranks, running on {}",
                                             spec.str(), spec.ranks(), world_size()));
  if (spec.pipeline.active()) {  // refused with why, and the scheme that runs instead
    summa::SchemeSpec flat = spec.stage();
    flat.data = spec.data * spec.pipeline.stages;
    flat.zero = 0;
    throw summa::CollectiveError(fmt::format(
        "--scheme {}: gpt_generate runs no pipeline: decoding takes one token at a time through "
        "every block with a key/value cache per block, so each new token would wait on {} stages "
        "in turn (one stage busy at a time); a pipelined run's checkpoint loads under any "
        "unpipelined scheme of the same model, e.g. --scheme {} on these {} ranks "
        "(docs/inference.md)",
        spec.str(), spec.pipeline.stages, flat.str(), world_size()));
  }
  if (spec.zero > 0)  // nothing of training to shard: refused, not ignored
    throw summa::CollectiveError(fmt::format(
        "--scheme {}: zero={} shards training state (the optimizer's, the gradients', with "
        "zero=3 the parameters'), and generation keeps each data group's weights whole: drop "
        "':zero={}'",
        spec.str(), spec.zero, spec.zero));
  // Prompt + new tokens within n_positions, settled before any model is built:
  // a prompt that leaves no room is refused; --max-new-tokens beyond the room
  // of the longest prompt is refused naming the largest that fits; without it,
  // up to 32 new tokens, as many as fit (docs/inference.md, "Lengths").
  summa::index_t max_new_tokens = cli.max_new_tokens;
  {
    const auto positions = static_cast<summa::index_t>(config.n_positions);
    const auto longest_at = static_cast<std::size_t>(
        std::max_element(prompts.begin(), prompts.end(),
                         [](const auto& a, const auto& b) { return a.size() < b.size(); }) -
        prompts.begin());
    const summa::index_t room = positions - static_cast<summa::index_t>(longest);
    std::optional<std::string> error;
    if (room < 1)
      error = fmt::format(
          "prompt {} has {} tokens ({}); the model has n_positions={}, so a prompt may have at "
          "most {} tokens to leave room for one new token",
          longest_at, longest, tok.name(), positions, positions - 1);
    else if (max_new_tokens > room)
      error = fmt::format(
          "--max-new-tokens {}: prompt {} has {} tokens ({}) and the model has n_positions={}, so "
          "at most {} new tokens fit (--max-new-tokens {}, or a shorter prompt)",
          max_new_tokens, longest_at, longest, tok.name(), positions, room, room);
    summa::agree_on(world, error);
    if (max_new_tokens == 0) max_new_tokens = std::min<summa::index_t>(32, room);
  }
  const summa::index_t unit = summa::batch_granularity(spec);
  const auto count = static_cast<summa::index_t>(prompts.size());
  const summa::index_t batch = (count + unit - 1) / unit * unit;
  // the cache: the longest prompt and its new tokens (within the positions)
  const summa::index_t window = static_cast<summa::index_t>(longest) + max_new_tokens;
  summa::GridOptions grid;
  grid.watchdog.timeout_s = cli.watchdog;  // device.grid carries it to the model's grid
  summa::Device device = summa::make_device(world, {.backend = cli.backend,
                                                    .comm = cli.comm,
                                                    .cpu_gemm = cli.cpu_gemm,
                                                    .threads = cli.threads,
                                                    .grid = grid});
  summa::GptOptions options{.inference = true};
  if (!cli.no_cache) options.kv_cache = window;
  // Sizes from the checkpoint or config.json, checked before anything is
  // built (summa/parallel/memory_check.hpp): the planner's message, not
  // bad_alloc.
  summa::require_memory_fits<T>(world, spec, *device.backend, config, batch,
                                cli.no_cache ? window : 1, options, device.grid,
                                {.bytes = summa::available_memory_per_rank(world, *device.backend),
                                 .source = summa::available_memory_source(*device.backend),
                                 .batch_option = "prompts (batch)"},
                                "gpt_generate");
  summa::ParallelGpt<T> run(world, spec, *device.backend, config, batch, cli.no_cache ? window : 1,
                            options, device.grid);
  summa::Gpt<T>& model = run.model();
  if (!cli.hf.empty()) {
    summa::io::import_hf_gpt2(model, cli.hf);
  } else {
    summa::load_parameters(cli.checkpoint, model.parameters_store(), run.grid());
  }
  // NaN weights would "generate" token 0 forever (NUL bytes) and exit 0
  summa::require_finite_values(
      model.parameters_store(), run.grid(),
      cli.hf.empty() ? "--checkpoint " + cli.checkpoint : "--hf " + cli.hf);
  if (root && !cli.json)
    std::fprintf(stdout,
                 "gpt_generate: GPT-2 n_layer=%d n_head=%d n_embd=%d vocab=%d | %s on %d ranks, "
                 "%s | %zu prompt(s), batch %lld | %s tokens | %s\n",
                 config.n_layer, config.n_head, config.n_embd, config.vocab_size,
                 spec.str().c_str(), world_size(), cli.no_cache ? "recomputed" : "kv cache",
                 prompts.size(), static_cast<long long>(batch), tok.name(),
                 cli.greedy ? "greedy"
                            : fmt::format("T={} top_k={} top_p={} seed={}", cli.temperature,
                                          cli.top_k, cli.top_p, cli.seed)
                                  .c_str());
  summa::GenerateOptions g{.max_new_tokens = max_new_tokens,
                           .eos = static_cast<std::int32_t>(cli.eos == -2 ? tok.eos() : cli.eos),
                           .sampling = {.greedy = cli.greedy,
                                        .temperature = cli.temperature,
                                        .top_k = cli.top_k,
                                        .top_p = cli.top_p,
                                        .seed = cli.seed},
                           .vocab_limit = tok.vocab()};
  const bool stream = root && !cli.json && prompts.size() == 1;
  if (stream) {
    std::printf("%s", texts[0].c_str());
    std::fflush(stdout);
    g.on_step = [&](std::span<const std::int32_t> ids) {
      if (ids[0] < 0) return;
      const std::string piece = tok.decode(ids.subspan(0, 1));
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
  }
  const summa::Generation out = summa::generate<T>(model, prompts, g);
  if (!root) return 0;
  if (stream) std::printf("\n");
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    const std::string text = tok.decode(out.tokens[p]);
    if (cli.json) {
      const nlohmann::json o{{"prompt", texts[p]}, {"tokens", out.tokens[p]}, {"text", text}};
      std::printf("%s\n", o.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else if (!stream) {
      std::printf("--- %s\n%s%s\n", texts[p].c_str(), texts[p].c_str(), text.c_str());
    }
  }
  std::fprintf(cli.json ? stderr : stdout,
               "gpt_generate: prefill %lld tokens in %.3f s (%s), decode %lld tokens in %.3f s "
               "(%s), %lld steps\n",
               static_cast<long long>(out.prompt_tokens), out.prefill_s,
               rate(out.prompt_tokens, out.prefill_s).c_str(),
               static_cast<long long>(out.new_tokens), out.decode_s,
               rate(out.new_tokens, out.decode_s).c_str(), static_cast<long long>(out.steps));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  summa::init_mpi(&argc, &argv, Cli{}.watchdog);  // MPI_Init under --watchdog's limit
  Cli cli;
  CLI::App app{"gpt_generate: text from a summa checkpoint or a Hugging Face GPT-2, any scheme"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--checkpoint", cli.checkpoint,
                 "a summa checkpoint: a root (its latest step) or one step directory");
  app.add_option("--hf", cli.hf,
                 "a Hugging Face GPT-2 directory (model.safetensors + config.json)");
  app.add_option("--tokenizer", cli.tokenizer,
                 "GPT-2 BPE files (vocab.json + merges.txt, or encoder.json + vocab.bpe); default: "
                 "the --hf directory's, else bytes");
  app.add_option("--prompt", cli.prompts, "a prompt (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--prompt-file", cli.prompt_file, "prompts, one per line");
  app.add_option("--scheme", cli.scheme,
                 "scheme and grid (2d:q=Q, 1d:p=P[,sp=on|,dc=on], 3d:XxYxZ, with optional data=D); "
                 "default: 2d on a square rank count, else 1d");
  app.add_option("--max-new-tokens", cli.max_new_tokens,
                 "new tokens per prompt at most; prompt + new tokens must fit the model's "
                 "n_positions (refused otherwise, naming the largest that fits); default: 32, "
                 "or as many as fit")
      ->check(summa::flags::integer_in(1, 1 << 20));
  app.add_flag("--greedy", cli.greedy, "the most likely token every step (else sample)");
  app.add_option("--temperature", cli.temperature, "sampling temperature (0: greedy)")
      ->check(summa::flags::real_in(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--top-k", cli.top_k, "sample among the k most likely (0: all)")
      ->check(summa::flags::integer_in(0, 1 << 30))
      ->capture_default_str();
  app.add_option("--top-p", cli.top_p, "sample within the nucleus of this mass (1: all)")
      ->check(summa::flags::real_in(1e-9, 1.0))
      ->capture_default_str();
  app.add_option("--seed", cli.seed, "sampling seed")
      ->check(summa::flags::integer_in(0, 18446744073709551615.0L))
      ->capture_default_str();
  app.add_option("--eos", cli.eos,
                 "stop a prompt at this id (-1: never; default: the tokenizer's end token, "
                 "GPT-2's 50256, none for bytes)")
      ->check(summa::flags::integer_in(-1, 1 << 30));
  app.add_option("--dtype", cli.dtype, "float, double or bf16")
      ->check(CLI::IsMember({"float", "double", "bf16"}))
      ->capture_default_str();
  app.add_option("--backend", cli.backend, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  summa::flags::add_cpu_options(app, cli.cpu_gemm, cli.threads);
  app.add_option("--comm", cli.comm, "mpi, nccl or mpi_staged (default: the backend's)")
      ->check(CLI::IsMember({"mpi", "nccl", "mpi_staged"}));
  app.add_flag("--no-cache", cli.no_cache,
               "recompute the whole window every step instead of the key/value cache");
  app.add_flag("--json", cli.json, "one JSON object per prompt: prompt, tokens, text");
  app.add_option("--watchdog", cli.watchdog,
                 "seconds a collective may wait before the job is ended with a report naming "
                 "the ranks that did not arrive (0: off)")
      ->check(summa::flags::watchdog_seconds())
      ->capture_default_str();
  int code = 0;
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) {
        code = world_rank() == 0 ? app.exit(e) : 0;
      } else {
        if (world_rank() == 0)
          std::fprintf(stderr, "gpt_generate: error: %s (see --help)\n", e.what());
        code = 2;
      }
      summa::finalize_mpi();
      return code;
    }
    code = cli.dtype == "double" ? run<double>(cli)
           : cli.dtype == "bf16" ? run<summa::bf16>(cli)
                                 : run<float>(cli);
  } catch (const summa::CollectiveError& e) {
    std::string_view m = e.what();
    if (m.starts_with("gpt_generate: ")) m.remove_prefix(14);
    if (world_rank() == 0)
      std::fprintf(stderr, "gpt_generate: error: %.*s\n", static_cast<int>(m.size()), m.data());
    code = 1;
  } catch (const std::exception& e) {
    // Seen by this rank alone: the others may wait for it in a collective.
    std::fprintf(stderr, "gpt_generate (rank %d): error: %s; aborting the job\n", world_rank(),
                 e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  summa::finalize_mpi();
  return code;
}
