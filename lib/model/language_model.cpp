#include "model/language_model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/transformer.hpp"
#include "tensor/memory.hpp"

namespace dst::model {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
using tensor::Arena;
using tensor::Tensor;
}  // namespace

struct LanguageModel::Impl {
  Transformer net;
  // The layers' context: the back end with math = the storage type, the storage type
  // (emulated 16-bit storage, docs/precision.md: f32 = none), and the parameters. For
  // bf16/f16 the compute copy holds the master parameters rounded to the storage type, in
  // the ParamStore's layout; the forward and backward read their weights from it.
  Compute c;
  std::vector<std::int32_t> expert_node;  // node-limited routing's map (c.expert_node)
  std::int64_t B, T, N, C, L;
  // Sequence parallelism (TensorSlice::sequence): the token rows the residual stream
  // keeps on this rank (N / the tensor group's size; N without it).
  std::int64_t rows = 0;
  // Sequence parallelism: the (N, C) buffers every block shares (Block::take), which the
  // embedding and the head also use for their whole rows.
  Tensor gathered, partial;
  Arena acts{"activations", Arena::Mode::plan};
  Arena work{"workspace", Arena::Mode::plan};
  // training.recompute: the activations every block's record shares (Block::take_shared).
  Arena recomputed{"recomputed activations", Arena::Mode::plan};
  config::Recompute recompute = config::Recompute::none;
  // Fused attention (cuDNN SDPA, kernels::fused_attention_*): where the back end supports
  // the shape and the run need not be bitwise deterministic. It keeps (B, H, T) softmax
  // statistics instead of the (B, H, T, T) probabilities and their gradient.
  bool fused = false;
  // The parameter buffer is the compute copy; the master is outside (the constructor).
  bool master_outside = false;
  // master_outside: the flat-buffer ranges [first, last) the compute copy keeps in fp32,
  // ascending: every MoE router's gate.weight and correction bias, which the router reads
  // from the parameter buffer as the master's fp32 values (Moe::forward; as transformers
  // casts them to fp32). The buffer being the compute copy, rounding them would route by
  // rounded weights, unlike the same run with the master inside.
  std::vector<std::pair<std::size_t, std::size_t>> fp32_ranges;

  /// Rounds `part` (a view of the parameter buffer from flat offset `first`) to the
  /// storage type in place, but for fp32_ranges.
  void round_compute(const Tensor& part, std::size_t first) {
    const std::size_t last = first + static_cast<std::size_t>(part.numel());
    std::size_t at = first;
    const auto round = [&](std::size_t a, std::size_t b) {
      if (a >= b) return;
      Tensor t = part;
      t.shape = tensor::Shape{static_cast<std::int64_t>(b - a)};
      t.data = part.ptr<float>() + (a - first);
      kernels::round_to_storage(c.ctx, t, c.storage);
    };
    for (const auto& [a, b] : fp32_ranges) {
      if (b <= at) continue;
      if (a >= last) break;
      round(at, std::min(a, last));
      at = std::max(at, b);
    }
    round(at, last);
  }
  Arena compute{"compute parameters", Arena::Mode::plan};

  // The chunks of blocks held (resolved: last is a block index; one but under the
  // interleaved schedule) and their records, chunk 0's first (record chunk_base[c] + slot
  // is chunk c's record `slot`): each record's blocks' activations (indexed by block, the
  // others empty), the tokens (first stage) and targets (last stage), the output of a
  // chunk without the head. `layer`, `tokens` and `targets` are record 0's.
  std::vector<StageBlocks> chunks;
  std::vector<std::size_t> chunk_base, record_chunk;
  std::vector<std::vector<BlockActs>> slot_layer;
  std::vector<Tensor> slot_tokens, slot_targets, slot_out;
  // Each record's gradient scale (stage_forward's grad_scale: the balance loss's gradient
  // in stage_backward).
  std::vector<float> slot_scale;
  std::vector<BlockActs> layer;
  Tensor tokens, targets;  // (N) i32
  HeadActs head;
  // Multi-token prediction (model.mtp_depth 1): its record and scratch, its input tokens
  // and targets on the host, and the weight of its token losses in the gradient relative
  // to the main ones' (set_mtp_loss_scale).
  MtpActs mtp;
  MtpScratch mtp_scratch;
  std::vector<std::int32_t> mtp_tokens_host, mtp_targets_host;
  double mtp_scale = 0.0;
  Rope rope;                       // (T, D/2) RoPE tables
  Tensor d_x;                      // (N, C) gradient of the residual stream
  BlockScratch block;              // backward scratch, shared by all blocks
  std::vector<float> host_losses;  // per-token losses of a device, copied to the host

