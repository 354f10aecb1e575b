#include "model/layers/moe_dispatch.hpp"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "core/flight_recorder.hpp"
#include "core/log.hpp"
#include "model/layers/moe_router.hpp"

namespace dst::model {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
std::size_t total(const std::vector<std::size_t>& v) {
  std::size_t n = 0;
  for (const std::size_t x : v)
    n += x;
  return n;
}
}  // namespace

void ExpertParallel::exchange_counts(const std::int64_t* send, std::int64_t* recv,
                                     std::size_t per_rank) {
  const auto t0 = Clock::now();
  group_.ialltoall(send, recv, per_rank, DType::i64).wait();
  traffic_.seconds += since(t0);
  const std::uint64_t bytes =
      per_rank * static_cast<std::size_t>(size() - 1) * sizeof(std::int64_t);
  traffic_.bytes_sent += bytes;
  traffic_.bytes_received += bytes;
}

void ExpertParallel::exchange_rows(const float* send, const std::vector<std::size_t>& send_rows,
                                   float* recv, const std::vector<std::size_t>& recv_rows,
                                   std::int64_t width) {
  comm::Request r = start_rows(send, send_rows, recv, recv_rows, width);
  finish_rows(r);
}

comm::Request ExpertParallel::start_rows(const float* send,
                                         const std::vector<std::size_t>& send_rows, float* recv,
                                         const std::vector<std::size_t>& recv_rows,
                                         std::int64_t width) {
  if (hang_) {
    log::warn("debug.inject_hang_alltoallv_rank: hanging before the expert all-to-all-v");
    core::FlightScope hang("debug.inject_hang_alltoallv_rank: a deliberate hang");
    for (;;)
      std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  const auto w = static_cast<std::size_t>(width);
  std::vector<std::size_t> sc(send_rows.size()), rc(recv_rows.size());
  for (std::size_t r = 0; r < sc.size(); ++r)
    sc[r] = send_rows[r] * w;
  for (std::size_t r = 0; r < rc.size(); ++r)
    rc[r] = recv_rows[r] * w;
  const auto t0 = Clock::now();
  comm::Request r = group_.ialltoallv(send, sc, recv, rc, DType::f32);
  traffic_.seconds += since(t0);
  // Bytes that crossed to other ranks (a rank's block to itself is a local copy).
  const auto me = static_cast<std::size_t>(rank());
  traffic_.bytes_sent += (total(sc) - sc[me]) * sizeof(float);
  traffic_.bytes_received += (total(rc) - rc[me]) * sizeof(float);
  ++traffic_.exchanges;
  return r;
}

void ExpertParallel::finish_rows(comm::Request& request) {
  const auto t0 = Clock::now();
  request.wait();
  traffic_.seconds += since(t0);
}

void ExpertDispatch::plan(ExpertParallel& ep, const std::vector<std::int64_t>& offset,
                          std::int64_t experts) {
  P = ep.size();
  if (experts % P != 0)
    throw Error("model: expert parallelism over " + std::to_string(P) +
                " ranks needs a number of "
                "routed experts it divides, got " +
                std::to_string(experts));
  L = experts / P;
  const auto n = static_cast<std::size_t>(experts);
  send_counts.resize(n);
  recv_counts.resize(n);
  for (std::size_t e = 0; e < n; ++e)
    send_counts[e] = offset[e + 1] - offset[e];
  ep.exchange_counts(send_counts.data(), recv_counts.data(), static_cast<std::size_t>(L));
  send_rows.assign(static_cast<std::size_t>(P), 0);
  recv_rows.assign(static_cast<std::size_t>(P), 0);
  local_offset.assign(static_cast<std::size_t>(L + 1), 0);
  for (std::int64_t q = 0; q < P; ++q)
    for (std::int64_t l = 0; l < L; ++l) {
      const auto i = static_cast<std::size_t>(q * L + l);
      send_rows[static_cast<std::size_t>(q)] += static_cast<std::size_t>(send_counts[i]);
      recv_rows[static_cast<std::size_t>(q)] += static_cast<std::size_t>(recv_counts[i]);
      local_offset[static_cast<std::size_t>(l + 1)] += recv_counts[i];
    }
  for (std::int64_t l = 0; l < L; ++l)
    local_offset[static_cast<std::size_t>(l + 1)] += local_offset[static_cast<std::size_t>(l)];
  rows = local_offset[static_cast<std::size_t>(L)];
  // Expert-major row i <- received row source_row[i]: the received rows are rank-major,
  // each rank's sorted by local expert.
  source_row.resize(static_cast<std::size_t>(rows));
  std::vector<std::int64_t> at(local_offset.begin(), local_offset.end() - 1);
  std::int64_t src = 0;
  for (std::int64_t q = 0; q < P; ++q)
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int64_t j = 0; j < recv_counts[static_cast<std::size_t>(q * L + l)]; ++j)
        source_row[static_cast<std::size_t>(at[static_cast<std::size_t>(l)]++)] = src++;
}

