// Test helper for the checkpoint tools (docs/tools.md), independent of training:
//   ckpt_tool make OUT_DIR [--step N] [--scale F] [--tokenizer-json FILE]
//                  [--tokenizer-name NAME] [--set key=value ...]
//       a checkpoint of freshly initialised parameters (run.seed; normal-initialised
//       tensors multiplied by F so logits are not all ~0) plus zero optimizer moments,
//       saved through ckpt::Directory::save as training saves; prints the file's path.
//   ckpt_tool logits CKPT.h5 OUT_PREFIX [--batch B] [--seq T]
//       reads the parameters back through ckpt::Reader and writes, for a fixed batch of
//       tokens: OUT_PREFIX.tokens.i32 (B, T), OUT_PREFIX.model.f32 (B, T, V) from
//       LanguageModel::forward, OUT_PREFIX.decoder.f32 (B, T, V) from the KV-cache decoder
//       (half of each sequence as a prompt, the rest one token at a time; not for
//       latent-attention or MoE models, which the decoder refuses). Raw little-endian
//       arrays (numpy.fromfile).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "config/deck.hpp"
#include "core/rng.hpp"
#include "core/version.hpp"
#include "model/decoder.hpp"
#include "model/language_model.hpp"

namespace {

std::vector<std::int64_t> dims(const dst::tensor::Shape& s) {
  return {s.dims.begin(), s.dims.begin() + s.rank};
}

template <class T>
void write_raw(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(T)));
  if (!f) throw std::runtime_error("cannot write " + path);
}

int make(const std::vector<std::string>& args) {
  std::string out, tok_json_file, tok_name = "byte260";
  std::int64_t step = 3;
  float scale = 1.0f;
  std::vector<dst::config::Override> sets;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= args.size()) throw std::runtime_error(a + " needs a value");
      return args[++i];
    };
    if (a == "--step")
      step = std::stoll(next());
    else if (a == "--scale")
      scale = std::stof(next());
    else if (a == "--tokenizer-json")
      tok_json_file = next();
    else if (a == "--tokenizer-name")
      tok_name = next();
    else if (a == "--set")
      sets.push_back(dst::config::parse_override(next()));
    else if (out.empty() && a[0] != '-')
      out = a;
    else
      throw std::runtime_error("unknown argument " + a);
  }
  if (out.empty()) throw std::runtime_error("make: OUT_DIR missing");
  const dst::config::RunConfig cfg = dst::config::load_deck_text("{}", "ckpt_tool", sets);
  dst::model::ParamStore ps(dst::model::dense_parameter_layout(cfg.model),
                            dst::tensor::Arena::Mode::allocate);
  ps.initialize(cfg.run.seed);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    if (ps.spec(i).init != dst::model::Init::normal) continue;
    const auto t = ps.param(i);
    for (std::int64_t j = 0; j < t.numel(); ++j)
      t.ptr<float>()[j] *= scale;
  }
  std::vector<float> zeros(ps.buffer_elements(), 0.0f);
  std::vector<dst::ckpt::TensorRef> tensors;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const auto& s = ps.spec(i);
    tensors.push_back({"params/" + s.name, dims(s.shape), ps.param(i).ptr<float>()});
    tensors.push_back({"optimizer/exp_avg/" + s.name, dims(s.shape), zeros.data() + s.offset});
    tensors.push_back({"optimizer/exp_avg_sq/" + s.name, dims(s.shape), zeros.data() + s.offset});
  }
  dst::ckpt::Metadata meta;
  meta.step = step;
  meta.optimizer_steps = step;
  meta.samples_seen = static_cast<std::uint64_t>(step * cfg.training.global_batch_size);
  meta.consumed = meta.samples_seen;
  meta.seed = cfg.run.seed;
  meta.deck_yaml = dst::config::to_yaml(cfg);
  meta.tokenizer_name = tok_name;
  if (!tok_json_file.empty()) {
    std::ifstream f(tok_json_file, std::ios::binary);
    meta.tokenizer_json.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    if (meta.tokenizer_json.empty()) throw std::runtime_error("cannot read " + tok_json_file);
  }
  meta.software_version =
      "dstrain " + dst::core::version() + " (git " + dst::core::git_hash() + ")";
  meta.global_batch_size = cfg.training.global_batch_size;
  meta.micro_batch_size = cfg.training.micro_batch_size;
  meta.grad_accum_steps = cfg.training.global_batch_size / cfg.training.micro_batch_size;
  dst::ckpt::Directory dir(MPI_COMM_WORLD, out, 60.0);
  const auto stats = dir.save(meta, tensors, 0);
  std::printf("%s\n", stats.path.c_str());
  return 0;
}

int logits(const std::vector<std::string>& args) {
  if (args.size() < 2) throw std::runtime_error("logits: CKPT.h5 OUT_PREFIX needed");
  const std::string path = args[0], prefix = args[1];
  std::int64_t B = 2, T = 16;
  for (std::size_t i = 2; i + 1 < args.size(); i += 2) {
    if (args[i] == "--batch")
      B = std::stoll(args[i + 1]);
    else if (args[i] == "--seq")
      T = std::stoll(args[i + 1]);
    else
      throw std::runtime_error("unknown argument " + args[i]);
  }
  dst::ckpt::Reader reader(MPI_COMM_WORLD, path, 60.0);
  const dst::config::RunConfig cfg =
      dst::config::load_deck_text(reader.metadata().deck_yaml, "stored deck");
  const auto& m = cfg.model;
  dst::model::LanguageModel model(m, B, T, dst::tensor::Arena::Mode::allocate);
  auto& ps = model.params();
  for (std::size_t i = 0; i < ps.size(); ++i)
    reader.read("params/" + ps.spec(i).name, dims(ps.spec(i).shape), ps.param(i).ptr<float>());
  const std::int64_t V = m.vocab_size;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>(dst::core::uniform01(99, 1, i) * static_cast<float>(V));
  model.forward(tokens.data(), tokens.data());
  const auto lg = model.logits();
  const std::vector<float> full(lg.ptr<float>(), lg.ptr<float>() + lg.numel());
  write_raw(prefix + ".tokens.i32", tokens);
  write_raw(prefix + ".model.f32", full);
  std::printf("logits: batch %lld x seq %lld x vocab %lld\n", static_cast<long long>(B),
              static_cast<long long>(T), static_cast<long long>(V));
  std::vector<float> dec_logits(full.size());
  dst::model::Decoder dec(m, ps, T);
  const std::int64_t prompt = T / 2;
  for (std::int64_t b = 0; b < B; ++b) {
    dec.reset();
    const std::int32_t* seq = tokens.data() + b * T;
    float* out = dec_logits.data() + b * T * V;
    auto l = dec.append(seq, prompt, true);
    std::copy(l.ptr<float>(), l.ptr<float>() + prompt * V, out);
    for (std::int64_t t = prompt; t < T; ++t) {
      l = dec.append(seq + t, 1);
      std::copy(l.ptr<float>(), l.ptr<float>() + V, out + t * V);
    }
  }
  write_raw(prefix + ".decoder.f32", dec_logits);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 1;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      const std::vector<std::string> args(argv + 1, argv + argc);
      if (args.empty()) throw std::runtime_error("usage: ckpt_tool make|logits ...");
      const std::vector<std::string> rest(args.begin() + 1, args.end());
      if (args[0] == "make")
        rc = make(rest);
      else if (args[0] == "logits")
        rc = logits(rest);
      else
        throw std::runtime_error("unknown mode " + args[0]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ckpt_tool: error: %s\n", e.what());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