  Impl(const config::ModelSection& m, const TensorSlice& tp, const ExpertSlice& ep)
      : net(m, tp, ep) {}

  const StageBlocks& chunk_of(std::size_t record) const { return chunks[record_chunk[record]]; }
  /// Sequence parallelism: the buffers the embedding and the head share with the blocks.
  RowBuffers row_buffers() const { return {gathered, partial, block.d_norm}; }
  bool holds_head() const { return chunks.back().head; }

  void take_all() {
    chunk_base.clear();
    record_chunk.clear();
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      chunk_base.push_back(record_chunk.size());
      record_chunk.insert(record_chunk.end(), static_cast<std::size_t>(chunks[k].slots), k);
    }
    const std::size_t records = record_chunk.size();
    slot_layer.assign(records, std::vector<BlockActs>(static_cast<std::size_t>(L)));
    slot_tokens.assign(records, Tensor{});
    slot_targets.assign(records, Tensor{});
    slot_out.assign(records, Tensor{});
    slot_scale.assign(records, 0.0f);
    const std::int64_t first = chunks.front().first;
    BlockActs shared = net.block(first).take_shared(recomputed, B, T, fused, recompute);
    if (rows != N) {
      gathered = shared.gathered = work.take("sequence-parallel gathered rows", {N, C}, DType::f32);
      partial = shared.partial = work.take("sequence-parallel partial sums", {N, C}, DType::f32);
    }
    for (std::size_t r = 0; r < records; ++r) {
      const StageBlocks& chunk = chunk_of(r);
      // The whole model takes tokens and targets as it always has (slot 0 of both ends).
      if (chunk.embedding || chunk.head) slot_tokens[r] = acts.take("tokens", {N}, DType::i32);
      if (chunk.head) slot_targets[r] = acts.take("targets", {N}, DType::i32);
      for (std::int64_t l = chunk.first; l < chunk.last; ++l)
        slot_layer[r][static_cast<std::size_t>(l)] =
            net.block(l).take(acts, B, T, fused, recompute, shared);
      if (!chunk.head) slot_out[r] = acts.take("stage output", {rows, C}, DType::f32);
    }
    layer = slot_layer[0];
    tokens = slot_tokens[0];
    targets = slot_targets[0];
    if (holds_head()) head = net.head().take(acts, N);
    if (net.mtp() && holds_head()) mtp = net.mtp()->take(acts, B, T, fused, recompute, shared);

