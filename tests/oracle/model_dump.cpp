// Writes what the dense model computes on a fixed batch to an HDF5 file, for the
// independent reference (tests/oracle/llama_parity.py, Hugging Face transformers):
//   /params/<name>   initial weights (state-dict names and shapes)
//   /grads/<name>    gradients of the mean loss over non-ignored targets
//   /tokens, /targets (B, T) i32;  /logits (B, T, V) f32
//   attributes: loss (mean), valid_tokens, and the model shape
// (and the DeepSeek-V2/V3 shape keys, for tests/oracle/deepseek_parity.py)
// usage: model_dump OUT.h5 [--batch B] [--seq T] [--ignore-every K] [--set key=value ...]
//        model_dump --count [--set key=value ...]   (prints the layout's parameter count)
//        model_dump --count-active [--set ...]       (the parameters a token uses, plan.hpp)
#include <hdf5.h>
#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "blas/host_blas.hpp"
#include "config/deck.hpp"
#include "core/rng.hpp"
#include "model/language_model.hpp"
#include "model/plan.hpp"

namespace {

void check(herr_t rc, const char* what) {
  if (rc < 0) throw std::runtime_error(std::string("HDF5: ") + what);
}

void write(hid_t loc, const std::string& name, const std::vector<hsize_t>& dims, hid_t type,
           const void* data) {
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  const hid_t d = H5Dcreate2(loc, name.c_str(), type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
  if (d < 0) throw std::runtime_error("HDF5: cannot create " + name);
  check(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), name.c_str());
  H5Dclose(d);
  H5Pclose(lcpl);
  H5Sclose(space);
}

void attr(hid_t loc, const char* name, double value) {
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(loc, name, H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT);
  check(H5Awrite(a, H5T_NATIVE_DOUBLE, &value), name);
  H5Aclose(a);
  H5Sclose(space);
}

}  // namespace