void ExpertDispatch::dispatch(ExpertParallel& ep, const float* rows_in, float* out,
                              std::int64_t width) {
  dispatch(ep, rows_in, out, width, {});
}

void ExpertDispatch::dispatch(ExpertParallel& ep, const float* rows_in, float* out,
                              std::int64_t width, const std::function<void()>& overlap) {
  const auto w = static_cast<std::size_t>(width);
  stage.resize(static_cast<std::size_t>(rows) * w);
  comm::Request request = ep.start_rows(rows_in, send_rows, stage.data(), recv_rows, width);
  if (overlap) overlap();
  ep.finish_rows(request);
  for (std::int64_t i = 0; i < rows; ++i)
    std::memcpy(
        out + static_cast<std::size_t>(i) * w,
        stage.data() + static_cast<std::size_t>(source_row[static_cast<std::size_t>(i)]) * w,
        w * sizeof(float));
}

void ExpertDispatch::combine(ExpertParallel& ep, const float* in, float* rows_out,
                             std::int64_t width) {
  const auto w = static_cast<std::size_t>(width);
  stage.resize(static_cast<std::size_t>(rows) * w);
  for (std::int64_t i = 0; i < rows; ++i)
    std::memcpy(
        stage.data() + static_cast<std::size_t>(source_row[static_cast<std::size_t>(i)]) * w,
        in + static_cast<std::size_t>(i) * w, w * sizeof(float));
  ep.exchange_rows(stage.data(), recv_rows, rows_out, send_rows, width);
}

}  // namespace dst::model

namespace dst::model {

std::vector<std::int32_t> expert_nodes(std::int64_t experts, std::int64_t pretend,
                                       comm::Communicator* group) {
  if (pretend > 0) return equal_expert_nodes(experts, pretend);
  if (group == nullptr || group->size() <= 1) return {};
  const auto P = static_cast<std::size_t>(group->size());
  if (experts % static_cast<std::int64_t>(P) != 0)
    throw Error("model: " + std::to_string(experts) + " routed experts over an expert group of " +
                std::to_string(P) + " ranks");
  constexpr std::size_t kName = 256;  // host names are at most 255 bytes (POSIX)
  std::array<std::uint8_t, kName> mine{};
  if (gethostname(reinterpret_cast<char*>(mine.data()), kName - 1) != 0)
    throw Error("model: gethostname failed (node-limited routing's node map)");
  std::vector<std::uint8_t> all(P * kName);
  group->allgather(mine.data(), all.data(), kName, DType::u8);
  std::vector<std::int32_t> node_of_rank(P, -1);
  std::int32_t nodes = 0;
  for (std::size_t p = 0; p < P; ++p) {
    for (std::size_t q = 0; q < p && node_of_rank[p] < 0; ++q)
      if (std::memcmp(&all[p * kName], &all[q * kName], kName) == 0)
        node_of_rank[p] = node_of_rank[q];
    if (node_of_rank[p] < 0) node_of_rank[p] = nodes++;
  }
  const std::int64_t L = experts / static_cast<std::int64_t>(P);
  std::vector<std::int32_t> out(static_cast<std::size_t>(experts));
  for (std::int64_t e = 0; e < experts; ++e)
    out[static_cast<std::size_t>(e)] = node_of_rank[static_cast<std::size_t>(e / L)];
  return out;
}

}  // namespace dst::model
