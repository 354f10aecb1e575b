// dstrain inspect: what a checkpoint holds (metadata, tensors with their checksums, the
// deck), read through the same verified path as resuming (ckpt::Reader).
#include <cinttypes>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "commands.hpp"
#include "config/deck.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "model/plan.hpp"

namespace dst::app {

int run_inspect(runtime::Runtime& rt, const Command& cmd) {
  const InspectOptions& o = cmd.inspect;
  return with_checkpoint_errors([&] {
    ckpt::Reader reader(rt.world(), o.checkpoint, o.timeout_s);
    // Collective: every rank verifies its share, all get the list.
    std::vector<std::string> bad;
    if (o.verify) bad = reader.verify_all();
    if (rt.rank() != 0) return bad.empty() ? kExitOk : kExitCheckpoint;

    const ckpt::Metadata& m = reader.metadata();
    std::printf("checkpoint %s\n", reader.path().c_str());
    const auto row = [](const char* key, const std::string& value) {
      std::printf("  %-18s %s\n", key, value.c_str());
    };
    row("format version", std::to_string(m.format_version));
    row("step", std::to_string(m.step));
    row("epoch / consumed",
        std::to_string(m.epoch) + " / " + std::to_string(m.consumed) + " samples");
    row("samples seen", std::to_string(m.samples_seen));
    row("optimizer steps", std::to_string(m.optimizer_steps));
    row("skipped steps", std::to_string(m.skipped_steps));
    row("seed", std::to_string(m.seed));
    if (!m.rng.empty()) row("rng", m.rng);
    char scale[64];
    std::snprintf(scale, sizeof scale, "%g (%lld clean steps)", m.loss_scale,
                  static_cast<long long>(m.loss_scale_clean_steps));
    row("loss scale", scale);
    row("software", m.software_version);
    row("created", m.created_utc);
    row("world at save",
        std::to_string(m.world_size) + " ranks: data " + std::to_string(m.data_parallel) +
            " x tensor " + std::to_string(m.tensor_parallel) + " x pipeline " +
            std::to_string(m.pipeline_parallel) + "; global batch " +
            std::to_string(m.global_batch_size) + " = micro " + std::to_string(m.micro_batch_size) +
            " x accumulation " + std::to_string(m.grad_accum_steps) + " x data ranks");
    row("tokenizer",
        (m.tokenizer_name.empty() ? std::string("(none recorded)") : m.tokenizer_name) +
            (m.tokenizer_json.empty() ? std::string(", no tokenizer.json stored")
                                      : ", tokenizer.json stored (" +
                                            std::to_string(m.tokenizer_json.size()) + " bytes)"));
    try {
      const config::RunConfig c = config::load_deck_text(m.deck_yaml, "stored deck");
      const auto& md = c.model;
      row("model",
          "preset " + md.preset + ": vocab " + std::to_string(md.vocab_size) + ", d_model " +
              std::to_string(md.d_model) + ", " + std::to_string(md.n_layers) + " layers, " +
              std::to_string(md.n_heads) + " heads (" + std::to_string(md.n_kv_heads) +
              " kv), ffn " + std::to_string(md.ffn_dim) + ", max_seq_len " +
              std::to_string(md.max_seq_len) + ", " +
              model::format_count(static_cast<double>(model::count_parameters(md).total())) +
              " parameters");
    } catch (const Error& e) {
      row("model", std::string("(the stored deck does not parse: ") + e.what() + ")");
    }

    const auto& ts = reader.tensors();
    std::uint64_t bytes = 0;
    std::size_t width = 4;
    for (const auto& t : ts) {
      bytes += ckpt::element_count(t.shape) * 4;
      width = std::max(width, t.name.size());
    }
    std::printf("tensors: %zu, %s\n", ts.size(),
                model::format_bytes(static_cast<double>(bytes)).c_str());
    std::printf("  %-*s  %-14s %-5s %-16s %s\n", static_cast<int>(width), "name", "shape", "dtype",
                "checksum", o.verify ? "status" : "status (not verified: --no-verify)");
    const std::set<std::string> bad_set(bad.begin(), bad.end());
    for (const auto& t : ts) {
      const char* status = !o.verify ? "-" : bad_set.count(t.name) ? "MISMATCH" : "OK";
      std::printf("  %-*s  %-14s %-5s %016" PRIx64 " %s\n", static_cast<int>(width), t.name.c_str(),
                  ckpt::shape_text(t.shape).c_str(), t.dtype.c_str(), t.checksum, status);
    }
    if (o.verify)
      std::printf("checksums: %s\n", bad.empty()
                                         ? ("all " + std::to_string(ts.size()) + " OK").c_str()
                                         : (std::to_string(bad.size()) + " MISMATCH").c_str());
    if (o.deck) {
      std::printf("deck:\n%s", m.deck_yaml.c_str());
      if (!m.deck_yaml.empty() && m.deck_yaml.back() != '\n') std::printf("\n");
    }
    std::fflush(stdout);
    if (!bad.empty()) {
      std::string names;
      for (const auto& b : bad)
        names += (names.empty() ? "" : ", ") + b;
      throw CollectiveError("checkpoint " + reader.path() + ": checksum mismatch in " +
                                std::to_string(bad.size()) + " tensor(s): " + names,
                            kExitCheckpoint);
    }
    return kExitOk;
  });
}

}  // namespace dst::app
