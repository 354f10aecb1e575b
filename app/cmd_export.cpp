// dstrain export: a checkpoint's parameters as safetensors, with the Hugging Face
// config.json (LlamaForCausalLM, or DeepseekV3/V2ForCausalLM for latent-attention
// models) and the run's tokenizer.json, for `transformers`.
// Also the helpers the checkpoint tools share (commands.hpp).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckpt/safetensors.hpp"
#include "commands.hpp"
#include "config/deck.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"
#include "data/byte_vocab.hpp"
#include "data/tokenizer/bpe_tokenizer.hpp"
#include "model/hf_config.hpp"
#include "model/plan.hpp"

namespace dst::app {

namespace fs = std::filesystem;
using ckpt::CheckpointError;

int with_checkpoint_errors(const std::function<int()>& body) {
  try {
    return body();
  } catch (const CheckpointError& e) {
    throw CollectiveError(e.what(), kExitCheckpoint);
  }
}

CheckpointModel load_checkpoint_model(ckpt::Reader& reader) {
  CheckpointModel out;
  try {
    out.config =
        config::load_deck_text(reader.metadata().deck_yaml, reader.path() + " (stored deck)");
  } catch (const DeckError& e) {
    throw CheckpointError(
        CheckpointError::Kind::format,
        "checkpoint " + reader.path() + ": its stored deck is invalid: " + e.what());
  }
  const config::ModelSection& m = out.config.model;
  out.params = std::make_unique<model::ParamStore>(model::dense_parameter_layout(m),
                                                   tensor::Arena::Mode::allocate);
  model::ParamStore& ps = *out.params;
  std::set<std::string> expected;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const model::ParamSpec& s = ps.spec(i);
    const std::string name = "params/" + s.name;
    expected.insert(name);
    if (reader.find(name) == nullptr)
      throw CheckpointError(CheckpointError::Kind::mismatch,
                            "checkpoint " + reader.path() + " has no tensor " + name +
                                " that its deck's model (preset " + m.preset + ") needs");
    std::vector<std::int64_t> shape(s.shape.dims.begin(), s.shape.dims.begin() + s.shape.rank);
    reader.read(name, shape, ps.param(i).ptr<float>());
  }
  for (const ckpt::TensorInfo& t : reader.tensors())
    if (t.name.rfind("params/", 0) == 0 && expected.count(t.name) == 0)
      throw CheckpointError(CheckpointError::Kind::mismatch,
                            "checkpoint " + reader.path() + " has a parameter " + t.name +
                                " that its deck's model does not have");
  return out;
}

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) throw Error("export: cannot write " + path.string());
}

}  // namespace

