// Tensor parallelism over the vocabulary (model/layers/vocab_parallel.hpp) on 1, 2 and 4
// ranks: the embedding and the cross-entropy with their tables split over the world as a
// tensor group against the kernels on the whole table (every rank holds the same full
// data and runs the kernel on it): the embedding bit for bit at any rank count, the
// cross-entropy bit for bit on one rank and within a stated bound on more, its gradient
// against central finite differences, two allreduces a call whatever the row count, and
// bad ids named before any communication.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/layers/vocab_parallel.hpp"
#include "mpi_world.hpp"

namespace {

using dst::model::VocabSlice;
using dst::tensor::Shape;
using dst::tensor::Tensor;
using dst::test::world_rank;
using dst::test::world_size;

constexpr std::int64_t kC = 8, kN = 10;
constexpr std::int32_t kIgnore = -100;

dst::tensor::ExecContext ctx() {
  return dst::tensor::ExecContext{dst::tensor::Backend::kokkos, nullptr};
}

template <class T>
Tensor view(std::vector<T>& v, Shape s) {
  return Tensor{v.data(), s, dst::dtype_of<T>::value, dst::tensor::Device::host};
}

/// The same values on every rank (a fixed seed, not the rank's).
std::vector<float> random_vec(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v)
    x = u(gen);
  return v;
}

/// Tokens that land in every rank's slice at 1, 2 and 4 ranks (both ends of each quarter),
/// some repeated (the backward's accumulation order), and `ignored` replaced by kIgnore.
std::vector<std::int32_t> tokens_for(std::int64_t v, bool with_ignore) {
  const auto q = static_cast<std::int32_t>(v / 4);
  std::vector<std::int32_t> t = {
      0, q - 1, q, 2 * q + 3, 3 * q, static_cast<std::int32_t>(v - 1), q, 2 * q - 1, 3 * q + 1, 0};
  if (with_ignore) {
    t[2] = kIgnore;
    t[8] = kIgnore;
  }
  return t;
}

std::vector<float> columns(const std::vector<float>& full, std::int64_t n, std::int64_t v,
                           const VocabSlice& s) {
  std::vector<float> out(static_cast<std::size_t>(n * s.count));
  for (std::int64_t i = 0; i < n; ++i)
    std::copy_n(full.begin() + i * v + s.first, s.count, out.begin() + i * s.count);
  return out;
}

/// Rank's rows of a (V, C) table: (slice.count, C).
Tensor slice_rows(std::vector<float>& table, const VocabSlice& s) {
  return Tensor{table.data() + s.first * kC, Shape{s.count, kC}, dst::DType::f32,
                dst::tensor::Device::host};
}

/// The cross-entropy's per-row scratch for n rows, on the host.
struct Scratch {
  explicit Scratch(std::int64_t n)
      : keys(static_cast<std::size_t>(n)), sums(2 * static_cast<std::size_t>(n)) {}
  std::vector<std::int32_t> keys;
  std::vector<double> sums;
  dst::model::CrossEntropyScratch tensors() {
    const auto n = static_cast<std::int64_t>(keys.size());
    return {view(keys, {n}), view(sums, {n, 2})};
  }
};

bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

/// A communicator that forwards to another and counts the allreduces started through it.
class CountingCommunicator final : public dst::comm::Communicator {
 public:
  explicit CountingCommunicator(dst::comm::Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return inner_.name(); }
  double timeout_s() const override { return inner_.timeout_s(); }
  void set_timeout_s(double s) override { inner_.set_timeout_s(s); }
  dst::comm::Request iallreduce(void* buf, std::size_t count, dst::DType type,
                                dst::comm::ReduceOp op) override {
    ++allreduces;
    return inner_.iallreduce(buf, count, type, op);
  }
  dst::comm::Request ireduce_scatter(const void* send, void* recv, std::size_t n, dst::DType type,
                                     dst::comm::ReduceOp op) override {
    ++others;
    return inner_.ireduce_scatter(send, recv, n, type, op);
  }
  dst::comm::Request iallgather(const void* send, void* recv, std::size_t n,
                                dst::DType type) override {
    ++others;
    return inner_.iallgather(send, recv, n, type);
  }
  dst::comm::Request ibroadcast(void* buf, std::size_t n, dst::DType type, int root) override {
    ++others;
    return inner_.ibroadcast(buf, n, type, root);
  }
  dst::comm::Request ibarrier() override {
    ++others;
    return inner_.ibarrier();
  }
  int allreduces = 0, others = 0;

