#include "train/pipeline_executor.hpp"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>

#include "comm/process_groups.hpp"
#include "core/error.hpp"
#include "core/flight_recorder.hpp"
#include "core/log.hpp"
#include "model/pipeline_schedule.hpp"

namespace dst::train {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

PipelineExecutor::PipelineExecutor(comm::Communicator& pipeline, const config::Layout& layout,
                                   int world_rank, int chunks)
    : pipeline_(pipeline),
      layout_(layout),
      world_rank_(world_rank),
      stage_(pipeline.rank()),
      stages_(pipeline.size()),
      chunks_(chunks),
      micro_batches_(layout.grad_accum_steps) {
  if (stages_ != static_cast<int>(layout.pipeline))
    throw Error("pipeline executor: the pipeline group has " + std::to_string(stages_) +
                " ranks, the layout " + std::to_string(layout.pipeline) + " stages");
  if (chunks_ < 1)
    throw Error("pipeline executor: " + std::to_string(chunks_) + " chunks per rank");
}

PipelineExecutor::~PipelineExecutor() {
  if (!progress_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  progress_.join();
}

void PipelineExecutor::send_to(int stage, const tensor::Tensor& t, int tag) {
  auto send = std::make_unique<PendingSend>();
  const auto n = static_cast<std::size_t>(t.numel());
  send->data.assign(t.ptr<float>(), t.ptr<float>() + n);
  std::lock_guard<std::mutex> lock(mutex_);
  send->request = pipeline_.isend(send->data.data(), n, DType::f32, stage, tag);
  sends_.push_back(std::move(send));
  if (!progress_.joinable() && pipeline_.concurrent_progress())
    progress_ = std::thread([this] { poll_sends(); });
  wake_.notify_one();
}

void PipelineExecutor::poll_sends() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    bool pending = false;
    try {
      for (auto& send : sends_)
        if (!send->done) send->done = send->request.test();
    } catch (const std::exception& e) {
      // A failed test: the owner's wait meets the same request and reports it.
      log::warn(std::string("pipeline: polling a send failed: ") + e.what());
      return;
    }
    for (const auto& send : sends_)
      pending = pending || !send->done;
    if (!pending) {
      wake_.wait(lock);
      continue;
    }
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    lock.lock();
  }
}

double PipelineExecutor::receive_from(int stage, const tensor::Tensor& t, int tag) {
  const auto t0 = Clock::now();
  comm::Request r =
      pipeline_.irecv(t.ptr<float>(), static_cast<std::size_t>(t.numel()), DType::f32, stage, tag);
  try {
    r.wait();
  } catch (const TimeoutError& e) {
    // Name the stages and the peer's world rank: the group's rank alone is ambiguous
    // beside data parallelism.
    comm::RankCoords peer = comm::rank_coords(world_rank_, layout_);
    peer.pipeline = stage;
    // The tag: 2 (micro-batch x chunks + the receiving chunk) + direction.
    const int unit = tag / 2;
    throw TimeoutError(
        "pipeline stage " + std::to_string(stage_) + " waiting for the " +
        (tag % 2 == 0 ? "activations" : "activation gradients") + " of micro-batch " +
        std::to_string(unit / chunks_ + 1) +
        (chunks_ > 1 ? " (chunk " + std::to_string(unit % chunks_) + ")" : std::string()) +
        " from stage " + std::to_string(stage) + " (world rank " +
        std::to_string(comm::world_rank_of(peer, layout_)) + "): " + e.what());
  }
  return since(t0);
}

double PipelineExecutor::settle_sends(bool all) {
  const auto t0 = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& send : sends_) {
    if (send->done) continue;
    if (all)
      send->request.wait();
    else if (!progress_.joinable())
      send->done = send->request.test();
    send->done = send->done || all;
  }
  sends_.erase(std::remove_if(sends_.begin(), sends_.end(),
                              [](const std::unique_ptr<PendingSend>& p) { return p->done; }),
               sends_.end());
  return since(t0);
}

