#pragma once
/// \file bpe_merge.hpp
/// The BPE merge loop over token ids, with the merge table as a flat hash map keyed by
/// id pairs. Two algorithms give identical results (tested against each other): a
/// linear scan for short pieces (most words; no heap, cache friendly) and the
/// priority-queue algorithm of `tokenizers` for long ones (runs of spaces or CJK
/// characters can be thousands of bytes, where rescanning would be quadratic).

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dst::data::detail {

/// (left id, right id) -> (rank, merged id): open addressing with linear probing.
class MergeTable {
 public:
  struct Entry {
    std::uint64_t key;
    std::uint32_t rank;
    std::int32_t merged;
  };

  /// Sizes the table for `n` merges (load factor at most 1/2).
  void reserve(std::size_t n);
  /// Adds or replaces the merge of (left, right). A later duplicate replaces an earlier
  /// one, as in `tokenizers` (its merge map is collected from the list in order).
  void insert(std::int32_t left, std::int32_t right, std::uint32_t rank, std::int32_t merged);
  /// The merge of (left, right), nullptr if there is none.
  const Entry* find(std::int32_t left, std::int32_t right) const {
    if (slots_.empty()) return nullptr;
    const std::uint64_t key = pack(left, right);
    for (std::size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};  // ids are >= 0: never a key
  static std::uint64_t pack(std::int32_t l, std::int32_t r) {
    return (std::uint64_t{static_cast<std::uint32_t>(l)} << 32) | static_cast<std::uint32_t>(r);
  }
  static std::size_t hash(std::uint64_t k) {
    // Fibonacci hashing: multiply by 2^64/phi and keep the high bits (Knuth 6.4).
    return static_cast<std::size_t>((k * 0x9E3779B97F4A7C15ull) >> 32);
  }
  std::vector<Entry> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

/// Reusable buffers of the heap algorithm.
struct MergeScratch {
  struct Symbol {
    std::int32_t id, prev, next;
  };
  struct Candidate {
    std::uint32_t rank, pos;
    std::int32_t merged;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::vector<std::uint64_t> pair_ranks;  // linear scan: (rank << 32 | merged) per pair
};

/// Applies the merges to `ids` in place: repeatedly the lowest-rank adjacent pair,
/// leftmost first among equal ranks, until no pair has a merge.
void bpe_merge_linear(std::vector<std::int32_t>& ids, const MergeTable& merges, MergeScratch& s);
void bpe_merge_heap(std::vector<std::int32_t>& ids, const MergeTable& merges, MergeScratch& s);

/// Pieces up to this many symbols use the linear scan. Measured on the parity corpus:
/// the scan beats the heap below a few dozen symbols; beyond ~100 its quadratic
/// rescans lose.
inline constexpr std::size_t kLinearMergeMax = 48;

inline void bpe_merge(std::vector<std::int32_t>& ids, const MergeTable& merges, MergeScratch& s) {
  if (ids.size() <= kLinearMergeMax)
    bpe_merge_linear(ids, merges, s);
  else
    bpe_merge_heap(ids, merges, s);
}

}  // namespace dst::data::detail
