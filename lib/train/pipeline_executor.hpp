#pragma once
/// \file pipeline_executor.hpp
/// Pipeline parallelism's executor: one rank's forwards and backwards over a step's
/// micro-batches in the 1F1B or interleaved order (model/pipeline_schedule.hpp), the
/// activations and activation gradients sent to and received from the neighbouring
/// stages, the embedding-table gradient summed across the two ends, and the forward-only
/// pass of an evaluation. Training and evaluation share it.
///
/// The executor knows nothing of the model: it runs a PipelineStage, which the trainer
/// implements over the model (and a unit test over a fake).

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "config/run_config.hpp"
#include "model/stage.hpp"
#include "tensor/tensor.hpp"

namespace dst::train {

/// What the executor runs on one pipeline rank: its chunks of blocks, each with one
/// activation record per micro-batch in flight.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  /// The record chunk `chunk` keeps micro-batch `micro` in.
  virtual std::size_t record(int chunk, std::int64_t micro) const = 0;
  /// (N, C) f32 host tensors: the first block's input in `record` (filled by a receive
  /// before forward() on every virtual stage but the first), the last block's output after
  /// forward() (sent on by every virtual stage but the last), and the residual stream's
  /// gradient (received before backward() but on the last virtual stage; after it, sent
  /// back but from the first).
  virtual tensor::Tensor input(std::size_t record) const = 0;
  virtual tensor::Tensor output(std::size_t record) const = 0;
  virtual tensor::Tensor gradient() const = 0;
  /// One forward's result: the loss sum over its valid targets and their count (the last
  /// virtual stage; 0 elsewhere), the MTP module's loss sum (likewise) and its wall time.
  struct Forward {
    double loss_sum = 0.0;
    std::int64_t valid = 0;
    double mtp_loss_sum = 0.0;
    double seconds = 0.0;
  };
  /// The forward of micro-batch `micro` of chunk `chunk` into `record`; `with_gradient`:
  /// a training forward (the last virtual stage puts the loss's gradient in place).
  virtual Forward forward(int chunk, std::int64_t micro, std::size_t record,
                          bool with_gradient) = 0;
  /// The backward of the micro-batch in `record`; gradients accumulate, `on_ready` as the
  /// model's (empty: no bucket starts). Returns its wall time.
  virtual double backward(std::size_t record, const std::function<void(std::size_t)>& on_ready) = 0;
};

class PipelineExecutor {
 public:
  /// One rank's executor: stage `stage` (its rank in `pipeline`) of `layout.pipeline`,
  /// holding `chunks` chunks (the interleaved schedule's virtual stages per rank, else 1),
  /// `layout.grad_accum_steps` micro-batches a step. `world_rank` names this rank's
  /// peers in a timeout's message.
  PipelineExecutor(comm::Communicator& pipeline, const config::Layout& layout, int world_rank,
                   int chunks);
  /// The schedule in a line for the log: `layout`'s stages and micro-batches, 1f1b or
  /// interleaved with its `chunks` per stage, the bubble, and the blocks of stage 0's
  /// chunks `stage0` (model::rank_chunks).
  static std::string describe(const config::Layout& layout, int chunks,
                              const std::vector<model::StageBlocks>& stage0);
  ~PipelineExecutor();
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

  /// What a step's schedule added up on this rank.
  struct Totals {
    double loss_sum = 0.0;  ///< the last stage's; 0 elsewhere
    std::int64_t valid = 0;
    double mtp_loss_sum = 0.0;
    double forward_s = 0.0, backward_s = 0.0;
    double comm_s = 0.0;  ///< exposed: receives waited, and the sends' final wait
  };
  /// A training step's forwards and backwards in schedule order. `on_ready` is passed to
  /// the backward of each chunk's last micro-batch (the chunks' parameters lie in the flat
  /// buffer in the order their backwards end). Collective over the pipeline group.
  Totals train(PipelineStage& stage, const std::function<void(std::size_t)>& on_ready);
  /// An evaluation micro-batch's forward through every chunk in turn (virtual stage
  /// c P + p receives from the one before it, as in training); `batch` numbers the
  /// messages. Returns the last virtual stage's loss sum (0 elsewhere), `valid` its count.
  double evaluate(PipelineStage& stage, std::int64_t batch, std::int64_t& valid);
  /// Tied embeddings or the MTP module: adds the other end's gradient of the embedding
  /// table (stage 0 <-> the last stage; `n` floats at `grads`) to this rank's, both ends
  /// then holding the same sum. Returns the seconds spent.
  double sum_embedding_copies(float* grads, std::size_t n);

  int stage() const { return stage_; }
  int stages() const { return stages_; }
  int chunks() const { return chunks_; }

 private:
  /// A send in flight with its own copy of the data; waited before the step ends.
  struct PendingSend {
    std::vector<float> data;
    comm::Request request;
    bool done = false;  ///< seen complete (guarded by mutex_)
  };
  void send_to(int stage, const tensor::Tensor& t, int tag);
  /// Receives into `t` from `stage`; returns the seconds waited.
  double receive_from(int stage, const tensor::Tensor& t, int tag);
  /// Waits every send in flight (all = false: only drops those complete); the seconds.
  double settle_sends(bool all);
  void poll_sends();

  comm::Communicator& pipeline_;
  config::Layout layout_;
  int world_rank_;
  int stage_, stages_, chunks_;
  std::int64_t micro_batches_;
  std::vector<std::unique_ptr<PendingSend>> sends_;
  /// Open MPI moves a large message only while its sender is inside an MPI call: a send
  /// left alone during the next micro-batch's compute would reach the neighbour stage one
  /// whole operation late, and the stages would run nearly in turn. Where the pipeline
  /// group allows a second thread (MPI_THREAD_MULTIPLE), this one polls the sends in flight
  /// (every 20 us while there are any); mutex_ guards sends_ between it and the owner.
  std::thread progress_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
};

}  // namespace dst::train