    rope = Rope::take(work, T, net.block(first).head_dim());
    d_x = work.take("d_x", {N, C}, DType::f32);
    block = net.block(first).take_scratch(work, B, T, fused);
    if (net.mtp() && holds_head()) mtp_scratch = net.mtp()->take_scratch(work, N);
  }

  /// Every DeepSeekMoE block of record `record`'s chunk with that record: the chunk's
  /// blocks in order, then the MTP module's (with the head). Each
  /// record has its own host routing (Block::take): 1F1B's micro-batches in flight route
  /// apart.
  template <class F>
  void each_moe(std::size_t record, F&& f) const {
    const StageBlocks& chunk = chunk_of(record);
    for (std::int64_t l = chunk.first; l < chunk.last; ++l)
      if (const Moe* m = net.block(l).moe()) f(*m, slot_layer[record][static_cast<std::size_t>(l)]);
    if (net.mtp() && chunk.head)
      if (const Moe* m = net.mtp()->block().moe()) f(*m, mtp.block);
  }
  /// Every DeepSeekMoE block this model holds, in the model's order (each chunk's first
  /// record).
  template <class F>
  void each_moe(F&& f) const {
    for (const std::size_t first : chunk_base)
      each_moe(first, f);
  }
  /// Every record's routing of each MoE block: f(block index among this model's MoE
  /// blocks, routing) (the loads of a step's micro-batches are spread over the records).
  template <class F>
  void each_routing(F&& f) const {
    std::vector<std::size_t> before(chunks.size(), 0);  // MoE blocks of the earlier chunks
    for (std::size_t k = 1; k < chunks.size(); ++k)
      each_moe(chunk_base[k - 1], [&](const Moe&, const BlockActs&) { ++before[k]; });
    for (std::size_t k = 1; k < chunks.size(); ++k)
      before[k] += before[k - 1];
    for (std::size_t r = 0; r < slot_layer.size(); ++r) {
      std::size_t b = before[record_chunk[r]];
      each_moe(r, [&](const Moe&, const BlockActs& a) {
        if (a.moe.routing) f(b, *a.moe.routing);
        ++b;
      });
    }
  }

  void forward_pass(const std::int32_t* tok, const std::int32_t* tgt) { forward_pass(0, tok, tgt); }

  void forward_pass(std::size_t slot, const std::int32_t* tok, const std::int32_t* tgt) {
    const StageBlocks& stage = chunk_of(slot);
    const std::vector<BlockActs>& rec = slot_layer[slot];
    const std::size_t bytes = static_cast<std::size_t>(N) * sizeof(std::int32_t);
    if (slot_tokens[slot].data) tensor::copy(c.ctx, slot_tokens[slot].data, tok, bytes);
    if (slot_targets[slot].data) tensor::copy(c.ctx, slot_targets[slot].data, tgt, bytes);
    const Tensor& x0 = rec[static_cast<std::size_t>(stage.first)].x;
    if (stage.embedding) net.embedding().forward(c, slot_tokens[slot], x0, row_buffers());
    net.forward_blocks(c, rope, B, T, rec, stage.first, stage.last,
                       stage.head ? head.x : slot_out[slot]);
    if (!stage.head) return;
    net.head().forward(c, head);
    if (const MultiTokenPrediction* p = net.mtp()) {
      mtp_tokens_host.resize(static_cast<std::size_t>(N));
      mtp_targets_host.resize(static_cast<std::size_t>(N));
      MultiTokenPrediction::make_targets(tgt, B, T, mtp_tokens_host.data(),
                                         mtp_targets_host.data());
      tensor::copy(c.ctx, mtp.tokens.data, mtp_tokens_host.data(), bytes);
      tensor::copy(c.ctx, mtp.targets.data, mtp_targets_host.data(), bytes);
      p->forward(c, net.embedding(), rope, B, T, net.head().normalised(head), mtp);
    }
  }

  void backward_pass(const std::function<void(std::size_t)>& on_ready) {
    backward_pass(0, on_ready);
  }

  void backward_pass(std::size_t slot, const std::function<void(std::size_t)>& on_ready) {
    const OnReady ready = [&](std::size_t offset) {
      if (on_ready) on_ready(offset);
    };
    const StageBlocks& stage = chunk_of(slot);
    // Everything from offset 0 is final after the first chunk's backward only: a later
    // chunk's blocks have reported their own offsets, the earlier chunks' come after.
    const auto all_ready = [&] {
      if (record_chunk[slot] == 0) ready(0);
    };
    const std::vector<BlockActs>& rec = slot_layer[slot];
    const Tensor& tok = slot_tokens[slot];
    const Tensor dx_rows = row_range(d_x, 0, rows);  // the blocks' (this rank's rows)
    const auto embedding_backward = [&] {
      if (stage.embedding) net.embedding().backward(c, tok, dx_rows, row_buffers());
    };
    if (!stage.head) {
      // d_x holds d(loss)/d(the stage's output), put there by the caller.
      net.backward_blocks(c, rope, B, T, rec, block, stage.first, stage.last, dx_rows, ready);
      embedding_backward();
      all_ready();
      return;
    }
    // head.logits holds d(loss)/d(logits) (Head::loss_and_gradient wrote it in place). The
    // MTP module first: its parameters come after the head's, and it adds to the gradient
    // of the head's normalised output, which it reads.
    if (const MultiTokenPrediction* p = net.mtp())
      p->backward(c, net.embedding(), rope, B, T, net.head().normalised(head), mtp, block,
                  mtp_scratch, d_x, ready);
    const Tensor d_main = net.mtp() ? mtp_scratch.d_main : Tensor{};
    net.head().backward(c, head, block.d_ln, dx_rows, ready, d_main, row_buffers());
    net.backward_blocks(c, rope, B, T, rec, block, stage.first, stage.last, dx_rows, ready);
    embedding_backward();
    all_ready();
  }

  /// Record `slot`'s balance loss of each MoE block (MicroBatchResult::aux_losses).
  std::vector<double> aux_losses(std::size_t slot) const {
    std::vector<double> out;
    each_moe(slot, [&](const Moe&, const BlockActs& a) {
      out.push_back(a.moe.routing ? a.moe.routing->aux_loss : 0.0);
    });
    return out;
  }

  /// The loss sum of `losses` (N) over the targets that count (`tgt`: the host copy of
  /// their targets). On a device the N per-token losses come to the host first (a few KiB
  /// per micro-batch).
  double sum_losses(const Tensor& losses, const std::int32_t* tgt, std::int64_t* valid) {
    const float* l = losses.ptr<float>();
    if (tensor::device_of(c.ctx) != tensor::Device::host) {
      host_losses.resize(static_cast<std::size_t>(N));
      tensor::download(c.ctx, losses, host_losses.data());
      l = host_losses.data();
    }
    const std::int32_t* t = tgt;
    double sum = 0.0;  // fixed order: deterministic
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < N; ++i) {
      if (t[i] == kIgnoreIndex) continue;
      sum += static_cast<double>(l[i]);
      ++n;
    }
    if (valid) *valid = n;
    return sum;
  }
};

