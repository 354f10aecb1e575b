#include "train/zero_shards.hpp"

#include <algorithm>
#include <string>

#include "comm/shared_sum.hpp"
#include "core/error.hpp"

namespace dst::train {

namespace {
void check_ranks(int ranks) {
  if (ranks < 1)
    throw Error("train::ZeroShards: the data group must have >= 1 rank, got " +
                std::to_string(ranks));
}
}  // namespace

ZeroShards ZeroShards::by_tensors(const model::ParamStore& store, int ranks) {
  return by_tensors(store, ranks, 0, store.buffer_elements());
}

ZeroShards ZeroShards::by_tensors(const model::ParamStore& store, int ranks, std::size_t begin,
                                  std::size_t end) {
  check_ranks(ranks);
  if (begin > end || end > store.buffer_elements())
    throw Error("train::ZeroShards::by_tensors: [" + std::to_string(begin) + ", " +
                std::to_string(end) + ") is not a range of the " +
                std::to_string(store.buffer_elements()) + " elements");
  const std::size_t n = end - begin;
  std::vector<std::size_t> starts;  // where a shard may begin: every tensor's start, the end
  for (const auto& s : store.specs())
    if (s.offset >= begin && s.offset < end) starts.push_back(s.offset - begin);
  starts.push_back(n);
  std::sort(starts.begin(), starts.end());
  std::vector<std::size_t> bounds{0};
  const auto N = static_cast<std::size_t>(ranks);
  for (std::size_t k = 1; k < N; ++k) {
    // k/N of the buffer, exactly (n * k may overflow for no buffer that fits in memory,
    // but the split keeps it from mattering).
    const std::size_t target = n / N * k + n % N * k / N;
    auto above = std::lower_bound(starts.begin(), starts.end(), target);
    std::size_t b = above == starts.end() ? n : *above;
    if (above != starts.begin() && target - *(above - 1) <= b - target) b = *(above - 1);
    bounds.push_back(std::max(b, bounds.back()));
  }
  bounds.push_back(n);
  return ZeroShards(std::move(bounds));
}

ZeroShards ZeroShards::by_parts(std::size_t elements, int ranks) {
  check_ranks(ranks);
  std::vector<std::size_t> bounds{0};
  for (int r = 0; r < ranks; ++r) {
    std::size_t first = 0, last = 0;
    comm::SharedSum::part_of(elements, ranks, r, first, last);
    bounds.push_back(last);
  }
  bounds.back() = elements;
  return ZeroShards(std::move(bounds));
}

std::vector<std::size_t> ZeroShards::counts(std::size_t begin, std::size_t end) const {
  if (begin > end || end > elements())
    throw Error("train::ZeroShards::counts: [" + std::to_string(begin) + ", " +
                std::to_string(end) + ") is not a range of the " + std::to_string(elements()) +
                " elements");
  std::vector<std::size_t> out;
  for (int r = 0; r < ranks(); ++r) {
    const std::size_t a = std::max(begin, first(r)), b = std::min(end, last(r));
    out.push_back(b > a ? b - a : 0);
  }
  return out;
}

}  // namespace dst::train
