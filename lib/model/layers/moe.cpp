#include "model/layers/moe.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "blas/gemm.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "tensor/memory.hpp"

namespace dst::model {

namespace {
using tensor::Tensor;

std::string expert_prefix(const std::string& prefix, std::int64_t e) {
  return prefix + "experts." + std::to_string(e) + ".";
}

/// The routing runs on host memory: refuse a context whose tensors live elsewhere.
void check_host(const Compute& c) {
  if (tensor::device_of(c.ctx) != tensor::Device::host)
    throw Error(
        "model: the DeepSeekMoE layer runs on host memory only (its router and token "
        "sort); the " +
        std::string(tensor::backend_name(c.ctx.backend)) +
        " back end's memory is not (CUDA kernels for MoE are not written yet)");
}

/// Whether the routed products run over an expert group (parallel.expert > 1).
bool parallel(const Compute& c) {
  return c.experts != nullptr && c.experts->size() > 1;
}

/// A (rows, cols) f32 host tensor over `v` (expert parallelism's buffers).
Tensor host_rows(std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  Tensor t;
  t.data = v.data();
  t.shape = tensor::Shape{rows, cols};
  t.dtype = DType::f32;
  t.device = tensor::Device::host;
  return t;
}
}  // namespace

Moe::Moe(std::string prefix, const config::ModelSection& m, float out_std)
    : prefix_(std::move(prefix)),
      C_(m.d_model),
      E_(m.n_routed_experts),
      K_(m.num_experts_per_tok),
      I_(m.moe_intermediate_size),
      S_(m.n_shared_experts),
      shape_(RouterShape::of(m)),
      aux_alpha_(m.moe.seq_aux_loss_alpha),
      out_std_(out_std),
      shared_(prefix_ + "shared_experts.", m.d_model, m.n_shared_experts * m.moe_intermediate_size,
              out_std) {}

void Moe::declare(std::vector<ParamSpec>& specs) const {
  for (std::int64_t e = 0; e < E_; ++e) {
    const std::string p = expert_prefix(prefix_, e);
    // Each expert is whole on one rank (expert parallelism splits experts, not columns).
    add_param(specs, p + "gate_proj.weight", {I_, C_}, Init::normal, kInitStd, true,
              Split::replicated);
    add_param(specs, p + "up_proj.weight", {I_, C_}, Init::normal, kInitStd, true,
              Split::replicated);
    add_param(specs, p + "down_proj.weight", {C_, I_}, Init::normal, out_std_, true,
              Split::replicated);
  }
  add_param(specs, prefix_ + "gate.weight", {E_, C_}, Init::normal, kInitStd, true,
            Split::replicated);
  if (has_bias())
    add_param(specs, prefix_ + "gate.e_score_correction_bias", {E_}, Init::zeros, 0.0f, false,
              Split::replicated);
  if (S_ > 0) shared_.declare(specs);
}

void Moe::bind(const ParamStore& params) {
  w1_.clear();
  w3_.clear();
  w2_.clear();
  for (std::int64_t e = 0; e < E_; ++e) {
    const std::string p = expert_prefix(prefix_, e);
    w1_.push_back(params.index_of(p + "gate_proj.weight"));
    w3_.push_back(params.index_of(p + "up_proj.weight"));
    w2_.push_back(params.index_of(p + "down_proj.weight"));
  }
  gate_ = params.index_of(prefix_ + "gate.weight");
  if (has_bias()) bias_ = params.index_of(prefix_ + "gate.e_score_correction_bias");
  if (S_ > 0) shared_.bind(params);
}

MoeActs Moe::take(tensor::Arena& arena, std::int64_t rows, bool allocate) const {
  const std::int64_t R = rows * K_;
  MoeActs a;
  if (S_ > 0) a.shared = shared_.take(arena, rows);
  a.logits = arena.take("moe_logits", {rows, E_}, DType::f32);
  a.xs = arena.take("moe_xs", {R, C_}, DType::f32);
  a.h1 = arena.take("moe_h1", {R, I_}, DType::f32);
  a.h3 = arena.take("moe_h3", {R, I_}, DType::f32);
  a.g = arena.take("moe_g", {R, I_}, DType::f32);
  a.y = arena.take("moe_y", {R, C_}, DType::f32);
  if (allocate) a.routing = make_routing(rows);
  return a;
}

std::shared_ptr<MoeRouting> Moe::make_routing(std::int64_t rows) const {
  const std::int64_t R = rows * K_;
  auto routing = std::make_shared<MoeRouting>();
  MoeRouting& r = *routing;
  r.scores.resize(static_cast<std::size_t>(rows * E_));
  r.d_scores.resize(r.scores.size());
  r.idx.resize(static_cast<std::size_t>(R));
  r.weights.resize(static_cast<std::size_t>(R));
  r.d_weights.resize(static_cast<std::size_t>(R));
  r.load.assign(static_cast<std::size_t>(E_), 0.0);
  return routing;
}

std::uint64_t Moe::routing_bytes(std::int64_t rows) const {
  const auto R = static_cast<std::uint64_t>(rows * K_), E = static_cast<std::uint64_t>(E_);
  const auto n = static_cast<std::uint64_t>(rows);
  return 2 * n * E * sizeof(float)                         // scores, d_scores
         + R * (sizeof(std::int32_t) + 2 * sizeof(float))  // idx, weights, d_weights
         + E * sizeof(double)                              // load
         + (E + 1) * sizeof(std::int64_t)                  // rows.offset
         + 2 * R * sizeof(std::int32_t);                   // rows.token, rows.row
}

MoeScratch Moe::take_scratch(tensor::Arena& arena, std::int64_t rows) const {
  const std::int64_t R = rows * K_;
  MoeScratch s;
  if (S_ > 0) s.shared = shared_.take_scratch(arena, rows);
  s.d_g = arena.take("d_moe_g", {R, I_}, DType::f32);
  s.d_y = arena.take("d_moe_y", {R, C_}, DType::f32);
  s.d_xs = arena.take("d_moe_xs", {R, C_}, DType::f32);
  return s;
}

void Moe::forward(const Compute& c, std::int64_t B, std::int64_t T, const Tensor& x,
                  const MoeActs& a, const Tensor& out, bool count) const {
  check_host(c);
  const std::int64_t N = B * T, C = C_, K = K_;
  MoeRouting& r = *a.routing;
  // The router in fp32 from the master weights (transformers casts both to fp32).
  blas::linear_forward(c.ctx, x, c.params->param(gate_), a.logits);
  const float* bias = has_bias() ? c.params->param(bias_).ptr<float>() : nullptr;
  route_forward(shape_, N, a.logits.ptr<float>(), bias, r.scores.data(), r.idx.data(),
                r.weights.data());
  if (count)
    for (std::int64_t i = 0; i < N * K; ++i)
      r.load[static_cast<std::size_t>(r.idx[static_cast<std::size_t>(i)])] += 1.0;
  r.aux_loss = aux_alpha_ > 0.0 ? seq_aux_loss(shape_, B, T, aux_alpha_, r.scores.data(),
                                               r.idx.data(), 0.0f, nullptr)
                                : 0.0;
  sort_by_expert(N, K, E_, r.idx.data(), r.rows);

  // Gather the rows, then each expert's SwiGLU over its rows.
  const float* xp = x.ptr<float>();
  float* xs = a.xs.ptr<float>();
  for (std::int64_t row = 0; row < N * K; ++row)
    std::memcpy(xs + row * C, xp + static_cast<std::int64_t>(r.rows.token[row]) * C,
                static_cast<std::size_t>(C) * sizeof(float));
  // out = shared(x) (or 0), before the routed outputs are added.
  const auto shared_part = [&] {
    if (S_ > 0)
      shared_.forward(c, x, a.shared, out);
    else
      kernels::zero(c.ctx, out);
  };
  if (parallel(c)) {
    experts_forward(c, a, count, shared_part);  // the shared product overlaps the dispatch
  } else {
    for (std::int64_t e = 0; e < E_; ++e) {
      const std::int64_t r0 = r.rows.offset[e], n = r.rows.offset[e + 1] - r0;
      if (n == 0) continue;
      blas::linear_forward(c.ctx, row_range(a.xs, r0, n), c.weight(w1_[e]), row_range(a.h1, r0, n));
      blas::linear_forward(c.ctx, row_range(a.xs, r0, n), c.weight(w3_[e]), row_range(a.h3, r0, n));
    }
    c.store(a.h1);
    c.store(a.h3);
    kernels::swiglu_forward(c.ctx, a.h1, a.h3, a.g);
    c.store(a.g);
    for (std::int64_t e = 0; e < E_; ++e) {
      const std::int64_t r0 = r.rows.offset[e], n = r.rows.offset[e + 1] - r0;
      if (n == 0) continue;
      blas::linear_forward(c.ctx, row_range(a.g, r0, n), c.weight(w2_[e]), row_range(a.y, r0, n));
    }
    c.store(a.y);
    shared_part();
  }

  // out += sum_k w_k y[row of (n, k)], slots summed in order k = 0 .. K-1.
  float* o = out.ptr<float>();
  const float* y = a.y.ptr<float>();
  for (std::int64_t t = 0; t < N; ++t)
    for (std::int64_t k = 0; k < K; ++k) {
      const float w = r.weights[static_cast<std::size_t>(t * K + k)];
      const float* yr = y + static_cast<std::int64_t>(r.rows.row[t * K + k]) * C;
      for (std::int64_t j = 0; j < C; ++j)
        o[t * C + j] += w * yr[j];
    }
}

void Moe::backward(const Compute& c, std::int64_t B, std::int64_t T, const Tensor& dout,
                   const Tensor& x, const MoeActs& a, const MoeScratch& s, const Tensor& dx) const {
  check_host(c);
  const std::int64_t N = B * T, C = C_, K = K_;
  MoeRouting& r = *a.routing;
  c.store(dout);
  // dx = the shared experts' input gradient (or 0), before the routed part is added.
  const auto shared_part = [&] {
    if (S_ > 0)
      shared_.backward(c, dout, x, a.shared, s.shared, dx);
    else
      kernels::zero(c.ctx, dx);
  };
  if (!parallel(c)) shared_part();

  // d_y[row of (n, k)] = w_k dout[n];  d_w[n, k] = dout[n] . y[row of (n, k)]
  const float* d = dout.ptr<float>();
  const float* y = a.y.ptr<float>();
  float* dy = s.d_y.ptr<float>();
  for (std::int64_t t = 0; t < N; ++t)
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int64_t row = r.rows.row[t * K + k];
      const float w = r.weights[static_cast<std::size_t>(t * K + k)];
      double dot = 0.0;
      for (std::int64_t j = 0; j < C; ++j) {
        dy[row * C + j] = w * d[t * C + j];
        dot += static_cast<double>(d[t * C + j]) * y[row * C + j];
      }
      r.d_weights[static_cast<std::size_t>(t * K + k)] = static_cast<float>(dot);
    }
  c.store(s.d_y);