LanguageModel::LanguageModel(const config::ModelSection& m, std::int64_t batch,
                             std::int64_t seq_len, tensor::Arena::Mode mode,
                             const ModelOptions& options)
    : impl_(std::make_unique<Impl>(m, options.tp, options.ep)),
      params_(std::make_unique<ParamStore>(impl_->net.parameter_layout(options.chunks), mode,
                                           options.ctx, options.gradient_memory,
                                           options.param_memory)),
      B_(batch),
      T_(seq_len) {
  const tensor::ExecContext& ctx = options.ctx;
  const DType storage = options.storage;
  const bool deterministic = options.deterministic;
  const config::Recompute recompute = options.recompute;
  const bool master_outside = options.master_outside;
  const std::vector<StageBlocks>& chunks = options.chunks;
  const TensorSlice& tp = options.tp;
  if (batch < 1 || seq_len < 1 || seq_len > m.max_seq_len)
    throw Error("model: micro-batch " + std::to_string(batch) + " x seq_len " +
                std::to_string(seq_len) + " is invalid for max_seq_len " +
                std::to_string(m.max_seq_len));
  if (m.n_layers < 1)
    throw Error("model: n_layers must be >= 1, got " + std::to_string(m.n_layers));
  if (!m.mla() && (m.d_model % m.n_heads != 0 || m.n_heads % m.n_kv_heads != 0 ||
                   (m.d_model / m.n_heads) % 2 != 0))
    throw Error(
        "model: d_model must split into n_heads even head dims and n_kv_heads must "
        "divide n_heads");
  if (storage != DType::f32 && storage != DType::bf16 && storage != DType::f16)
    throw Error("model: storage type must be f32, bf16 or f16, got " +
                std::string(dtype_name(storage)));
  Impl& s = *impl_;
  s.c.ctx = ctx;
  // The matrix products multiply in the storage type: their operands are rounded to it.
  s.c.ctx.math = storage;
  s.c.storage = storage;
  s.c.params = params_.get();
  s.B = batch;
  s.T = seq_len;
  s.N = batch * seq_len;
  if (s.N % tp.row_split() != 0)
    throw Error("model: sequence parallelism over " + std::to_string(tp.size) +
                " ranks needs the micro-batch's token rows (" + std::to_string(s.N) +
                ") to divide among them");
  s.rows = s.N / tp.row_split();
  s.C = m.d_model;
  s.L = m.n_layers;
  s.recompute = recompute;
  s.chunks = chunks;
  for (StageBlocks& chunk : s.chunks)
    if (chunk.last < 0) chunk.last = m.n_layers;
  if (s.chunks.size() > 1 || !s.chunks.front().is_whole(m.n_layers)) {
    // Stages hold dense and DeepSeekMoE blocks, each record with its own MoE routing; the
    // last one, with tied embeddings or the MTP module, a copy of the embedding table
    // (Transformer::holds_embedding_copy).
    if (s.holds_head() && s.chunks.back().slots != 1)
      throw Error("model: the last pipeline stage keeps one activation record, not " +
                  std::to_string(s.chunks.back().slots));
  }
  for (const StageBlocks& chunk : s.chunks)
    if (chunk.slots < 1)
      throw Error("model: a chunk of blocks needs at least one activation record, not " +
                  std::to_string(chunk.slots));
  s.net.bind(*params_, s.chunks);
  s.mtp_scale = m.mtp_loss_weight;
  // Latent attention has no fused core (its query/key and value widths differ).
  s.fused = !deterministic && !m.mla() &&
            kernels::fused_attention_supported(s.c.ctx, s.B, s.T, m.n_heads, m.n_kv_heads,
                                               m.d_model / m.n_heads);
  // Layout pass, then (for a real model) the same layout over blocks of the planned size.
  s.take_all();
  if (mode == Arena::Mode::allocate) {
    const std::size_t act_bytes = s.acts.used_bytes();
    const std::size_t work_bytes = s.work.used_bytes();
    const std::size_t recomputed_bytes = s.recomputed.used_bytes();
    const tensor::Device dev = tensor::device_of(ctx);
    s.acts = Arena("activations", Arena::Mode::allocate, act_bytes, dev, ctx.stream);
    s.work = Arena("workspace", Arena::Mode::allocate, work_bytes, dev, ctx.stream);
    if (recomputed_bytes > 0)
      s.recomputed =
          Arena("recomputed activations", Arena::Mode::allocate, recomputed_bytes, dev, ctx.stream);
    s.take_all();
    s.rope.fill(s.c.ctx, m.rope_theta, m.rope_scaling);
    if (storage != DType::f32 && master_outside) {
      // The compute copy is the parameter buffer itself (the master's shard is the
      // optimizer's): rounded in place, the routers' tensors kept.
      s.master_outside = true;
      s.each_moe([&](const Moe& moe, const BlockActs&) {
        for (const std::size_t i : moe.router_params()) {
          const ParamSpec& p = params_->spec(i);
          s.fp32_ranges.emplace_back(p.offset,
                                     p.offset + static_cast<std::size_t>(p.shape.numel()));
        }
      });
      std::sort(s.fp32_ranges.begin(), s.fp32_ranges.end());
      refresh_compute_params();
    } else if (storage != DType::f32) {
      // The host emulation keeps the rounded copy in f32 (a 16-bit back end: half the
      // bytes; plan.cpp counts those). Filled by refresh_compute_params().
      const std::size_t n = params_->buffer_elements();
      s.compute =
          Arena("compute parameters", Arena::Mode::allocate, n * sizeof(float), dev, ctx.stream);
      s.c.compute_base =
          s.compute.take("compute copy", {static_cast<std::int64_t>(n)}, DType::f32).ptr<float>();
      refresh_compute_params();
    }
  }
}