PipelineExecutor::Totals PipelineExecutor::train(PipelineStage& stage,
                                                 const std::function<void(std::size_t)>& on_ready) {
  Totals totals;
  const std::int64_t m = micro_batches_;
  // Virtual stage c x P + p runs chunk c of rank p (one chunk under 1F1B): a chunk's
  // input comes from the previous virtual stage (rank p - 1's chunk c, or rank P - 1's
  // chunk c - 1 on rank 0), its output goes to the next. A message's tag names the
  // receiving chunk's micro-batch and direction.
  const int V = chunks_, P = stages_;
  const int previous = (stage_ + P - 1) % P, next = (stage_ + 1) % P;
  const auto tag_of = [&](std::int64_t mb, int chunk, bool backward) {
    return static_cast<int>(2 * (mb * V + chunk)) + (backward ? 1 : 0);
  };
  const auto label = [&](const model::PipeOp& op) {
    return std::to_string(op.micro + 1) + "/" + std::to_string(m) +
           (V > 1 ? " (chunk " + std::to_string(op.chunk) + ")" : std::string());
  };
  for (const model::PipeOp& op : model::interleaved(P, stage_, V, m)) {
    const std::size_t record = stage.record(op.chunk, op.micro);
    const bool first = stage_ == 0 && op.chunk == 0;
    const bool last = stage_ == P - 1 && op.chunk == V - 1;
    // The neighbouring chunks: the previous virtual stage's is chunk - 1 on rank P - 1 when
    // this is rank 0, the next one's chunk + 1 on rank 0 when this is rank P - 1.
    const int previous_chunk = stage_ == 0 ? op.chunk - 1 : op.chunk;
    const int next_chunk = stage_ == P - 1 ? op.chunk + 1 : op.chunk;
    if (op.kind == model::PipeOp::Kind::forward) {
      core::FlightScope scope("pipeline stage " + std::to_string(stage_) +
                              ": forward of micro-batch " + label(op));
      if (!first)
        totals.comm_s +=
            receive_from(previous, stage.input(record), tag_of(op.micro, op.chunk, false));
      const PipelineStage::Forward f = stage.forward(op.chunk, op.micro, record, true);
      totals.loss_sum += f.loss_sum;
      totals.valid += f.valid;
      if (last) totals.mtp_loss_sum += f.mtp_loss_sum;
      totals.forward_s += f.seconds;
      if (!last) send_to(next, stage.output(record), tag_of(op.micro, next_chunk, false));
    } else {
      core::FlightScope scope("pipeline stage " + std::to_string(stage_) +
                              ": backward of micro-batch " + label(op));
      if (!last)
        totals.comm_s += receive_from(next, stage.gradient(), tag_of(op.micro, op.chunk, true));
      totals.backward_s +=
          stage.backward(record, op.micro + 1 == m ? on_ready : std::function<void(std::size_t)>());
      if (!first) send_to(previous, stage.gradient(), tag_of(op.micro, previous_chunk, true));
    }
    settle_sends(false);
  }
  totals.comm_s += settle_sends(true);
  return totals;
}

double PipelineExecutor::evaluate(PipelineStage& stage, std::int64_t batch, std::int64_t& valid) {
  const int P = stages_;
  double loss_sum = 0.0;
  for (int c = 0; c < chunks_; ++c) {
    const std::size_t record = stage.record(c, 0);
    const auto tag = [&](int chunk) { return static_cast<int>(2 * (batch * chunks_ + chunk)); };
    if (stage_ > 0 || c > 0) receive_from((stage_ + P - 1) % P, stage.input(record), tag(c));
    const PipelineStage::Forward f = stage.forward(c, 0, record, false);
    loss_sum += f.loss_sum;
    valid += f.valid;
    if (stage_ < P - 1 || c < chunks_ - 1) {
      send_to((stage_ + 1) % P, stage.output(record), tag(stage_ == P - 1 ? c + 1 : c));
      settle_sends(true);
    }
  }
  return loss_sum;
}

double PipelineExecutor::sum_embedding_copies(float* grads, std::size_t n) {
  const auto t0 = Clock::now();
  const int peer = stage_ == 0 ? stages_ - 1 : 0;
  std::vector<float> theirs(n);
  // A tag after every micro-batch's (train(): 2 (micro x chunks + chunk) + 1).
  const int tag = static_cast<int>(2 * micro_batches_ * chunks_ + 2);
  core::FlightScope scope("pipeline stage " + std::to_string(stage_) +
                          ": summing the embedding table's gradient with stage " +
                          std::to_string(peer));
  comm::Request recv = pipeline_.irecv(theirs.data(), n, DType::f32, peer, tag);
  comm::Request send = pipeline_.isend(grads, n, DType::f32, peer, tag);
  try {
    recv.wait();
    send.wait();
  } catch (const TimeoutError& e) {
    comm::RankCoords other = comm::rank_coords(world_rank_, layout_);
    other.pipeline = peer;
    throw TimeoutError("pipeline stage " + std::to_string(stage_) +
                       " exchanging the embedding table's gradient (tied embeddings or the MTP "
                       "module) with stage " +
                       std::to_string(peer) + " (world rank " +
                       std::to_string(comm::world_rank_of(other, layout_)) + "): " + e.what());
  }
  // a + b == b + a in IEEE arithmetic: both ends hold the same bits.
  for (std::size_t i = 0; i < n; ++i)
    grads[i] += theirs[i];
  return since(t0);
}

std::string PipelineExecutor::describe(const config::Layout& layout, int chunks,
                                       const std::vector<model::StageBlocks>& stage0) {
  std::ostringstream os;
  os << "pipeline: " << layout.pipeline << " stages, "
     << (chunks > 1 ? "interleaved, " + std::to_string(chunks) + " chunks per stage"
                    : std::string("1f1b"))
     << ", " << layout.grad_accum_steps << " micro-batches per step; bubble "
     << model::bubble_fraction(static_cast<int>(layout.pipeline), layout.grad_accum_steps, chunks)
     << "; stage 0 holds";
  for (const model::StageBlocks& c : stage0)
    os << (&c == &stage0.front() ? " " : ", ") << "blocks [" << c.first << ", " << c.last << ") x "
       << c.slots << " records";
  return os.str();
}

}  // namespace dst::train