 private:
  dst::comm::Communicator& inner_;
};

struct Group {
  dst::comm::MpiCommunicator comm{MPI_COMM_WORLD, "tensor", 30.0};
};

class VocabParallel : public ::testing::TestWithParam<std::int64_t> {};

// V = 64: every slice a multiple of the 8 summation lanes; V = 100: slices of 100, 50 and
// 25 columns, so the lanes' tail runs too; V = 4096: long rows (a sum of 4096 terms).
INSTANTIATE_TEST_SUITE_P(Vocab, VocabParallel, ::testing::Values(64, 100, 4096));

TEST(VocabSliceTest, SplitsEvenlyAndRefusesTheRest) {
  const VocabSlice s = VocabSlice::of(64, 3, 4);
  EXPECT_EQ(s.first, 48);
  EXPECT_EQ(s.count, 16);
  EXPECT_TRUE(s.holds(48));
  EXPECT_TRUE(s.holds(63));
  EXPECT_FALSE(s.holds(47));
  EXPECT_FALSE(s.holds(64));
  EXPECT_THROW(VocabSlice::of(66, 0, 4), dst::Error);
  EXPECT_THROW(VocabSlice::of(64, 4, 4), dst::Error);
  EXPECT_THROW(VocabSlice::of(64, 0, 0), dst::Error);
}

// A layer built for the world's slices takes this rank's; without the tensor group, or
// with a group of another size, it refuses to compute instead of reading another slice.
TEST(VocabSliceTest, OfGroupNeedsTheGroupTheLayerWasBuiltFor) {
  Group g;
  dst::model::TensorParallel tp(g.comm);
  const VocabSlice s = VocabSlice::of_group(64, &tp, world_size(), "the head");
  EXPECT_EQ(s.count, 64 / world_size());
  EXPECT_EQ(s.first, world_rank() * s.count);
  EXPECT_THROW(VocabSlice::of_group(64, nullptr, world_size(), "the head"), dst::Error);
  EXPECT_THROW(VocabSlice::of_group(64, &tp, world_size() * 2, "the embedding"), dst::Error);
}

TEST_P(VocabParallel, EmbeddingForwardIsTheFullGatherBitForBit) {
  const std::int64_t v = GetParam();
  Group g;
  const VocabSlice s = VocabSlice::of(v, world_rank(), world_size());
  std::vector<float> table = random_vec(static_cast<std::size_t>(v * kC), 11, 1.0f);  // (V, C)
  // Signed zeros survive the sum over the ranks (the others contribute -0.0).
  table[static_cast<std::size_t>((v - 1) * kC)] = -0.0f;
  table[1] = 0.0f;
  std::vector<std::int32_t> tokens = tokens_for(v, false);
  std::vector<float> ref(static_cast<std::size_t>(kN * kC));
  dst::kernels::embedding_forward(ctx(), view(tokens, {kN}), view(table, {v, kC}),
                                  view(ref, {kN, kC}));
  std::vector<float> out(ref.size(), 1.0f);
  dst::model::vocab_parallel_embedding_forward(ctx(), g.comm, s, view(tokens, {kN}),
                                               slice_rows(table, s), view(out, {kN, kC}));
  EXPECT_TRUE(same_bits(out.data(), ref.data(), ref.size()));
  EXPECT_TRUE(std::signbit(out[5 * kC]));  // token V - 1, column 0: -0.0
}