LanguageModel::~LanguageModel() = default;

DType LanguageModel::storage() const {
  return impl_->c.storage;
}

bool LanguageModel::fused_attention() const {
  return impl_->fused;
}

void LanguageModel::refresh_compute_params() {
  Impl& s = *impl_;
  if (s.master_outside) {
    s.round_compute(params_->params_flat(), 0);
    return;
  }
  if (!s.c.compute_base) return;
  const std::size_t n = params_->buffer_elements();
  tensor::copy(s.c.ctx, s.c.compute_base, params_->params_data(), n * sizeof(float));
  Tensor all = params_->params_flat();
  all.data = s.c.compute_base;
  kernels::round_to_storage(s.c.ctx, all, s.c.storage);
}

void LanguageModel::refresh_compute_params(const float* master, std::size_t first,
                                           std::size_t last) {
  Impl& s = *impl_;
  if (!s.master_outside)
    throw Error(
        "model::LanguageModel::refresh_compute_params: this model keeps its own master "
        "parameters (constructed without master_outside, or for f32)");
  if (first > last || last > params_->buffer_elements())
    throw Error("model::LanguageModel::refresh_compute_params: elements [" + std::to_string(first) +
                ", " + std::to_string(last) + ") are not within the " +
                std::to_string(params_->buffer_elements()) + " of the parameter buffer");
  if (first == last) return;
  Tensor part = params_->params_flat();  // (last - first) of the flat buffer
  part.shape = tensor::Shape{static_cast<std::int64_t>(last - first)};
  part.data = params_->params_data() + first;
  tensor::copy(s.c.ctx, part.ptr<float>(), master, (last - first) * sizeof(float));
  s.round_compute(part, first);
}