  if (parallel(c)) {
    experts_backward(c, a, s, shared_part);  // the shared backward overlaps the dispatch
  } else {
    // The experts' SwiGLU backward over their rows (d_h1, d_h3 overwrite h1, h3 as Mlp's).
    for (std::int64_t e = 0; e < E_; ++e) {
      const std::int64_t r0 = r.rows.offset[e], n = r.rows.offset[e + 1] - r0;
      if (n == 0) continue;
      blas::linear_backward(c.ctx, row_range(s.d_y, r0, n), row_range(a.g, r0, n), c.weight(w2_[e]),
                            row_range(s.d_g, r0, n), c.grad(w2_[e]));
    }
    kernels::swiglu_backward(c.ctx, s.d_g, a.h1, a.h3, a.h1, a.h3);
    c.store(a.h1);
    c.store(a.h3);
    for (std::int64_t e = 0; e < E_; ++e) {
      const std::int64_t r0 = r.rows.offset[e], n = r.rows.offset[e + 1] - r0;
      if (n == 0) continue;
      const Tensor xs = row_range(a.xs, r0, n), dxs = row_range(s.d_xs, r0, n);
      blas::linear_backward(c.ctx, row_range(a.h1, r0, n), xs, c.weight(w1_[e]), dxs,
                            c.grad(w1_[e]));
      blas::linear_backward(c.ctx, row_range(a.h3, r0, n), xs, c.weight(w3_[e]), dxs,
                            c.grad(w3_[e]), true);
    }
  }
  // dx[n] += sum_k d_xs[row of (n, k)], slots in order.
  float* dxp = dx.ptr<float>();
  const float* dxs = s.d_xs.ptr<float>();
  for (std::int64_t t = 0; t < N; ++t)
    for (std::int64_t k = 0; k < K; ++k) {
      const float* src = dxs + static_cast<std::int64_t>(r.rows.row[t * K + k]) * C;
      for (std::int64_t j = 0; j < C; ++j)
        dxp[t * C + j] += src[j];
    }

