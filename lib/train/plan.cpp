#include "train/plan.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "model/language_model.hpp"
#include "model/layers/moe_router.hpp"
#include "model/stage.hpp"
#include "train/grad_buckets.hpp"
#include "train/grad_sync.hpp"

namespace dst::train {

using model::count_parameters;
using model::ExpertSlice;
using model::format_bytes;
using model::format_count;
using model::LanguageModel;
using model::ModelMemory;
using model::ParamCount;
using model::ParamSpec;
using model::ParamStore;
using model::StageBlocks;
using model::TensorSlice;

std::uint64_t largest_shard_bytes(const model::ParamStore& store, int data_ranks,
                                  int expert_data_ranks, bool by_parts) {
  const OwnExperts experts = holds_own_experts(store)
                                 ? locate_own_experts(store)
                                 : OwnExperts{store.size(), store.buffer_elements()};
  const GradSync::Shards shards =
      GradSync::zero_shards(store, experts, data_ranks, expert_data_ranks, by_parts);
  const auto largest = [](const ZeroShards& s) {
    std::size_t most = 0;
    for (int r = 0; r < s.ranks(); ++r)
      most = std::max(most, s.last(r) - s.first(r));
    return most;
  };
  std::size_t most = largest(shards.replicated);
  if (shards.own_experts) most += largest(*shards.own_experts);
  return most * sizeof(float);
}

const std::vector<HostRates>& rate_table() {
  // docs/performance.md, "The rate table", says how each figure was obtained.
  static const std::vector<HostRates> table{
      {"cpu",
       "measured: the 2-core VM of docs/performance.md, one rank per core; SGEMM 2048^3 "
       "start-up median; shared-memory gradient sum of 118 MB on 2 ranks",
       118.0, 118.0, 2, 6.9, 0.0, 0.0},
      {"cpu-mpi",
       "measured: the same VM; Open MPI's all-reduce of 16 MiB on 2 ranks "
       "(comm_allreduce_benchmark)",
       118.0, 118.0, 2, 1.5, 0.0, 0.0},
      {"h100",
       "data sheet: H100 SXM5 80 GB (79.6 GiB usable), dense FP32 67 / BF16 989 TFLOP/s; "
       "NVLink 4 450 GB/s per direction within 8 GPUs; 400 Gb/s InfiniBand per GPU across "
       "nodes",
       67000.0, 989000.0, 8, 450.0, 50.0, 79.6},
      {"h200",
       "measured on one H200 SXM (2026-12-04, docs/gpu.md): cuBLASLt 8192^3 fp32 51 / bf16 "
       "791 TFLOP/s (gpu_gemm_rate, median of three runs' medians), 139.3 GiB free for the "
       "run; data sheet: NVLink 4 450 GB/s per direction within 8 GPUs, 400 Gb/s "
       "InfiniBand per GPU across nodes",
       51000.0, 791000.0, 8, 450.0, 50.0, 139.3},
  };
  return table;
}

const HostRates& host_rates(const std::string& kind) {
  std::string names;
  for (const HostRates& r : rate_table()) {
    if (r.kind == kind) return r;
    names += (names.empty() ? "" : ", ") + r.kind;
  }
  throw Error("plan: no rates for host kind '" + kind + "' (the rate table has " + names + ")");
}

Plan make_plan(const config::RunConfig& c, const config::Layout& layout,
               const PlanOptions& options) {
  const auto& m = c.model;
  if (options.zero_stage < 0 || options.zero_stage > 2)
    throw Error("plan: zero stage must be 0, 1 or 2, got " + std::to_string(options.zero_stage));
  const HostRates& rates = host_rates(options.host);
  Plan plan;
  plan.options = options;
  plan.params = count_parameters(m);
  const std::int64_t T = c.data.seq_len;
  plan.flops_per_token = model::training_flops_per_token(m, T);
  plan.recompute_flops_per_token = model::recompute_flops_per_token(m, T, c.training.recompute);
  plan.tokens_per_step = layout.global_batch_size * T;
  plan.flops_per_step = plan.flops_per_token * static_cast<double>(plan.tokens_per_step);

  // The layout pass: the model's own constructor, in planning mode, takes every buffer
  // it would allocate for a micro-batch and allocates nothing.
  // Tensor parallelism: slice 0 of the layers (every slice has the same shapes).
  if (layout.tensor != c.parallel.tensor)
    throw Error("plan: the layout has " + std::to_string(layout.tensor) +
                " tensor-parallel ranks but the deck's parallel.tensor is " +
                std::to_string(c.parallel.tensor));
  const TensorSlice slice{0, layout.tensor, c.parallel.sequence_parallel};
  // Expert parallelism: expert slot 0 of the group, which holds 1 / layout.expert of the
  // routed experts (layers/moe_dispatch.hpp; every slot the same shapes). With pipeline
  // stages, on each stage holding an MoE block (own_expert_storage, planned per stage
  // below).
  const ExpertSlice experts{0, model::own_expert_storage(c) ? layout.expert : 1};
  model::ModelOptions planned;
  planned.recompute = c.training.recompute;
  planned.tp = slice;
  planned.ep = experts;
  const LanguageModel model(m, c.training.micro_batch_size, T, tensor::Arena::Mode::plan, planned);
  std::int64_t logical = 0;
  for (const ParamSpec& s : model.params().specs())
    logical += model::logical_shape(s).numel() * s.ep_size;  // an expert slot's: every slot's
  if (logical != plan.params.total())
    throw Error("plan: the model's layout has " + std::to_string(logical) +
                " parameters but the closed form gives " + std::to_string(plan.params.total()));

  // Every rank holds the whole model for its forward and backward, or with pipeline
  // stages its stage's layers (the heaviest stage plans the memory per rank), or with
  // tensor parallelism its slice of them, or with expert parallelism its 1 / expert of the
  // routed experts (their parameters, gradients and moments): data-parallel ranks are
  // replicas (of the same experts: the expert-data group). ZeRO divides
  // what only the optimizer step reads by the data ranks (the own experts' part by the
  // expert-data ranks, D / expert, which hold its replicas).
  const std::uint64_t D = static_cast<std::uint64_t>(layout.data);
  // Expert parallelism: the own experts' part of the buffer (the last, layers/
  // moe_dispatch.hpp), bytes of fp32.
  const auto own_experts_of = [](const LanguageModel& d) -> std::uint64_t {
    const ParamStore& store = d.params();
    return holds_own_experts(store)
               ? (store.buffer_elements() - locate_own_experts(store).offset) * sizeof(float)
               : 0;
  };
  std::uint64_t own_experts = own_experts_of(model);
  const std::uint64_t expert_data =
      own_experts > 0 ? D / static_cast<std::uint64_t>(layout.expert) : 1;
  // ZeRO's largest shard of the store a rank holds (the run's shards: GradSync).
  const auto largest_shard_of = [&](const LanguageModel& d) {
    return largest_shard_bytes(d.params(), static_cast<int>(D), static_cast<int>(expert_data),
                               !options.bucket_copies);
  };
  std::uint64_t largest_shard = largest_shard_of(model);
  const bool low_precision = c.training.precision != config::Precision::fp32;
  // The MoE blocks a rank holds: the whole model's (its MTP module's included), or a
  // pipeline stage's.
  const std::int64_t model_moe_blocks =
      count_parameters(m).moe_layers + (m.mtp_moe_block() ? 1 : 0);
  // `moe_records`: the MoE blocks' activation records (blocks x micro-batches in flight).
  const auto memory_of = [&](const ModelMemory& mm, std::int64_t moe_records) {
    MemoryPlan mem;
    const std::uint64_t full = mm.parameters;  // one fp32 flat buffer (with alignment)
    const auto shard = [&](bool sharded) { return sharded ? largest_shard : full; };
    // fp32: the master parameters are what the forward reads. bf16/fp16: a 16-bit compute
    // copy for the forward and fp32 master weights for the optimizer.
    mem.parameters = low_precision ? full / 2 : full;
    mem.master = low_precision ? shard(options.zero_stage >= 1) : 0;
    // Stage 2 keeps a shard of the reduced gradients, and a bucket's pages outside it are
    // returned once its reduce-scatter completes. When the communication keeps up with
    // the backward (what the buckets overlap for), the last bucket is the one still in
    // flight at the end of the backward: the peak is the shard plus one bucket, or the
    // whole buffer when it makes no more (tiny: one bucket, reduce-scattered after the
    // whole backward). Communication slower than the backward leaves more buckets
    // resident, up to the whole buffer: measured on 4 ranks sharing 2 cores, 0.89-1.17 of
    // this (docs/performance.md). Accumulating micro-batches needs every parameter's local
    // gradient until the last one: the whole buffer then.
    // The buffer's buckets as the run cuts them (GradBuckets::layout), largest first.
    std::vector<std::uint64_t> buckets;
    for (const GradBuckets::Range& r :
         GradBuckets::layout(full / sizeof(float), GradSync::bucket_bytes(c)))
      buckets.push_back((r.end - r.begin) * sizeof(float));
    std::sort(buckets.rbegin(), buckets.rend());
    const auto largest = [&](std::size_t k) {
      std::uint64_t sum = 0;
      for (std::size_t i = 0; i < k && i < buckets.size(); ++i)
        sum += buckets[i];
      return sum;
    };
    mem.gradients = options.zero_stage >= 2 && layout.grad_accum_steps == 1
                        ? std::min(full, shard(true) + largest(1))
                        : full;
    mem.optimizer = 2 * shard(options.zero_stage >= 1);  // AdamW first and second moments
    // Routed experts' activations depend on the routing. The plan is dropless with the
    // expected balanced load, top_k x tokens / n_routed_experts rows per expert; the MoE
    // layer takes its N x top_k rows as one buffer sorted by expert (Moe::take), so the
    // total is that whatever the imbalance. MoE blocks' host routing is in mm.activations.
    mem.activations = mm.activations;
    // Expert parallelism: each MoE block keeps the rows its experts received for its
    // backward (layers/moe_dispatch.hpp, host memory outside the arenas: inputs, outputs,
    // their gradients and the staging copy, 5 x d_model, and the SwiGLU's h1, h3, g and
    // g's gradient, 4 x moe_intermediate_size, fp32), planned at the balanced load of micro
    // x seq_len x top-k rows per rank, for each record (a pipeline stage's MoE blocks x
    // its micro-batches in flight, each with its own exchange).
    if (layout.expert > 1 && m.n_routed_experts > 0) {
      const std::int64_t blocks = moe_records;
      const auto rows = static_cast<std::uint64_t>(c.training.micro_batch_size * c.data.seq_len *
                                                   m.num_experts_per_tok);
      mem.activations += static_cast<std::uint64_t>(blocks) * rows *
                         static_cast<std::uint64_t>(5 * m.d_model + 4 * m.moe_intermediate_size) *
                         sizeof(float);
    }
    mem.recompute = mm.recompute;
    mem.workspace = mm.workspace;
    // Two gradient buckets in flight through the communicator (the two largest; the whole
    // buffer when it makes fewer); ZeRO over MPI: one more on rank 0 (PlanOptions::rank).
    mem.comm = D > 1 && options.bucket_copies ? largest(2) : 0;
    if (D > 1 && options.bucket_copies && options.zero_stage >= 1 && options.rank == 0)
      mem.comm += largest(1);
    return mem;
  };
  ModelMemory mm = model.memory();
  auto& mem = plan.memory;
  mem = memory_of(mm, model_moe_blocks);
  if (layout.pipeline != c.parallel.pipeline)
    throw Error("plan: the layout has " + std::to_string(layout.pipeline) +
                " pipeline stages but the deck's parallel.pipeline is " +
                std::to_string(c.parallel.pipeline));
  if (layout.pipeline > 1) {
    // Each stage in planning mode, as the trainer builds it (rank_chunks: one chunk under
    // 1f1b, parallel.virtual_stages under interleaved, each with the records its schedule
    // keeps in flight).
    const std::int64_t micro = layout.grad_accum_steps;
    std::uint64_t heaviest_own_experts = own_experts;
    // Under sequence parallelism each rank of a tensor group sends its share of the rows.
    plan.p2p_bytes_per_micro_batch = static_cast<double>(c.training.micro_batch_size) *
                                     static_cast<double>(T) * static_cast<double>(m.d_model) *
                                     sizeof(float) / static_cast<double>(slice.row_split());
    std::vector<std::vector<StageBlocks>> ranks_chunks;
    for (int s = 0; s < layout.pipeline; ++s)
      ranks_chunks.push_back(model::rank_chunks(c, s, micro));
    for (int s = 0; s < layout.pipeline; ++s) {
      const std::vector<StageBlocks>& chunks = ranks_chunks[static_cast<std::size_t>(s)];
      const ExpertSlice stage_experts{0, model::own_expert_storage(c, s) ? layout.expert : 1};
      model::ModelOptions stage_options = planned;
      stage_options.chunks = chunks;
      stage_options.ep = stage_experts;
      const LanguageModel part(m, c.training.micro_batch_size, T, tensor::Arena::Mode::plan,
                               stage_options);
      Plan::Stage st;
      st.first = chunks.front().first;
      st.last = chunks.back().last;
      st.embedding = chunks.front().embedding;
      st.head = chunks.back().head;
      st.embedding_copy = model::stages_share_embedding(c) && st.head && !st.embedding;
      st.parameters = part.params().parameter_count();
      st.in_flight = 0;
      std::int64_t moe_records = 0;
      for (const StageBlocks& chunk : chunks) {
        st.chunks.emplace_back(chunk.first, chunk.last);
        st.in_flight += chunk.slots;
        moe_records += model::moe_blocks_in(m, chunk) * chunk.slots;
      }
      if (st.head && m.mtp_moe_block()) ++moe_records;  // the MTP module's record
      if (st.embedding_copy)
        plan.embedding_sum_bytes = static_cast<double>(m.vocab_size / slice.size * m.d_model) *
                                   static_cast<double>(sizeof(float));
      own_experts = own_experts_of(part);  // (memory_of reads them) this stage's
      largest_shard = largest_shard_of(part);
      st.memory = memory_of(part.memory(), moe_records);
      st.sends_in_flight = model::sends_in_flight(ranks_chunks, s);
      st.memory.comm += static_cast<std::uint64_t>(st.sends_in_flight) *
                        static_cast<std::uint64_t>(plan.p2p_bytes_per_micro_batch);
      if (s == 0 || st.memory.total() > mem.total()) {
        mem = st.memory;
        plan.heaviest_stage = s;
        mm = part.memory();
        heaviest_own_experts = own_experts;
      }
      plan.stages.push_back(st);
    }
    own_experts = heaviest_own_experts;
    plan.chunks = model::pipeline_chunks(c);
    plan.bubble_fraction =
        static_cast<double>(layout.pipeline - 1) / static_cast<double>(plan.chunks * micro);
  }
  const std::uint64_t full = mm.parameters;

  // Ring algorithms: an all-reduce sends 2 (p-1)/p of the buffer per rank, a
  // reduce-scatter or an all-gather (p-1)/p.
  if (D > 1) {
    const double share = static_cast<double>(D - 1) / static_cast<double>(D);
    const auto add = [&](std::string what, double bytes, double factor) {
      plan.collectives.push_back({std::move(what), bytes, factor * share * bytes});
      plan.comm_bytes_per_step += factor * share * bytes;
    };
    // Expert parallelism: the own experts' part of the buffer is summed over the
    // expert-data group of D / X ranks only.
    if (options.zero_stage == 0 && own_experts > 0) {
      add("all-reduce of the gradients (fp32) but the own experts'",
          static_cast<double>(full - own_experts), 2.0);
      const auto R = D / static_cast<std::uint64_t>(layout.expert);
      const double bytes = static_cast<double>(own_experts);
      const double sent =
          2.0 * static_cast<double>(R - 1) / static_cast<double>(R) * bytes;  // 0 for R = 1
      plan.collectives.push_back({"all-reduce of the own experts' gradients (fp32) over " +
                                      std::to_string(R) + " expert-data ranks",
                                  bytes, sent});
      plan.comm_bytes_per_step += sent;
    } else if (options.zero_stage == 0) {
      add("all-reduce of the gradients (fp32)", static_cast<double>(full), 2.0);
    } else if (own_experts > 0) {
      // ZeRO with per-rank experts: each part reduce-scattered and all-gathered over its
      // group (the parameters' all-gather in the compute copy's precision).
      const double rest = static_cast<double>(full - own_experts);
      const double bits = low_precision ? 0.5 : 1.0;
      const std::string precision = low_precision ? " (16-bit)" : " (fp32)";
      add("reduce-scatter of the gradients (fp32) but the own experts'", rest, 1.0);
      add("all-gather of the parameters" + precision + " but the own experts'", bits * rest, 1.0);
      const double R = static_cast<double>(expert_data);
      const double bytes = static_cast<double>(own_experts);
      const std::string over = " over " + std::to_string(expert_data) + " expert-data ranks";
      plan.collectives.push_back({"reduce-scatter of the own experts' gradients (fp32)" + over,
                                  bytes, (R - 1.0) / R * bytes});
      plan.collectives.push_back({"all-gather of the own experts' parameters" + precision + over,
                                  bits * bytes, (R - 1.0) / R * bits * bytes});
      plan.comm_bytes_per_step += (R - 1.0) / R * (1.0 + bits) * bytes;
    } else {
      add("reduce-scatter of the gradients (fp32)", static_cast<double>(full), 1.0);
      add(low_precision ? "all-gather of the parameters (16-bit)"
                        : "all-gather of the parameters (fp32)",
          static_cast<double>(mem.parameters), 1.0);
    }
    // Loss sum, tokens, non-finite flag, stop requests (4 doubles); ZeRO: the squared
    // gradient norm of each shard too; an MTP module: its loss sum, and before the
    // micro-batches the global batch's main and MTP target counts (2 doubles).
    add("all-reduce of the step's scalars",
        (options.zero_stage == 0 ? 32.0 : 40.0) + (m.mtp_depth > 0 ? 8.0 : 0.0), 2.0);
    if (m.mtp_depth > 0) add("all-reduce of the step's target counts (MTP loss weight)", 16.0, 2.0);
  }
  // Expert parallelism (parallel.expert = X > 1): each MoE layer sends its N x top_k token
  // rows (fp32, d_model wide) to their experts' ranks and gets them back, forward and
  // backward: 4 all-to-all-v per layer and micro-batch, of which (X-1)/X of the rows leave
  // the rank under the expected balanced load (training.recompute full: 2 more, the
  // forward's again). Not a ring: the bytes are what the rank sends.
  // A pipeline stage's rank runs its own MoE blocks: the heaviest stage's are planned.
  const std::int64_t X = layout.expert;
  std::int64_t moe_blocks = model_moe_blocks;
  if (layout.pipeline > 1) {
    moe_blocks = 0;
    // (Each rank's chunks: under the interleaved schedule [first, last) spans the other
    // ranks' blocks too.)
    for (const Plan::Stage& ps : plan.stages) {
      std::int64_t n = 0;
      for (const auto& [first, last] : ps.chunks) {
        StageBlocks sb;
        sb.first = first;
        sb.last = last;
        n += model::moe_blocks_in(m, sb);
      }
      if (ps.head && m.mtp_moe_block()) ++n;  // the MTP module's
      moe_blocks = std::max(moe_blocks, n);
    }
  }
  if (X > 1 && moe_blocks > 0) {
    const double rows =
        static_cast<double>(c.training.micro_batch_size * c.data.seq_len * m.num_experts_per_tok);
    const double layer_bytes = rows * static_cast<double>(m.d_model) * sizeof(float);
    const double times = c.training.recompute == config::Recompute::full ? 6.0 : 4.0;
    plan.alltoall_bytes_per_moe_layer = times * static_cast<double>(layout.grad_accum_steps) *
                                        static_cast<double>(X - 1) / static_cast<double>(X) *
                                        layer_bytes;
    const double bytes = plan.alltoall_bytes_per_moe_layer * static_cast<double>(moe_blocks);
    plan.collectives.push_back(
        {"all-to-all-v of the MoE token rows, expert groups of " + std::to_string(X) + ": " +
             std::to_string(moe_blocks) + " MoE layers x " +
             format_bytes(plan.alltoall_bytes_per_moe_layer) + " sent per layer",
         layer_bytes, bytes});
    plan.comm_bytes_per_step += bytes;
  }
  // Node-limited routing and the experts' capacity (layers/moe_router.hpp).
  if (m.n_routed_experts > 0) {
    const std::int64_t tokens = c.training.micro_batch_size * c.data.seq_len;
    plan.expert_capacity = model::expert_capacity(m.moe.capacity_factor, tokens,
                                                  m.num_experts_per_tok, m.n_routed_experts);
    if (m.moe.max_nodes_per_token > 0) {
      const std::int64_t per_node =
          std::max<std::int64_t>(1, host_rates(options.host).ranks_per_node);
      plan.expert_nodes =
          c.debug.expert_nodes > 0 ? c.debug.expert_nodes : (X + per_node - 1) / per_node;
      plan.token_nodes =
          std::min({m.moe.max_nodes_per_token, m.num_experts_per_tok, plan.expert_nodes});
      // Rows travel between ranks only: the nodes of the expert group (a test map of more
      // nodes than ranks splits ranks, whose rows do not leave them).
      const std::int64_t rank_nodes = std::min<std::int64_t>(plan.expert_nodes, X);
      if (X > 1 && rank_nodes > 1) {
        const double n = static_cast<double>(rank_nodes);
        const double times = (c.training.recompute == config::Recompute::full ? 6.0 : 4.0) *
                             static_cast<double>(layout.grad_accum_steps);
        const double row_bytes = static_cast<double>(m.d_model) * sizeof(float);
        const double rows = static_cast<double>(tokens * m.num_experts_per_tok);
        plan.cross_node_bytes_per_moe_layer = times * rows * (n - 1.0) / n * row_bytes;
        plan.cross_node_dedup_bound_per_moe_layer =
            times * static_cast<double>(tokens) * static_cast<double>(plan.token_nodes) * row_bytes;
      }
    }
  }

  // Tensor parallelism (layout.tensor = TP > 1): per micro-batch, one all-reduce of the
  // (micro x seq_len, d_model) fp32 residual-stream tensor after each block's attention and
  // MLP in forward and before each in backward, one after the embedding and one before the
  // head's norm (training.recompute full: the blocks' forward again). Ring factor
  // 2 (TP-1)/TP. A stage counts its own blocks (the heaviest's planned).
  // Sequence parallelism (block.hpp) counts in all-reduce equivalents (a reduce-scatter
  // or an all-gather of the same rows: half of one): per block the forward's two
  // all-gathers and two reduce-scatters (2), the backward's four all-gathers (the output
  // gradient and the re-gathered norm, for the attention and the MLP) and two
  // reduce-scatters (3); the embedding's reduce-scatter and the gather of its gradient (1),
  // the head's gather of its norm's rows and the reduce-scatter of their gradient (1); and
  // an all-reduce of d_model floats per norm (two per block and the final one) for the norm
  // weights' gradients.
  const std::int64_t TP = layout.tensor;
  const bool sp = slice.row_split() > 1;
  if (TP > 1) {
    std::int64_t blocks = m.n_layers;
    if (layout.pipeline > 1) {
      // The heaviest rank's blocks (each rank's chunks: virtual stages p, p + P, ...).
      const std::vector<std::int64_t> layers = config::pipeline_stage_layers(c);
      std::vector<std::int64_t> per_rank(static_cast<std::size_t>(layout.pipeline), 0);
      for (std::size_t v = 0; v < layers.size(); ++v)
        per_rank[v % per_rank.size()] += layers[v];
      blocks = *std::max_element(per_rank.begin(), per_rank.end());
    }
    const bool again = c.training.recompute == config::Recompute::full;
    // A DeepSeekMoE block's MLP is whole on every rank (block.hpp): its attention's
    // all-reduces only; under sequence parallelism its attention's (2.5, recomputed 3.5)
    // and the MoE layer's gathers: its input forward, the output gradient and the input
    // again backward (1.5, recomputed 2). The blocks' mix of the whole model stands for a
    // stage's.
    const double moe_fraction =
        static_cast<double>(plan.params.moe_layers) / static_cast<double>(m.n_layers);
    const double dense_block = sp ? (again ? 7.0 : 5.0) : (again ? 6.0 : 4.0);
    const double moe_block = sp ? (again ? 5.5 : 4.0) : (again ? 3.0 : 2.0);
    const double per_block = dense_block * (1.0 - moe_fraction) + moe_block * moe_fraction;
    // The MTP module (counted with the heaviest stage's blocks): its block (of the model's
    // last block's kind); its embedding's sum and its shared head's input gradient (2);
    // under sequence parallelism its embedding's reduce-scatter and the gather of its
    // gradient, its head's gather and reduce-scatter, and eh_proj's weight gradient's
    // gathers of its output gradient and both inputs (3.5).
    const double mtp_block = m.mtp_moe_block() ? moe_block : dense_block;
    const double ends = 2.0 + static_cast<double>(m.mtp_depth) * (mtp_block + (sp ? 3.5 : 2.0));
    const double micro = static_cast<double>(layout.grad_accum_steps);
    const double calls = (per_block * static_cast<double>(blocks) + ends) * micro;
    const double buffer = static_cast<double>(c.training.micro_batch_size) *
                          static_cast<double>(T) * static_cast<double>(m.d_model) * sizeof(float);
    const double ring = 2.0 * static_cast<double>(TP - 1) / static_cast<double>(TP);
    plan.tensor_allreduces_per_step = calls;
    plan.tensor_bytes_per_step = calls * ring * buffer;
    plan.collectives.push_back(
        {std::string(sp ? "all-gathers and reduce-scatters (as all-reduces)" : "all-reduce") +
             " of the activations over the tensor group of " + std::to_string(TP) + " (" +
             format_count(calls) + " per step)",
         buffer, plan.tensor_bytes_per_step});
    if (sp) {
      // The MTP module's enorm, hnorm, its block's two and its head's.
      const double norm_calls =
          (2.0 * static_cast<double>(blocks) + 1.0 + 5.0 * static_cast<double>(m.mtp_depth)) *
          micro;
      const double norm_buffer = static_cast<double>(m.d_model) * sizeof(float);
      const double norm_bytes = norm_calls * ring * norm_buffer;
      plan.tensor_allreduces_per_step += norm_calls;
      plan.tensor_bytes_per_step += norm_bytes;
      plan.collectives.push_back(
          {"all-reduce of the norm weights' gradients over the tensor "
           "group (sequence parallelism; " +
               format_count(norm_calls) + " per step)",
           norm_buffer, norm_bytes});
    }
    // Key/value heads replicated on R = TP / n_kv_heads ranks (layers/attention.cpp): per
    // micro-batch and block, the backward sums the key and the value gradients, (micro x
    // seq_len, head_dim) fp32 each, over the R ranks sharing the head. Ring factor
    // 2 (R-1)/R. (Their weights, one head's each, are in the parameters per rank.)
    const std::int64_t R = m.mla() || TP <= m.n_kv_heads ? 1 : TP / m.n_kv_heads;
    if (R > 1) {
      const double kv_calls =
          2.0 * static_cast<double>(blocks) * static_cast<double>(layout.grad_accum_steps);
      const double kv_buffer = static_cast<double>(c.training.micro_batch_size) *
                               static_cast<double>(T) * static_cast<double>(m.d_model / m.n_heads) *

                               sizeof(float);
      const double kv_bytes =
          kv_calls * 2.0 * static_cast<double>(R - 1) / static_cast<double>(R) * kv_buffer;
      plan.tensor_allreduces_per_step += kv_calls;
      plan.tensor_bytes_per_step += kv_bytes;
      plan.collectives.push_back({"all-reduce of the key/value gradients over the " +
                                      std::to_string(R) + " ranks sharing each head (" +
                                      format_count(kv_calls) + " per step)",
                                  kv_buffer, kv_bytes});
    }
    // Latent attention (layers/latent_attention.cpp): per micro-batch and block, the
    // backward sums the gradients of the latents every rank computes alike over the group,
    // (micro x seq_len, q_lora + kv_lora + rope) fp32 in two or three all-reduces.
    if (m.mla()) {
      const double latent_calls = (m.q_lora_rank > 0 ? 3.0 : 2.0) * static_cast<double>(blocks) *
                                  static_cast<double>(layout.grad_accum_steps);
      const double width = static_cast<double>(m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim);
      const double latent_bytes = static_cast<double>(blocks) * micro *
                                  static_cast<double>(c.training.micro_batch_size) *
                                  static_cast<double>(T) * width * sizeof(float) * ring;
      plan.tensor_allreduces_per_step += latent_calls;
      plan.tensor_bytes_per_step += latent_bytes;
      plan.collectives.push_back(
          {"all-reduce of the latents' gradients over the tensor group (latent attention; " +
               format_count(latent_calls) + " per step)",
           static_cast<double>(c.training.micro_batch_size) * static_cast<double>(T) * width *
               sizeof(float),
           latent_bytes});
    }
  }

  // The step's time on the host kind's rates: every executed FLOP at the matrix-product
  // rate (the attention and the element-wise kernels run slower on CPUs: the prediction
  // is a lower bound there), every collective's bytes at the bus bandwidth.
  auto& st = plan.step;
  // Pipeline stages: a stage's share of the FLOPs (an even split), stretched by 1F1B's
  // bubble; its sends and receives (activations forward, gradients backward, one of each
  // per micro-batch and boundary: a middle stage has two boundaries) with the collectives.
  const double P = static_cast<double>(layout.pipeline);
  // Tensor parallelism splits every layer but the DeepSeekMoE layers, which each rank of
  // the group computes whole (block.hpp): their MLP FLOPs (6 per active parameter and
  // token, their share of a full recompute alike) are not divided by TP.
  double replicated_share = 0.0;
  if (TP > 1 && plan.params.moe_layers > 0) {
    const ParamCount& pc = plan.params;
    const double dense_mlp = 3.0 * static_cast<double>(m.d_model * m.ffn_dim);
    const double moe_mlp_active = static_cast<double>(pc.per_moe_layer_active) -
                                  (static_cast<double>(pc.per_layer) - dense_mlp);
    replicated_share = std::min(
        1.0, 6.0 * moe_mlp_active * static_cast<double>(pc.moe_layers) / plan.flops_per_token);
  }
  st.flops_per_rank = (plan.flops_per_token + plan.recompute_flops_per_token) *
                      static_cast<double>(plan.tokens_per_step) / static_cast<double>(D) / P *
                      ((1.0 - replicated_share) / static_cast<double>(TP) + replicated_share);
  const double gflops = low_precision ? rates.gemm_16bit_gflops : rates.gemm_fp32_gflops;
  st.compute_s = st.flops_per_rank / (gflops * 1e9) * (1.0 + plan.bubble_fraction);
  // (Interleaved: every chunk of a rank has two boundaries, rank 0's first and rank P - 1's
  // last chunk one.)
  const double boundaries =
      plan.chunks > 1 ? 2.0 * plan.chunks - 1.0 : (layout.pipeline > 2 ? 2.0 : 1.0);
  const double p2p_bytes = layout.pipeline > 1
                               ? 2.0 * boundaries * plan.p2p_bytes_per_micro_batch *
                                         static_cast<double>(layout.grad_accum_steps) +
                                     plan.embedding_sum_bytes
                               : 0.0;
  // Across nodes the ring runs at the network's rate; a host kind without one (the CPU
  // rows: one node) at the node's.
  const bool across_nodes =
      static_cast<std::int64_t>(D) > rates.ranks_per_node && rates.inter_node_gbs > 0;
  const double gbs = across_nodes ? rates.inter_node_gbs : rates.intra_node_gbs;
  // The tensor group's all-reduces stay inside a node (its ranks are neighbours).
  st.comm_s = (D > 1 ? plan.comm_bytes_per_step / (gbs * 1e9) : 0.0) +
              (p2p_bytes + plan.tensor_bytes_per_step) / (rates.intra_node_gbs * 1e9);
  return plan;
}

}  // namespace dst::train