int main(int argc, char** argv) {
  dst::blas::select_host_kernels(argv);   // the OpenBLAS kernels dstrain runs with
  Kokkos::ScopeGuard kokkos(argc, argv);  // the kernels' back end
  try {
    std::string out;
    bool count_only = false, count_active = false;
    std::int64_t B = 2, T = 16, ignore_every = 7;
    std::vector<dst::config::Override> sets;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
        return argv[++i];
      };
      if (a == "--count")
        count_only = true;
      else if (a == "--count-active")
        count_active = true;
      else if (a == "--batch")
        B = std::stoll(next());
      else if (a == "--seq")
        T = std::stoll(next());
      else if (a == "--ignore-every")
        ignore_every = std::stoll(next());
      else if (a == "--set")
        sets.push_back(dst::config::parse_override(next()));
      else if (out.empty() && a[0] != '-')
        out = a;
      else
        throw std::runtime_error("unknown argument " + a);
    }
    // A deck of just the overrides, validated like any deck (seq_len defaults to the
    // model's max_seq_len, so pass data.seq_len when it matters).
    const dst::config::RunConfig cfg = dst::config::load_deck_text("{}", "model_dump", sets);
    if (count_active) {  // the closed form's parameters one token uses (MoE: top-k experts)
      std::printf("%lld\n",
                  static_cast<long long>(dst::model::count_parameters(cfg.model).active()));
      return 0;
    }
    if (count_only) {
      const dst::model::LanguageModel plan(cfg.model, 1, 1, dst::tensor::Arena::Mode::plan);
      std::printf("%lld\n", static_cast<long long>(plan.params().parameter_count()));
      return 0;
    }
    if (out.empty()) throw std::runtime_error("usage: model_dump OUT.h5 [options]");
    dst::model::LanguageModel model(cfg.model, B, T, dst::tensor::Arena::Mode::allocate);
    model.params().initialize(cfg.run.seed);
    const std::int64_t N = B * T, V = cfg.model.vocab_size;
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(N)), targets(tokens.size());
    for (std::int64_t i = 0; i < N; ++i) {
      const auto u = [&](std::uint64_t stream) {
        return static_cast<std::int32_t>(
            dst::core::uniform01(cfg.run.seed, stream, static_cast<std::uint64_t>(i)) *
            static_cast<float>(V));
      };
      tokens[static_cast<std::size_t>(i)] = u(1);
      targets[static_cast<std::size_t>(i)] =
          ignore_every > 0 && i % ignore_every == 3 ? dst::model::kIgnoreIndex : u(2);
    }
    const std::int64_t valid = model.forward(tokens.data(), targets.data()).valid_tokens;
    const auto lg = model.logits();
    std::vector<float> logits(lg.ptr<float>(), lg.ptr<float>() + lg.numel());
    model.params().zero_grads();
    const double loss_sum =
        model.forward_backward(tokens.data(), targets.data(), 1.0f / static_cast<float>(valid))
            .loss_sum;

    const hid_t f = H5Fcreate(out.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) throw std::runtime_error("cannot create " + out);
    const hid_t gp = H5Gcreate2(f, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const hid_t gg = H5Gcreate2(f, "grads", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const auto& ps = model.params();
    for (std::size_t i = 0; i < ps.size(); ++i) {
      std::vector<hsize_t> dims;
      for (int d = 0; d < ps.spec(i).shape.rank; ++d)
        dims.push_back(static_cast<hsize_t>(ps.spec(i).shape[d]));
      write(gp, ps.spec(i).name, dims, H5T_NATIVE_FLOAT, ps.param(i).data);
      write(gg, ps.spec(i).name, dims, H5T_NATIVE_FLOAT, ps.grad(i).data);
    }
    const std::vector<hsize_t> bt{static_cast<hsize_t>(B), static_cast<hsize_t>(T)};
    write(f, "tokens", bt, H5T_NATIVE_INT32, tokens.data());
    write(f, "targets", bt, H5T_NATIVE_INT32, targets.data());
    write(f, "logits", {bt[0], bt[1], static_cast<hsize_t>(V)}, H5T_NATIVE_FLOAT, logits.data());
    attr(f, "loss", loss_sum / static_cast<double>(valid));
    attr(f, "valid_tokens", static_cast<double>(valid));
    const auto& m = cfg.model;
    attr(f, "vocab_size", static_cast<double>(m.vocab_size));
    attr(f, "d_model", static_cast<double>(m.d_model));
    attr(f, "n_layers", static_cast<double>(m.n_layers));
    attr(f, "n_heads", static_cast<double>(m.n_heads));
    attr(f, "n_kv_heads", static_cast<double>(m.n_kv_heads));
    attr(f, "ffn_dim", static_cast<double>(m.ffn_dim));
    attr(f, "rope_theta", m.rope_theta);
    attr(f, "norm_eps", m.norm_eps);
    attr(f, "tie_embeddings", m.tie_embeddings ? 1.0 : 0.0);
    attr(f, "max_seq_len", static_cast<double>(m.max_seq_len));
    // DeepSeek-V2/V3 (tests/oracle/deepseek_parity.py): latent attention and DeepSeekMoE.
    attr(f, "q_lora_rank", static_cast<double>(m.q_lora_rank));
    attr(f, "kv_lora_rank", static_cast<double>(m.kv_lora_rank));
    attr(f, "qk_nope_head_dim", static_cast<double>(m.qk_nope_head_dim));
    attr(f, "qk_rope_head_dim", static_cast<double>(m.qk_rope_head_dim));
    attr(f, "v_head_dim", static_cast<double>(m.v_head_dim));
    attr(f, "n_routed_experts", static_cast<double>(m.n_routed_experts));
    attr(f, "n_shared_experts", static_cast<double>(m.n_shared_experts));
    attr(f, "num_experts_per_tok", static_cast<double>(m.num_experts_per_tok));
    attr(f, "moe_intermediate_size", static_cast<double>(m.moe_intermediate_size));
    attr(f, "first_k_dense_replace", static_cast<double>(m.first_k_dense_replace));
    attr(f, "n_group", static_cast<double>(m.n_group));
    attr(f, "topk_group", static_cast<double>(m.topk_group));
    attr(f, "norm_topk_prob", m.norm_topk_prob ? 1.0 : 0.0);
    attr(f, "routed_scaling_factor", m.routed_scaling_factor);
    attr(f, "moe_softmax", m.moe.score == dst::config::MoeScore::softmax ? 1.0 : 0.0);
    attr(f, "seq_aux_loss_alpha", m.moe.seq_aux_loss_alpha);
    const dst::config::RopeScalingSection& r = m.rope_scaling;
    attr(f, "yarn", r.type == dst::config::RopeScalingType::yarn ? 1.0 : 0.0);
    attr(f, "yarn_factor", r.factor);
    attr(f, "yarn_original_max_seq_len", static_cast<double>(r.original_max_seq_len));
    attr(f, "yarn_beta_fast", r.beta_fast);
    attr(f, "yarn_beta_slow", r.beta_slow);
    attr(f, "yarn_mscale", r.mscale);
    attr(f, "yarn_mscale_all_dim", r.mscale_all_dim);
    H5Gclose(gp);
    H5Gclose(gg);
    H5Fclose(f);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_dump: error: %s\n", e.what());
    return 1;
  }
}