  // The router: the weights' gradient and the balance loss's, through the scores.
  const float* d_scores = nullptr;
  if (aux_alpha_ > 0.0) {
    std::fill(r.d_scores.begin(), r.d_scores.end(), 0.0f);
    seq_aux_loss(shape_, B, T, aux_alpha_, r.scores.data(), r.idx.data(), c.aux_grad_scale,
                 r.d_scores.data());
    d_scores = r.d_scores.data();
  }
  route_backward(shape_, N, r.scores.data(), r.idx.data(), r.d_weights.data(), d_scores,
                 a.logits.ptr<float>());
  blas::linear_backward(c.ctx, a.logits, x, c.params->param(gate_), dx, c.grad(gate_), true);
}

void Moe::experts_forward(const Compute& c, const MoeActs& a, bool count,
                          const std::function<void()>& overlap) const {
  MoeRouting& r = *a.routing;
  ExpertDispatch& d = r.dispatch;
  ExpertParallel& ep = *c.experts;
  d.plan(ep, r.rows.offset, E_);
  const std::int64_t R = d.rows, C = C_, I = I_;
  const auto first = static_cast<std::int64_t>(ep.rank()) * d.L;  // this rank's first expert
  if (count) ep.traffic().rows_received += static_cast<std::uint64_t>(R);
  d.xs.resize(static_cast<std::size_t>(R * C));
  d.y.resize(d.xs.size());
  d.h1.resize(static_cast<std::size_t>(R * I));
  d.h3.resize(d.h1.size());
  d.g.resize(d.h1.size());
  d.dispatch(ep, a.xs.ptr<float>(), d.xs.data(), C, overlap);
  if (R > 0) {
    const Tensor xs = host_rows(d.xs, R, C), h1 = host_rows(d.h1, R, I), h3 = host_rows(d.h3, R, I),
                 g = host_rows(d.g, R, I), y = host_rows(d.y, R, C);
    for (std::int64_t l = 0; l < d.L; ++l) {
      const std::int64_t r0 = d.local_offset[static_cast<std::size_t>(l)],
                         n = d.local_offset[static_cast<std::size_t>(l + 1)] - r0;
      if (n == 0) continue;  // an expert no token chose
      const auto e = static_cast<std::size_t>(first + l);
      blas::linear_forward(c.ctx, row_range(xs, r0, n), c.weight(w1_[e]), row_range(h1, r0, n));
      blas::linear_forward(c.ctx, row_range(xs, r0, n), c.weight(w3_[e]), row_range(h3, r0, n));
    }
    c.store(h1);
    c.store(h3);
    kernels::swiglu_forward(c.ctx, h1, h3, g);
    c.store(g);
    for (std::int64_t l = 0; l < d.L; ++l) {
      const std::int64_t r0 = d.local_offset[static_cast<std::size_t>(l)],
                         n = d.local_offset[static_cast<std::size_t>(l + 1)] - r0;
      if (n == 0) continue;
      const auto e = static_cast<std::size_t>(first + l);
      blas::linear_forward(c.ctx, row_range(g, r0, n), c.weight(w2_[e]), row_range(y, r0, n));
    }
    c.store(y);
  }
  d.combine(ep, d.y.data(), a.y.ptr<float>(), C);
}