int run_export(runtime::Runtime& rt, const Command& cmd) {
  const ExportOptions& o = cmd.export_;
  return with_checkpoint_errors([&] {
    ckpt::Reader reader(rt.world(), o.checkpoint, o.timeout_s);
    const ckpt::Metadata& meta = reader.metadata();
    const CheckpointModel cm = load_checkpoint_model(reader);
    const config::ModelSection& m = cm.config.model;
    if (rt.rank() != 0) return kExitOk;  // every rank read alike; rank 0 writes

    const fs::path dir(o.out_dir);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error("export: cannot create " + dir.string() + ": " + ec.message());

    // The tokenizer: its ids for config.json, its file when the run had one.
    model::HfConfigOptions hf;
    hf.torch_dtype = o.dtype == "bf16" ? "bfloat16" : "float32";
    std::string tokenizer_note;
    if (!meta.tokenizer_json.empty()) {
      const auto tok = data::BpeTokenizer::from_json(meta.tokenizer_json,
                                                     reader.path() + " (stored tokenizer.json)");
      if (tok->bos_id()) hf.bos_token_id = *tok->bos_id();
      if (tok->eos_id()) hf.eos_token_id = *tok->eos_id();
      write_text(dir / "tokenizer.json", meta.tokenizer_json);
      tokenizer_note = "tokenizer.json (" + meta.tokenizer_name + ")";
    } else if (meta.tokenizer_name == "byte260" ||
               (meta.tokenizer_name.empty() && m.vocab_size == data::kByteVocabSize)) {
      // (No name recorded and a 260-id model: the byte vocabulary, as generate assumes.)
      hf.bos_token_id = data::kByteBos;
      hf.eos_token_id = data::kByteEos;
      fs::remove(dir / "tokenizer.json", ec);  // none: do not leave a stale one
      tokenizer_note =
          "no tokenizer file: byte260 has no Hugging Face tokenizer (ids 0-255 are the bytes, "
          "256 <|bos|>, 257 <|eos|>, 258 <|pad|>, 259 <|unk|>; see docs/tools.md)";
    } else {
      tokenizer_note =
          "no tokenizer file: the checkpoint stores none (tokenizer '" + meta.tokenizer_name + "')";
    }

    // Before any weight is written: a model transformers has no architecture for fails here.
    const std::string config_text = model::hf_config_json(m, hf);
    const model::ParamStore& ps = *cm.params;
    std::vector<ckpt::StTensor> tensors;
    const auto add = [&](const std::string& name, std::size_t i) {
      const model::ParamSpec& s = ps.spec(i);
      tensors.push_back(
          {name,
           std::vector<std::int64_t>(s.shape.dims.begin(), s.shape.dims.begin() + s.shape.rank),
           ps.param(i).ptr<float>()});
    };
    for (std::size_t i = 0; i < ps.size(); ++i)
      add(ps.spec(i).name, i);
    // The multi-token prediction module as DeepSeek-V3's checkpoints store their layer
    // model.layers.<n_layers>: with copies of the embedding and of the output projection
    // (embed_tokens, shared_head.head), which dstrain shares with the model. transformers
    // does not build the module and leaves these tensors unread (docs/model.md).
    std::int64_t mtp_copies = 0;
    if (m.mtp_depth > 0) {
      const std::string prefix = "model.layers." + std::to_string(m.n_layers) + ".";
      add(prefix + "embed_tokens.weight", ps.index_of("model.embed_tokens.weight"));
      add(prefix + "shared_head.head.weight",
          ps.index_of(m.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"));
      mtp_copies = 2;
    }
    const std::map<std::string, std::string> st_meta{
        {"dstrain_checkpoint", fs::path(reader.path()).filename().string()},
        {"dstrain_step", std::to_string(meta.step)},
        {"dstrain_software", meta.software_version}};
    const auto dtype = o.dtype == "bf16" ? ckpt::StDType::bf16 : ckpt::StDType::f32;
    const std::uint64_t bytes =
        ckpt::write_safetensors((dir / "model.safetensors").string(), tensors, dtype, st_meta);
    write_text(dir / "config.json", config_text);

    std::printf("exported %s (step %lld) to %s:\n", reader.path().c_str(),
                static_cast<long long>(meta.step), dir.string().c_str());
    std::printf("  model.safetensors  %zu tensors, %s parameters, %s, %s\n", tensors.size(),
                model::format_count(static_cast<double>(ps.parameter_count())).c_str(),
                o.dtype.c_str(), model::format_bytes(static_cast<double>(bytes)).c_str());
    if (mtp_copies > 0)
      std::printf(
          "  MTP module         model.layers.%lld.* as DeepSeek-V3 stores it (with %lld "
          "copies of shared tensors; transformers does not read the module)\n",
          static_cast<long long>(m.n_layers), static_cast<long long>(mtp_copies));
    std::printf("  config.json        %s (%lld layers, d_model %lld, vocab %lld)\n",
                m.mla() ? (m.n_routed_experts > 0 && m.moe.score == config::MoeScore::softmax
                               ? "DeepseekV2ForCausalLM"
                               : "DeepseekV3ForCausalLM")
                        : "LlamaForCausalLM",
                static_cast<long long>(m.n_layers), static_cast<long long>(m.d_model),
                static_cast<long long>(m.vocab_size));
    std::printf("  %s\n", tokenizer_note.c_str());
    std::printf("optimizer moments are not exported (resume from the checkpoint itself)\n");
    return kExitOk;
  });
}

}  // namespace dst::app