ModelMemory LanguageModel::memory() const {
  ModelMemory mem;
  mem.parameters = params_->buffer_elements() * sizeof(float);
  mem.gradients = params_->buffer_elements() * sizeof(float);
  mem.activations = impl_->acts.used_bytes();
  // MoE blocks keep their routing on the host, outside the arenas (Moe::routing_bytes).
  // One routing per record (stage slots).
  for (std::size_t r = 0; r < impl_->slot_layer.size(); ++r)
    impl_->each_moe(
        r, [&](const Moe& m, const BlockActs&) { mem.activations += m.routing_bytes(impl_->N); });
  mem.recompute = impl_->recomputed.used_bytes();
  mem.workspace = impl_->work.used_bytes();
  return mem;
}

MicroBatchResult LanguageModel::forward(const std::int32_t* tokens, const std::int32_t* targets) {
  if (params_->planning()) throw Error("model: forward() on a model built only to plan");
  const auto t0 = std::chrono::steady_clock::now();
  Impl& s = *impl_;
  s.forward_pass(tokens, targets);
  MicroBatchResult r;
  s.net.head().loss(s.c, s.head, s.targets);
  if (const MultiTokenPrediction* p = s.net.mtp()) {
    p->loss(s.c, s.mtp);
    r.mtp_loss_sum = s.sum_losses(s.mtp.head.losses, s.mtp_targets_host.data(), &r.mtp_tokens);
  }
  r.loss_sum = s.sum_losses(s.head.losses, targets, &r.valid_tokens);  // waits for the device
  r.aux_losses = s.aux_losses(0);
  r.forward_seconds = seconds_since(t0);
  return r;
}

MicroBatchResult LanguageModel::forward_backward(const std::int32_t* tokens,
                                                 const std::int32_t* targets, float grad_scale,
                                                 const std::function<void(std::size_t)>& on_ready) {
  if (params_->planning()) throw Error("model: forward_backward() on a model built only to plan");
  Impl& s = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  s.forward_pass(tokens, targets);
  MicroBatchResult r;
  s.net.head().loss_and_gradient(s.c, s.head, s.targets, grad_scale);
  if (const MultiTokenPrediction* p = s.net.mtp()) {
    p->loss_and_gradient(s.c, s.mtp, grad_scale * static_cast<float>(s.mtp_scale));
    r.mtp_loss_sum = s.sum_losses(s.mtp.head.losses, s.mtp_targets_host.data(), &r.mtp_tokens);
  }
  s.c.aux_grad_scale = grad_scale * static_cast<float>(s.T);
  r.loss_sum = s.sum_losses(s.head.losses, targets, &r.valid_tokens);  // waits for the device
  const auto t1 = std::chrono::steady_clock::now();
  r.forward_seconds = std::chrono::duration<double>(t1 - t0).count();
  s.backward_pass(on_ready);
  tensor::synchronize(s.c.ctx);  // a device's backward has run, not only been enqueued
  r.backward_seconds = seconds_since(t1);
  r.aux_losses = s.aux_losses(0);
  return r;
}

const std::vector<StageBlocks>& LanguageModel::chunks() const {
  return impl_->chunks;
}

std::size_t LanguageModel::record(int chunk, std::int64_t micro) const {
  const Impl& s = *impl_;
  if (chunk < 0 || static_cast<std::size_t>(chunk) >= s.chunks.size() || micro < 0)
    throw Error("model: no chunk " + std::to_string(chunk) + " of " +
                std::to_string(s.chunks.size()) + " (micro-batch " + std::to_string(micro) + ")");
  const auto c = static_cast<std::size_t>(chunk);
  return s.chunk_base[c] + static_cast<std::size_t>(micro % s.chunks[c].slots);
}

