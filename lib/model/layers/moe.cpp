#include "model/layers/moe.hpp"

#include <algorithm>
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

/// The first t.numel() elements of a host vector into a tensor of the context's memory.
template <class T>
void upload_vector(const Compute& c, const std::vector<T>& host, const Tensor& t) {
  if (static_cast<std::int64_t>(host.size()) < t.numel())
    throw Error("model: MoE routing of " + std::to_string(host.size()) + " values for a " +
                t.shape.str() + " tensor");
  tensor::upload(c.ctx, host.data(), t);
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

Moe::Moe(std::string prefix, const config::ModelSection& m, float out_std, const ExpertSlice& ep)
    : prefix_(std::move(prefix)),
      C_(m.d_model),
      E_(m.n_routed_experts),
      K_(m.num_experts_per_tok),
      I_(m.moe_intermediate_size),
      S_(m.n_shared_experts),
      shape_(RouterShape::of(m)),
      aux_alpha_(m.moe.seq_aux_loss_alpha),
      capacity_factor_(m.moe.capacity_factor),
      out_std_(out_std),
      shared_(prefix_ + "shared_experts.", m.d_model, m.n_shared_experts * m.moe_intermediate_size,
              out_std),
      ep_(ep) {
  if (ep.size < 1 || ep.rank < 0 || ep.rank >= ep.size || E_ % ep.size != 0)
    throw Error("model: an MoE layer of " + std::to_string(E_) +
                " routed experts cannot hold expert slice " + std::to_string(ep.rank) + " of " +
                std::to_string(ep.size) + " (parallel.expert must divide n_routed_experts)");
  ep_count_ = E_ / ep.size;
  ep_first_ = ep.rank * ep_count_;
}

std::size_t Moe::expert_param(const std::vector<std::size_t>& w, std::int64_t e) const {
  if (e < ep_first_ || e >= ep_first_ + ep_count_)
    throw Error("model: routed expert " + std::to_string(e) + " of " + prefix_ +
                " is not held here (experts " + std::to_string(ep_first_) + " .. " +
                std::to_string(ep_first_ + ep_count_ - 1) + ")");
  return w[static_cast<std::size_t>(e - ep_first_)];
}

void Moe::declare(std::vector<ParamSpec>& specs) const {
  for (std::int64_t e = ep_first_; e < ep_first_ + ep_count_; ++e) {
    const std::string p = expert_prefix(prefix_, e);
    // Each expert is whole on one rank (expert parallelism splits experts, not columns);
    // with ep.size > 1 only this rank's experts, marked for the expert-data group's sum.
    add_param(specs, p + "gate_proj.weight", {I_, C_}, Init::normal, kInitStd, true,
              Split::replicated);
    add_param(specs, p + "up_proj.weight", {I_, C_}, Init::normal, kInitStd, true,
              Split::replicated);
    add_param(specs, p + "down_proj.weight", {C_, I_}, Init::normal, out_std_, true,
              Split::replicated);
    for (std::size_t k = specs.size() - 3; k < specs.size(); ++k)
      specs[k].ep_size = ep_.size;
  }
  add_param(specs, prefix_ + "gate.weight", {E_, C_}, Init::normal, kInitStd, true,
            Split::replicated);
  if (has_bias())
    add_param(specs, prefix_ + "gate.e_score_correction_bias", {E_}, Init::zeros, 0.0f, false,
              Split::replicated);
  if (S_ > 0) {
    // The shared experts are an Mlp, but whole on every rank (tensor parallelism computes
    // a DeepSeekMoE layer whole on each rank of its group, block.hpp).
    const std::size_t first = specs.size();
    shared_.declare(specs);
    for (std::size_t k = first; k < specs.size(); ++k)
      specs[k].split = Split::replicated;
  }
}

void Moe::bind(const ParamStore& params) {
  w1_.clear();
  w3_.clear();
  w2_.clear();
  for (std::int64_t e = ep_first_; e < ep_first_ + ep_count_; ++e) {
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
  a.token = arena.take("moe_token", {R}, DType::i32);
  a.row = arena.take("moe_row", {rows, K_}, DType::i32);
  a.weights = arena.take("moe_weights", {rows, K_}, DType::f32);
  if (allocate) a.routing = make_routing(rows);
  return a;
}

std::shared_ptr<MoeRouting> Moe::make_routing(std::int64_t rows) const {
  const std::int64_t R = rows * K_;
  auto routing = std::make_shared<MoeRouting>();
  MoeRouting& r = *routing;
  r.logits.resize(static_cast<std::size_t>(rows * E_));
  r.bias.resize(has_bias() ? static_cast<std::size_t>(E_) : 0);
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
  return 3 * n * E * sizeof(float)                         // logits, scores, d_scores
         + (has_bias() ? E * sizeof(float) : 0)            // bias
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
  s.d_weights = arena.take("d_moe_weights", {rows, K_}, DType::f32);
  return s;
}

void Moe::forward(const Compute& c, std::int64_t B, std::int64_t T, const Tensor& x,
                  const MoeActs& a, const Tensor& out, bool count) const {
  const std::int64_t N = B * T, K = K_;
  MoeRouting& r = *a.routing;
  // The router in fp32 from the master weights (transformers casts both to fp32); its
  // (N, E) logits are routed on the host, and the rows' bookkeeping goes back.
  blas::linear_forward(c.ctx, x, c.params->param(gate_), a.logits);
  tensor::download(c.ctx, a.logits, r.logits.data());
  if (has_bias()) tensor::download(c.ctx, c.params->param(bias_), r.bias.data());
  if (c.expert_node != nullptr && shape_.max_nodes > 0) {  // node-limited routing
    RouterShape shape = shape_;
    shape.expert_node = *c.expert_node;
    route_forward(shape, N, r.logits.data(), has_bias() ? r.bias.data() : nullptr, r.scores.data(),
                  r.idx.data(), r.weights.data());
  } else {
    route_forward(shape_, N, r.logits.data(), has_bias() ? r.bias.data() : nullptr, r.scores.data(),
                  r.idx.data(), r.weights.data());
  }
  if (count)
    for (std::int64_t i = 0; i < N * K; ++i)
      r.load[static_cast<std::size_t>(r.idx[static_cast<std::size_t>(i)])] += 1.0;
  r.aux_loss = aux_alpha_ > 0.0 ? seq_aux_loss(shape_, B, T, aux_alpha_, r.scores.data(),
                                               r.idx.data(), 0.0f, nullptr)
                                : 0.0;
  sort_by_expert(N, K, E_, r.idx.data(), r.rows);
  // The capacity, on this rank's rows before any dispatch (the loads above and the balance
  // loss count the router's choice, dropped rows included).
  const std::int64_t dropped = apply_capacity(N, K, E_, r.scores.data(),
                                              expert_capacity(capacity_factor_, N, K, E_), r.rows);
  if (count) r.dropped += static_cast<double>(dropped);
  const std::int64_t kept = N * K - dropped;
  // The record may hold more tokens than this call's (the decoder's shorter steps).
  const Tensor token = row_range(a.token, 0, N * K), row = row_range(a.row, 0, N),
               weights = row_range(a.weights, 0, N);
  upload_vector(c, r.rows.token, token);
  upload_vector(c, r.rows.row, row);
  upload_vector(c, r.weights, weights);

  // Gather the rows, then each expert's SwiGLU over its rows. Dropped rows (after the
  // kept ones) are gathered too but never computed: their outputs are 0.
  kernels::gather_rows(c.ctx, x, token, a.xs);
  if (dropped > 0) kernels::zero(c.ctx, row_range(a.y, kept, dropped));
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
    if (ep_count_ != E_)
      throw Error("model: " + prefix_ + " holds experts " + std::to_string(ep_first_) + " .. " +
                  std::to_string(ep_first_ + ep_count_ - 1) + " of " + std::to_string(E_) +
                  " only (expert slice " + std::to_string(ep_.rank) + " of " +
                  std::to_string(ep_.size) + "): it needs its expert group (set_expert_parallel)");
    swiglu_rows_forward(c, r.rows.offset, 0, a.xs, a.h1, a.h3, a.g, a.y);
    shared_part();
  }

  // out += sum_k w_k y[row of (n, k)], slots summed in order k = 0 .. K-1.
  kernels::moe_combine_forward(c.ctx, a.y, row, weights, out);
}

void Moe::backward(const Compute& c, std::int64_t B, std::int64_t T, const Tensor& dout,
                   const Tensor& x, const MoeActs& a, const MoeScratch& s, const Tensor& dx) const {
  const std::int64_t N = B * T;
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
  const Tensor row = row_range(a.row, 0, N), weights = row_range(a.weights, 0, N),
               d_weights = row_range(s.d_weights, 0, N);
  kernels::moe_combine_backward(c.ctx, dout, a.y, row, weights, s.d_y, d_weights);
  tensor::download(c.ctx, d_weights, r.d_weights.data());
  c.store(s.d_y);

  if (parallel(c)) {
    experts_backward(c, a, s, shared_part);  // the shared backward overlaps the dispatch
  } else {
    swiglu_rows_backward(c, r.rows.offset, 0, a.xs, a.h1, a.h3, a.g, s.d_y, s.d_g, s.d_xs);
  }
  // Dropped rows: no input gradient (their output was 0 whatever the input).
  const std::int64_t kept = r.rows.offset.back();
  if (r.rows.dropped > 0) kernels::zero(c.ctx, row_range(s.d_xs, kept, r.rows.dropped));
  // dx[n] += sum_k d_xs[row of (n, k)], slots in order.
  kernels::gather_rows_backward(c.ctx, s.d_xs, row, dx);

  // The router on the host: the weights' gradient and the balance loss's, through the
  // scores, to the logits' gradient, which goes back into a.logits.
  const float* d_scores = nullptr;
  if (aux_alpha_ > 0.0) {
    std::fill(r.d_scores.begin(), r.d_scores.end(), 0.0f);
    seq_aux_loss(shape_, B, T, aux_alpha_, r.scores.data(), r.idx.data(), c.aux_grad_scale,
                 r.d_scores.data());
    d_scores = r.d_scores.data();
  }
  route_backward(shape_, N, r.scores.data(), r.idx.data(), r.d_weights.data(), d_scores,
                 r.logits.data());
  upload_vector(c, r.logits, a.logits);
  blas::linear_backward(c.ctx, a.logits, x, c.params->param(gate_), dx, c.grad(gate_), true);
}

void Moe::experts_forward(const Compute& c, const MoeActs& a, bool count,
                          const std::function<void()>& overlap) const {
  if (tensor::device_of(c.ctx) != tensor::Device::host)
    throw Error(
        "model: expert parallelism (parallel.expert > 1) runs on host memory only: its "
        "all-to-all moves host rows (MPI); the " +
        std::string(tensor::backend_name(c.ctx.backend)) + " back end's memory is not");
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
    swiglu_rows_forward(c, d.local_offset, first, host_rows(d.xs, R, C), host_rows(d.h1, R, I),
                        host_rows(d.h3, R, I), host_rows(d.g, R, I), host_rows(d.y, R, C));
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
    swiglu_rows_backward(c, d.local_offset, first, host_rows(d.xs, R, C), host_rows(d.h1, R, I),
                         host_rows(d.h3, R, I), host_rows(d.g, R, I), host_rows(d.d_y, R, C),
                         host_rows(d.d_g, R, I), host_rows(d.d_xs, R, C));
  }
  d.combine(ep, d.d_xs.data(), s.d_xs.ptr<float>(), C);
}

