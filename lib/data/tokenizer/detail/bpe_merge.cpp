#include "data/tokenizer/detail/bpe_merge.hpp"

#include <algorithm>

namespace dst::data::detail {

void MergeTable::reserve(std::size_t n) {
  std::size_t cap = 16;
  while (cap < 2 * n)
    cap *= 2;
  std::vector<Entry> old;
  old.swap(slots_);
  slots_.assign(cap, Entry{kEmpty, 0, 0});
  mask_ = cap - 1;
  size_ = 0;
  for (const Entry& e : old)
    if (e.key != kEmpty)
      insert(static_cast<std::int32_t>(e.key >> 32), static_cast<std::int32_t>(e.key & 0xFFFFFFFFu),
             e.rank, e.merged);
}

void MergeTable::insert(std::int32_t left, std::int32_t right, std::uint32_t rank,
                        std::int32_t merged) {
  if (2 * (size_ + 1) > slots_.size()) reserve(2 * (size_ + 1));
  const std::uint64_t key = pack(left, right);
  for (std::size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
    Entry& e = slots_[i];
    if (e.key == key) {
      e.rank = rank;
      e.merged = merged;
      return;
    }
    if (e.key == kEmpty) {
      e = Entry{key, rank, merged};
      ++size_;
      return;
    }
  }
}

namespace {
constexpr std::uint64_t kNoMerge = ~std::uint64_t{0};

std::uint64_t pair_key(const MergeTable& merges, std::int32_t l, std::int32_t r) {
  const MergeTable::Entry* e = merges.find(l, r);
  // Rank in the high half so that comparing the packed value compares ranks.
  return e == nullptr ? kNoMerge
                      : (std::uint64_t{e->rank} << 32) | static_cast<std::uint32_t>(e->merged);
}
}  // namespace

void bpe_merge_linear(std::vector<std::int32_t>& ids, const MergeTable& merges, MergeScratch& s) {
  if (ids.size() < 2) return;
  auto& pr = s.pair_ranks;  // pr[i]: the merge of (ids[i], ids[i+1])
  pr.resize(ids.size() - 1);
  for (std::size_t i = 0; i + 1 < ids.size(); ++i)
    pr[i] = pair_key(merges, ids[i], ids[i + 1]);
  while (!pr.empty()) {
    // First minimum = lowest rank, leftmost among equals.
    const auto best = std::min_element(pr.begin(), pr.end());
    if (*best == kNoMerge) break;
    const auto i = static_cast<std::size_t>(best - pr.begin());
    ids[i] = static_cast<std::int32_t>(*best & 0xFFFFFFFFu);
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    pr.erase(best);
    if (i > 0) pr[i - 1] = pair_key(merges, ids[i - 1], ids[i]);
    if (i < pr.size()) pr[i] = pair_key(merges, ids[i], ids[i + 1]);
  }
}

void bpe_merge_heap(std::vector<std::int32_t>& ids, const MergeTable& merges, MergeScratch& s) {
  const std::size_t n = ids.size();
  if (n < 2) return;
  auto& sym = s.symbols;
  auto& heap = s.heap;
  sym.resize(n);
  heap.clear();
  // Min-heap on (rank, pos): the same order as tokenizers' BinaryHeap of Merge.
  const auto later = [](const MergeScratch::Candidate& a, const MergeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  for (std::size_t i = 0; i < n; ++i)
    sym[i] = {ids[i], static_cast<std::int32_t>(i) - 1,
              i + 1 < n ? static_cast<std::int32_t>(i + 1) : -1};
  const auto push = [&](std::int32_t pos) {
    const std::int32_t next = sym[pos].next;
    if (next < 0) return;
    if (const MergeTable::Entry* e = merges.find(sym[pos].id, sym[next].id)) {
      heap.push_back({e->rank, static_cast<std::uint32_t>(pos), e->merged});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (std::size_t i = 0; i + 1 < n; ++i)
    push(static_cast<std::int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const MergeScratch::Candidate c = heap.back();
    heap.pop_back();
    auto& left = sym[c.pos];
    if (left.id < 0 || left.next < 0) continue;  // merged away, or now last
    const MergeTable::Entry* e = merges.find(left.id, sym[left.next].id);
    if (e == nullptr || e->merged != c.merged) continue;  // stale: the pair changed
    const std::int32_t right = left.next;
    left.id = c.merged;
    left.next = sym[right].next;
    if (left.next >= 0) sym[left.next].prev = static_cast<std::int32_t>(c.pos);
    sym[right].id = -1;
    if (left.prev >= 0) push(left.prev);
    push(static_cast<std::int32_t>(c.pos));
  }
  ids.clear();
  for (std::int32_t i = 0; i >= 0; i = sym[i].next)
    ids.push_back(sym[i].id);
}

}  // namespace dst::data::detail