tensor::Tensor LanguageModel::stage_input(std::size_t slot) const {
  const Impl& s = *impl_;
  return s.slot_layer.at(slot)[static_cast<std::size_t>(s.chunk_of(slot).first)].x;
}

tensor::Tensor LanguageModel::stage_output(std::size_t slot) const {
  const Impl& s = *impl_;
  return s.chunk_of(slot).head ? s.head.x : s.slot_out.at(slot);
}

tensor::Tensor LanguageModel::stage_gradient() const {
  return row_range(impl_->d_x, 0, impl_->rows);
}

MicroBatchResult LanguageModel::stage_forward(std::size_t slot, const std::int32_t* tokens,
                                              const std::int32_t* targets, float grad_scale,
                                              bool with_gradient) {
  if (params_->planning()) throw Error("model: stage_forward() on a model built only to plan");
  Impl& s = *impl_;
  if (slot >= s.slot_layer.size())
    throw Error("model: activation record " + std::to_string(slot) + " of " +
                std::to_string(s.slot_layer.size()));
  const auto t0 = std::chrono::steady_clock::now();
  s.forward_pass(slot, tokens, targets);
  s.slot_scale[slot] = with_gradient ? grad_scale : 0.0f;
  MicroBatchResult r;
  if (s.chunk_of(slot).head) {
    if (with_gradient)
      s.net.head().loss_and_gradient(s.c, s.head, s.slot_targets[slot], grad_scale);
    else
      s.net.head().loss(s.c, s.head, s.slot_targets[slot]);
    r.loss_sum = s.sum_losses(s.head.losses, targets, &r.valid_tokens);  // waits for the device
    if (const MultiTokenPrediction* p = s.net.mtp()) {
      if (with_gradient)
        p->loss_and_gradient(s.c, s.mtp, grad_scale * static_cast<float>(s.mtp_scale));
      else
        p->loss(s.c, s.mtp);
      r.mtp_loss_sum = s.sum_losses(s.mtp.head.losses, s.mtp_targets_host.data(), &r.mtp_tokens);
    }
  }
  tensor::synchronize(s.c.ctx);
  r.aux_losses = s.aux_losses(slot);
  r.forward_seconds = seconds_since(t0);
  return r;
}

double LanguageModel::stage_backward(std::size_t slot,
                                     const std::function<void(std::size_t)>& on_ready) {
  if (params_->planning()) throw Error("model: stage_backward() on a model built only to plan");
  Impl& s = *impl_;
  if (slot >= s.slot_layer.size())
    throw Error("model: activation record " + std::to_string(slot) + " of " +
                std::to_string(s.slot_layer.size()));
  const auto t0 = std::chrono::steady_clock::now();
  // The balance loss's gradient, as forward_backward's: grad_scale x seq_len per sequence.
  s.c.aux_grad_scale = s.slot_scale[slot] * static_cast<float>(s.T);
  s.backward_pass(slot, on_ready);
  tensor::synchronize(s.c.ctx);
  return seconds_since(t0);
}

tensor::Tensor LanguageModel::logits() const {
  return impl_->head.logits;
}

std::int64_t LanguageModel::moe_blocks() const {
  std::int64_t n = 0;
  impl_->each_moe([&](const Moe&, const BlockActs&) { ++n; });
  return n;
}

std::int64_t LanguageModel::moe_experts() const {
  std::int64_t e = 0;
  impl_->each_moe([&](const Moe& m, const BlockActs&) { e = m.experts(); });
  return e;
}

std::vector<double> LanguageModel::moe_loads() const {
  if (params_->planning()) throw Error("model: moe_loads() on a model built only to plan");
  const auto E = static_cast<std::size_t>(moe_experts());
  std::vector<double> out(static_cast<std::size_t>(moe_blocks()) * E, 0.0);
  // Token counts: exact in double, the same sum whichever records counted them.
  impl_->each_routing([&](std::size_t b, const MoeRouting& r) {
    for (std::size_t e = 0; e < E; ++e)
      out[b * E + e] += r.load[e];
  });
  return out;
}

void LanguageModel::reset_moe_loads() {
  impl_->each_routing([&](std::size_t, MoeRouting& r) {
    std::fill(r.load.begin(), r.load.end(), 0.0);
    r.dropped = 0.0;
  });
}