void Moe::swiglu_rows_forward(const Compute& c, const std::vector<std::int64_t>& offset,
                              std::int64_t first, const Tensor& xs, const Tensor& h1,
                              const Tensor& h3, const Tensor& g, const Tensor& y) const {
  const auto experts = static_cast<std::int64_t>(offset.size()) - 1;
  for (std::int64_t l = 0; l < experts; ++l) {
    const std::int64_t r0 = offset[static_cast<std::size_t>(l)],
                       n = offset[static_cast<std::size_t>(l + 1)] - r0;
    if (n == 0) continue;  // an expert no token chose
    const std::int64_t e = first + l;
    blas::linear_forward(c.ctx, row_range(xs, r0, n), c.weight(expert_param(w1_, e)),
                         row_range(h1, r0, n));
    blas::linear_forward(c.ctx, row_range(xs, r0, n), c.weight(expert_param(w3_, e)),
                         row_range(h3, r0, n));
  }
  // The elementwise part over the rows computed (the dropped rows after them are not).
  const std::int64_t rows = offset.back();
  const Tensor h1r = row_range(h1, 0, rows), h3r = row_range(h3, 0, rows),
               gr = row_range(g, 0, rows);
  c.store(h1r);
  c.store(h3r);
  kernels::swiglu_forward(c.ctx, h1r, h3r, gr);
  c.store(gr);
  for (std::int64_t l = 0; l < experts; ++l) {
    const std::int64_t r0 = offset[static_cast<std::size_t>(l)],
                       n = offset[static_cast<std::size_t>(l + 1)] - r0;
    if (n == 0) continue;
    const std::int64_t e = first + l;
    blas::linear_forward(c.ctx, row_range(g, r0, n), c.weight(expert_param(w2_, e)),
                         row_range(y, r0, n));
  }
  c.store(row_range(y, 0, rows));
}