// Sequence parallelism: the reduce-scatter gives each rank its rows of the full gather,
// bit for bit; a group that does not divide the rows is refused before communicating.
TEST_P(VocabParallel, EmbeddingScatterIsEachRanksRowsOfTheFullGather) {
  const std::int64_t v = GetParam();
  Group g;
  const VocabSlice s = VocabSlice::of(v, world_rank(), world_size());
  std::vector<float> table = random_vec(static_cast<std::size_t>(v * kC), 11, 1.0f);
  table[static_cast<std::size_t>((v - 1) * kC)] = -0.0f;
  std::vector<std::int32_t> tokens = tokens_for(v, false);
  std::vector<float> ref(static_cast<std::size_t>(kN * kC));
  dst::kernels::embedding_forward(ctx(), view(tokens, {kN}), view(table, {v, kC}),
                                  view(ref, {kN, kC}));
  // The first n tokens: as many as divide among the ranks (10 on 1 and 2, 8 on 4).
  const std::int64_t n = kN / world_size() * world_size();
  const std::int64_t rows = n / world_size();
  std::vector<float> whole(ref.size(), 1.0f), mine(static_cast<std::size_t>(rows * kC), 1.0f);
  const auto first = [&](std::int64_t k) {
    return Tensor{tokens.data(), Shape{k}, dst::DType::i32, dst::tensor::Device::host};
  };
  const auto whole_of = [&](std::int64_t k) {
    return Tensor{whole.data(), Shape{k, kC}, dst::DType::f32, dst::tensor::Device::host};
  };
  dst::model::vocab_parallel_embedding_scatter(ctx(), g.comm, s, first(n), slice_rows(table, s),
                                               whole_of(n), view(mine, {rows, kC}));
  EXPECT_TRUE(same_bits(mine.data(), ref.data() + world_rank() * rows * kC, mine.size()));
  if (world_size() > 1) {
    CountingCommunicator counting(g.comm);
    EXPECT_THROW(dst::model::vocab_parallel_embedding_scatter(ctx(), counting, s, first(n - 1),
                                                              slice_rows(table, s), whole_of(n - 1),
                                                              view(mine, {rows, kC})),
                 dst::Error);
    EXPECT_EQ(counting.allreduces + counting.others, 0);
  }
}

TEST_P(VocabParallel, EmbeddingBackwardSlicesAreTheFullKernelBitForBit) {
  const std::int64_t v = GetParam();
  const VocabSlice s = VocabSlice::of(v, world_rank(), world_size());
  std::vector<std::int32_t> tokens = tokens_for(v, false);
  std::vector<float> dout = random_vec(static_cast<std::size_t>(kN * kC), 12, 1.0f);
  // Accumulates onto a gradient that is not zero (+=).
  std::vector<float> ref = random_vec(static_cast<std::size_t>(v * kC), 13, 0.1f);
  std::vector<float> mine(ref.begin() + s.first * kC, ref.begin() + (s.first + s.count) * kC);
  dst::kernels::embedding_backward(ctx(), view(tokens, {kN}), view(dout, {kN, kC}),
                                   view(ref, {v, kC}));
  dst::model::vocab_parallel_embedding_backward(ctx(), s, view(tokens, {kN}), view(dout, {kN, kC}),
                                                view(mine, {s.count, kC}));
  // This rank's slice; the slices of all ranks side by side are the whole table.
  EXPECT_TRUE(same_bits(mine.data(), ref.data() + s.first * kC, mine.size()));
}