void LanguageModel::update_moe_bias(const std::vector<double>& loads, double rate) {
  const std::int64_t E = moe_experts();
  if (static_cast<std::int64_t>(loads.size()) != moe_blocks() * E)
    throw Error("model: update_moe_bias needs " + std::to_string(moe_blocks() * E) +
                " expert loads, got " + std::to_string(loads.size()));
  std::size_t at = 0;
  impl_->each_moe([&](const Moe& m, const BlockActs&) {
    m.update_bias(*params_,
                  std::vector<double>(loads.begin() + static_cast<std::ptrdiff_t>(at),
                                      loads.begin() + static_cast<std::ptrdiff_t>(at + E)),
                  rate);
    at += static_cast<std::size_t>(E);
  });
  // A master outside: the biases are the compute copy's own fp32 values (fp32_ranges),
  // nothing else changed.
  if (!impl_->master_outside) refresh_compute_params();
}

void LanguageModel::set_expert_parallel(ExpertParallel* ep) {
  const ExpertSlice want = impl_->net.expert_slice();
  if (want.size > 1 && moe_blocks() > 0 &&
      (ep == nullptr || ep->size() != want.size || ep->rank() != want.rank))
    throw Error("model: built as expert slice " + std::to_string(want.rank) + " of " +
                std::to_string(want.size) + ", given another expert group");
  impl_->c.experts = ep;
}

void LanguageModel::set_tensor_parallel(TensorParallel* tp) {
  const TensorSlice want = impl_->net.tensor_slice();
  if (want.size > 1 && (tp == nullptr || tp->size() != want.size || tp->rank() != want.rank))
    throw Error("model: built as tensor-parallel slice " + std::to_string(want.rank) + " of " +
                std::to_string(want.size) + ", given another tensor group");
  if (want.size > 1 && tensor::device_of(impl_->c.ctx) != tensor::Device::host)
    throw Error(
        "model: tensor parallelism needs the model in host memory (not built for "
        "devices yet)");
  impl_->c.tensor = tp;
}

void LanguageModel::set_expert_nodes(std::vector<std::int32_t> expert_node) {
  impl_->each_moe([&](const Moe& m, const BlockActs&) { m.check_expert_nodes(expert_node); });
  impl_->expert_node = std::move(expert_node);
  impl_->c.expert_node = impl_->expert_node.empty() ? nullptr : &impl_->expert_node;
}

double LanguageModel::moe_dropped() const {
  double out = 0.0;
  impl_->each_routing([&](std::size_t, const MoeRouting& r) { out += r.dropped; });
  return out;
}

std::vector<std::size_t> LanguageModel::moe_bias_offsets() const {
  std::vector<std::size_t> out;
  impl_->each_moe([&](const Moe& m, const BlockActs&) {
    if (m.has_bias()) out.push_back(params_->spec(m.bias_index()).offset);
  });
  return out;
}

std::vector<float> LanguageModel::moe_bias() const {
  std::vector<float> out;
  impl_->each_moe([&](const Moe& m, const BlockActs&) {
    if (!m.has_bias()) {
      out.insert(out.end(), static_cast<std::size_t>(m.experts()), 0.0f);
      return;
    }
    const tensor::Tensor b = params_->param(m.bias_index());
    const std::size_t at = out.size();
    out.resize(at + static_cast<std::size_t>(b.numel()));
    tensor::download(params_->context(), b, out.data() + at);
  });
  return out;
}

bool LanguageModel::has_mtp() const {
  return impl_->net.mtp() != nullptr;
}

void LanguageModel::set_mtp_loss_scale(double ratio) {
  if (!(ratio >= 0.0) || !std::isfinite(ratio))
    throw Error("model: the MTP loss scale must be finite and >= 0, got " + std::to_string(ratio));
  impl_->mtp_scale = ratio;
}

tensor::Tensor LanguageModel::mtp_logits() const {
  return impl_->mtp.head.logits;
}

DType storage_type(config::Precision precision) {
  switch (precision) {
    case config::Precision::fp32:
      return DType::f32;
    case config::Precision::bf16:
      return DType::bf16;
    case config::Precision::fp16:
      return DType::f16;
  }
  throw Error("model: training.precision holds no known value (" +
              std::to_string(static_cast<int>(precision)) + ")");
}

}  // namespace dst::model