void Moe::swiglu_rows_backward(const Compute& c, const std::vector<std::int64_t>& offset,
                               std::int64_t first, const Tensor& xs, const Tensor& h1,
                               const Tensor& h3, const Tensor& g, const Tensor& dy,
                               const Tensor& dg, const Tensor& dxs) const {
  const auto experts = static_cast<std::int64_t>(offset.size()) - 1;
  for (std::int64_t l = 0; l < experts; ++l) {
    const std::int64_t r0 = offset[static_cast<std::size_t>(l)],
                       n = offset[static_cast<std::size_t>(l + 1)] - r0;
    if (n == 0) continue;
    const std::int64_t e = first + l;
    blas::linear_backward(c.ctx, row_range(dy, r0, n), row_range(g, r0, n),
                          c.weight(expert_param(w2_, e)), row_range(dg, r0, n),
                          c.grad(expert_param(w2_, e)));
  }
  const std::int64_t rows = offset.back();
  const Tensor h1r = row_range(h1, 0, rows), h3r = row_range(h3, 0, rows);
  kernels::swiglu_backward(c.ctx, row_range(dg, 0, rows), h1r, h3r, h1r, h3r);
  c.store(h1r);
  c.store(h3r);
  for (std::int64_t l = 0; l < experts; ++l) {
    const std::int64_t r0 = offset[static_cast<std::size_t>(l)],
                       n = offset[static_cast<std::size_t>(l + 1)] - r0;
    if (n == 0) continue;
    const std::int64_t e = first + l;
    const Tensor x = row_range(xs, r0, n), dx = row_range(dxs, r0, n);
    blas::linear_backward(c.ctx, row_range(h1, r0, n), x, c.weight(expert_param(w1_, e)), dx,
                          c.grad(expert_param(w1_, e)));
    blas::linear_backward(c.ctx, row_range(h3, r0, n), x, c.weight(expert_param(w3_, e)), dx,
                          c.grad(expert_param(w3_, e)), true);
  }
}