void Moe::experts_backward(const Compute& c, const MoeActs& a, const MoeScratch& s,
                           const std::function<void()>& overlap) const {
  ExpertDispatch& d = a.routing->dispatch;
  ExpertParallel& ep = *c.experts;
  const std::int64_t R = d.rows, C = C_, I = I_;
  const auto first = static_cast<std::int64_t>(ep.rank()) * d.L;
  d.d_y.resize(static_cast<std::size_t>(R * C));
  d.d_xs.resize(d.d_y.size());
  d.d_g.resize(static_cast<std::size_t>(R * I));
  d.dispatch(ep, s.d_y.ptr<float>(), d.d_y.data(), C, overlap);
  if (R > 0) {
    const Tensor xs = host_rows(d.xs, R, C), h1 = host_rows(d.h1, R, I), h3 = host_rows(d.h3, R, I),
                 g = host_rows(d.g, R, I), dy = host_rows(d.d_y, R, C), dg = host_rows(d.d_g, R, I),
                 dxs = host_rows(d.d_xs, R, C);
    for (std::int64_t l = 0; l < d.L; ++l) {
      const std::int64_t r0 = d.local_offset[static_cast<std::size_t>(l)],
                         n = d.local_offset[static_cast<std::size_t>(l + 1)] - r0;
      if (n == 0) continue;
      const auto e = static_cast<std::size_t>(first + l);
      blas::linear_backward(c.ctx, row_range(dy, r0, n), row_range(g, r0, n), c.weight(w2_[e]),
                            row_range(dg, r0, n), c.grad(w2_[e]));
    }
    kernels::swiglu_backward(c.ctx, dg, h1, h3, h1, h3);
    c.store(h1);
    c.store(h3);
    for (std::int64_t l = 0; l < d.L; ++l) {
      const std::int64_t r0 = d.local_offset[static_cast<std::size_t>(l)],
                         n = d.local_offset[static_cast<std::size_t>(l + 1)] - r0;
      if (n == 0) continue;
      const auto e = static_cast<std::size_t>(first + l);
      const Tensor x = row_range(xs, r0, n), dx = row_range(dxs, r0, n);
      blas::linear_backward(c.ctx, row_range(h1, r0, n), x, c.weight(w1_[e]), dx, c.grad(w1_[e]));
      blas::linear_backward(c.ctx, row_range(h3, r0, n), x, c.weight(w3_[e]), dx, c.grad(w3_[e]),
                            true);
    }
  }
  d.combine(ep, d.d_xs.data(), s.d_xs.ptr<float>(), C);
}

void Moe::update_bias(const ParamStore& params, const std::vector<double>& load,
                      double rate) const {
  if (!has_bias() || rate == 0.0) return;
  if (static_cast<std::int64_t>(load.size()) != E_)
    throw Error("model: balancing of " + prefix_ + "gate needs " + std::to_string(E_) +
                " expert loads, got " + std::to_string(load.size()));
  double mean = 0.0;
  for (double l : load)
    mean += l;
  mean /= static_cast<double>(E_);
  float* b = params.param(bias_).ptr<float>();
  for (std::int64_t e = 0; e < E_; ++e) {
    const double diff = load[static_cast<std::size_t>(e)] - mean;
    const float sign = diff > 0.0 ? 1.0f : (diff < 0.0 ? -1.0f : 0.0f);
    b[e] -= static_cast<float>(rate) * sign;
  }
}

}  // namespace dst::model