/// The cross-entropy (losses, and the gradient when `grad`) on this rank's columns against
/// the kernel on the full logits: bit for bit on one rank, within the bound on more.
void check_cross_entropy(std::int64_t v, bool grad) {
  Group g;
  CountingCommunicator counting(g.comm);
  const VocabSlice s = VocabSlice::of(v, world_rank(), world_size());
  // Logits of spread 8 (softmax far from uniform), the same on every rank.
  std::vector<float> full = random_vec(static_cast<std::size_t>(kN * v), 21, 4.0f);  // (N, V)
  std::vector<std::int32_t> targets = tokens_for(v, true);
  const float grad_scale = 1.0f / 8.0f;  // 8 rows not ignored
  std::vector<float> ref_loss(kN), ref_grad(full.size());
  if (grad)
    dst::kernels::cross_entropy_fused(ctx(), view(full, {kN, v}), view(targets, {kN}), kIgnore,
                                      grad_scale, view(ref_loss, {kN}), view(ref_grad, {kN, v}));
  else
    dst::kernels::cross_entropy_forward(ctx(), view(full, {kN, v}), view(targets, {kN}), kIgnore,
                                        view(ref_loss, {kN}));
  std::vector<float> local = columns(full, kN, v, s);  // (N, V / P)
  std::vector<float> loss(kN, -1.0f);
  Scratch scratch(kN);
  dst::model::vocab_parallel_cross_entropy(ctx(), counting, s, view(local, {kN, s.count}),
                                           view(targets, {kN}), kIgnore, grad_scale, grad,
                                           view(loss, {kN}), scratch.tensors());
  EXPECT_EQ(counting.allreduces, 2);  // max, then the sums and target logits: all rows
  EXPECT_EQ(counting.others, 0);
  const std::vector<float> ref_local = grad ? columns(ref_grad, kN, v, s) : columns(full, kN, v, s);
  if (world_size() == 1) {
    EXPECT_TRUE(same_bits(loss.data(), ref_loss.data(), loss.size()));
    EXPECT_TRUE(same_bits(local.data(), ref_local.data(), local.size()));
    return;
  }
  // On P ranks only the order of the sum of exponentials differs (P lane sums in double,
  // then their sum): a few double ulps in the sum, which moves a float loss or gradient by
  // at most an ulp or two of float (2^-23 = 1.2e-7 relative), and the target's gradient
  // p - 1 by an ulp of grad_scale. Bound: 1e-6 relative + 1e-7 grad_scale absolute.
  // (Measured: the same bits as the kernel at V 64, 100 and 4096 on 2 and 4 ranks: the
  // double sums differ in their last bits at most, below what the float results keep.)
  double worst_loss = 0.0, worst_grad = 0.0;
  for (std::int64_t i = 0; i < kN; ++i) {
    const double d = std::fabs(static_cast<double>(loss[i]) - ref_loss[i]);
    EXPECT_LE(d, 1e-6 * std::fabs(ref_loss[i])) << "row " << i;
    worst_loss = std::max(worst_loss, d / std::max(1e-30, std::fabs(double(ref_loss[i]))));
  }
  for (std::size_t k = 0; k < local.size(); ++k) {
    const double d = std::fabs(static_cast<double>(local[k]) - ref_local[k]);
    EXPECT_LE(d, 1e-6 * std::fabs(ref_local[k]) + 1e-7 * grad_scale) << "element " << k;
    worst_grad = std::max(worst_grad, d / (std::fabs(double(ref_local[k])) + 1e-7 * grad_scale));
  }
  if (world_rank() == 0)
    std::printf(
        "[ vocab ] V %lld, %d ranks, %s: worst relative difference from the kernel: "
        "loss %.3g, gradient %.3g\n",
        static_cast<long long>(v), world_size(), grad ? "fused" : "forward", worst_loss,
        worst_grad);
}

TEST_P(VocabParallel, CrossEntropyForwardMatchesTheKernel) {
  check_cross_entropy(GetParam(), false);
}

TEST_P(VocabParallel, CrossEntropyWithGradientMatchesTheFusedKernel) {
  check_cross_entropy(GetParam(), true);
}

// The distributed gradient against central differences of the distributed loss, at
// entries in every rank's slice (the target's and others): d(sum of losses)/d(logit).
TEST_P(VocabParallel, CrossEntropyGradientMatchesFiniteDifferences) {
  const std::int64_t v = GetParam();
  Group g;
  const VocabSlice s = VocabSlice::of(v, world_rank(), world_size());
  const std::vector<float> full = random_vec(static_cast<std::size_t>(kN * v), 31, 2.0f);
  std::vector<std::int32_t> targets = tokens_for(v, true);
  Scratch scratch(kN);
  const auto total_loss = [&](const std::vector<float>& logits) {
    std::vector<float> local = columns(logits, kN, v, s), loss(kN);
    dst::model::vocab_parallel_cross_entropy(ctx(), g.comm, s, view(local, {kN, s.count}),
                                             view(targets, {kN}), kIgnore, 1.0f, false,
                                             view(loss, {kN}), scratch.tensors());
    double sum = 0.0;
    for (const float l : loss)
      sum += l;
    return sum;
  };
  std::vector<float> local = columns(full, kN, v, s), loss(kN);
  dst::model::vocab_parallel_cross_entropy(ctx(), g.comm, s, view(local, {kN, s.count}),
                                           view(targets, {kN}), kIgnore, 1.0f, true,
                                           view(loss, {kN}), scratch.tensors());
  // The whole gradient on every rank, to compare any entry.
  std::vector<float> grad(full.size());
  for (int r = 0; r < world_size(); ++r) {
    const VocabSlice rs = VocabSlice::of(v, r, world_size());
    std::vector<float> part = r == world_rank() ? local : std::vector<float>(local.size());
    g.comm.broadcast(part.data(), part.size(), dst::DType::f32, r);
    for (std::int64_t i = 0; i < kN; ++i)
      std::copy_n(part.begin() + i * rs.count, rs.count, grad.begin() + i * v + rs.first);
  }
  // h = 1e-2: the truncation error h^2/6 |f'''| stays below 1e-5 for softmax (|f'''| <= 1),
  // float losses of ~5 round to 5e-7, / 2h = 2.4e-5. Bound 1e-4.
  const float h = 1e-2f;
  const std::int64_t q = v / 4;
  const std::vector<std::pair<std::int64_t, std::int64_t>> entries = {
      {0, 0},     {0, 1},     {1, q - 1}, {1, q}, {3, 2 * q + 3},
      {4, 3 * q}, {5, v - 1}, {6, 2 * q}, {2, 5}};
  for (const auto& [i, j] : entries) {
    std::vector<float> plus = full, minus = full;
    plus[static_cast<std::size_t>(i * v + j)] += h;
    minus[static_cast<std::size_t>(i * v + j)] -= h;
    const double fd = (total_loss(plus) - total_loss(minus)) / (2.0 * h);
    EXPECT_NEAR(grad[static_cast<std::size_t>(i * v + j)], fd, 1e-4)
        << "row " << i << ", column " << j << " (target " << targets[i] << ")";
  }
}