void Moe::check_expert_nodes(const std::vector<std::int32_t>& expert_node) const {
  if (!expert_node.empty() && static_cast<std::int64_t>(expert_node.size()) != E_)
    throw Error("model: node map of " + std::to_string(expert_node.size()) + " experts for " +
                prefix_ + "gate's " + std::to_string(E_));
  RouterShape next = shape_;
  next.expert_node = expert_node;
  const std::int64_t nodes = next.nodes();
  std::vector<std::int64_t> per_node(static_cast<std::size_t>(nodes), 0);
  for (std::int32_t n : expert_node) {
    if (n < 0) throw Error("model: negative node id in the routed experts' node map");
    ++per_node[static_cast<std::size_t>(n)];
  }
  for (std::int64_t j = 0; j < nodes && !expert_node.empty(); ++j)
    if (per_node[static_cast<std::size_t>(j)] == 0)
      throw Error("model: node " + std::to_string(j) + " of " + std::to_string(nodes) +
                  " holds no routed expert (node ids must be 0 .. nodes - 1)");
  if (next.node_limited() && next.top_groups < next.groups)
    throw Error(
        "model: node-limited routing (model.moe.max_nodes_per_token) does not combine "
        "with group-limited routing (model.topk_group < model.n_group)");
  if (next.node_limited()) {
    // The M smallest nodes must still hold top-k experts.
    std::sort(per_node.begin(), per_node.end());
    std::int64_t fewest = 0;
    for (std::int64_t j = 0; j < next.max_nodes; ++j)
      fewest += per_node[static_cast<std::size_t>(j)];
    if (fewest < K_)
      throw Error("model.moe.max_nodes_per_token (" + std::to_string(next.max_nodes) + ") of the " +
                  std::to_string(nodes) + " nodes the routed experts lie on holds " +
                  std::to_string(fewest) + " experts, fewer than model.num_experts_per_tok (" +
                  std::to_string(K_) + ")");
  }
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
  // The bias lives where the parameters do (host, or the device): moved on the host.
  const Tensor bias = params.param(bias_);
  std::vector<float> b(static_cast<std::size_t>(E_));
  tensor::download(params.context(), bias, b.data());
  for (std::int64_t e = 0; e < E_; ++e) {
    const double diff = load[static_cast<std::size_t>(e)] - mean;
    const float sign = diff > 0.0 ? 1.0f : (diff < 0.0 ? -1.0f : 0.0f);
    b[static_cast<std::size_t>(e)] -= static_cast<float>(rate) * sign;
  }
  tensor::upload(params.context(), b.data(), bias);
}

}  // namespace dst::model