TEST_P(VocabParallel, BadIdsAreNamedBeforeAnyCommunication) {
  const std::int64_t v = GetParam();
  Group g;
  CountingCommunicator counting(g.comm);
  const VocabSlice s = VocabSlice::of(v, world_rank(), world_size());
  std::vector<std::int32_t> tokens = tokens_for(v, false);
  tokens[3] = static_cast<std::int32_t>(v);
  std::vector<float> table(static_cast<std::size_t>(s.count * kC)), out(kN * kC);
  const std::string want = "token id " + std::to_string(v) + " at position 3";
  try {
    dst::model::vocab_parallel_embedding_forward(ctx(), counting, s, view(tokens, {kN}),
                                                 view(table, {s.count, kC}), view(out, {kN, kC}));
    ADD_FAILURE() << "no error for token id V";
  } catch (const dst::Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  tokens[3] = -1;
  EXPECT_THROW(
      dst::model::vocab_parallel_embedding_forward(ctx(), counting, s, view(tokens, {kN}),
                                                   view(table, {s.count, kC}), view(out, {kN, kC})),
      dst::Error);
  EXPECT_THROW(dst::model::vocab_parallel_embedding_backward(
                   ctx(), s, view(tokens, {kN}), view(out, {kN, kC}), view(table, {s.count, kC})),
               dst::Error);

  std::vector<std::int32_t> targets = tokens_for(v, true);
  targets[4] = static_cast<std::int32_t>(v + 7);
  std::vector<float> logits(static_cast<std::size_t>(kN * s.count)), loss(kN);
  Scratch scratch(kN);
  const std::string want_target = "target " + std::to_string(v + 7) + " at position 4";
  try {
    dst::model::vocab_parallel_cross_entropy(ctx(), counting, s, view(logits, {kN, s.count}),
                                             view(targets, {kN}), kIgnore, 1.0f, true,
                                             view(loss, {kN}), scratch.tensors());
    ADD_FAILURE() << "no error for target V + 7";
  } catch (const dst::Error& e) {
    EXPECT_NE(std::string(e.what()).find(want_target), std::string::npos) << e.what();
  }
  // A slice that is not this rank's in this group.
  VocabSlice wrong = s;
  wrong.first = (s.first + s.count) % v + (world_size() == 1 ? 1 : 0);
  targets[4] = 0;
  EXPECT_THROW(dst::model::vocab_parallel_cross_entropy(
                   ctx(), counting, wrong, view(logits, {kN, s.count}), view(targets, {kN}),
                   kIgnore, 1.0f, false, view(loss, {kN}), scratch.tensors()),
               dst::Error);
  EXPECT_EQ(counting.allreduces + counting.others, 0);  // every rank threw before a collective
}

}  // namespace
