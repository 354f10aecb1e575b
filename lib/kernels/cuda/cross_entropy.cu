// Cross-entropy over the vocabulary on the GPU, alone or fused with its gradient: a row
// group per row, the Kokkos kernel's passes and float/double choices.
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

void check_targets(cudaStream_t stream, const char* kernel, const std::int32_t* targets,
                   const Index n, const Index v, const std::int32_t ignore_index,
                   unsigned long long* flag, void* host) {
  const Index bad = first_bad_id(stream, targets, n, v, true, ignore_index, nullptr, flag, host);
  if (bad < 0) return;
  const std::int32_t id = id_at(stream, targets, bad, host);
  throw Error(std::string("kernels::") + kernel + ": target " + std::to_string(id) +
              " at position " + std::to_string(bad) + " is outside the vocabulary [0, " +
              std::to_string(v) + ") and is not the ignore index " + std::to_string(ignore_index));
}

/// Per row: the target's logit (read first: dlogits may alias logits), the max, the sum
/// of exp(l - max) in double, loss = log(sum) + max - l[t]. With kFused a third pass writes
/// dlogits = exp(l - max) * (grad_scale / sum), minus grad_scale at the target. Kokkos
/// stores exp(l - max) in the second pass and reloads it in the third; here the third pass
/// recomputes it (the same float, bit for bit) so that a row of 1e5 logits, too large to
/// stay in cache between passes, costs three reads and one write instead of three reads and
/// two writes. Every element is read and written by the thread owning its quad, after
/// the group barriers of both reductions, so the in-place form is safe. Ignored rows
/// (target == ignore_index) get loss 0 and a zero gradient.
template <int kGroup, bool kVec, bool kFused>
__global__ void __launch_bounds__(RowGroup<kGroup>::kBlock)
    rows(const float* logits,          // (N, V)
         const std::int32_t* targets,  // (N)
         const std::int32_t ignore_index, const float grad_scale,
         float* losses,   // (N)
         float* dlogits,  // (N, V) if kFused
         const Index n, const Index v) {
  using G = RowGroup<kGroup>;
  __shared__ double partial[G::kWarpsPerBlock];
  __shared__ float partial_max[G::kWarpsPerBlock];
  const Index row = G::row();
  const bool active = row < n;
  const std::int32_t t = active ? targets[row] : ignore_index;
  const bool counted = active && t != ignore_index;
  const Index quads = ceil_div(v, 4);
  const Index counted_quads = counted ? quads : 0;
  const Index base = (active ? row : 0) * v;
  const float* l = logits + base;
  const float target_logit = counted ? l[t] : 0.0f;

  float m = math::negative_infinity();
  for (Index q = G::rank(); q < counted_quads; q += kGroup) {
    float x[4];
    load4<kVec>(l, 4 * q, v, x);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (4 * q + k < v) m = x[k] > m ? x[k] : m;
  }
  m = G::max(m, partial_max);

  double sum = 0.0;
  for (Index q = G::rank(); q < counted_quads; q += kGroup) {
    float x[4];
    load4<kVec>(l, 4 * q, v, x);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (4 * q + k < v) sum += static_cast<double>(math::fast_exp(x[k] - m));
  }
  sum = G::sum(sum, partial);
  if (!active) return;  // after the group's last barrier

  if (G::rank() == 0)
    losses[row] = counted ? static_cast<float>(log(sum) + static_cast<double>(m) -
                                               static_cast<double>(target_logit))
                          : 0.0f;
  if constexpr (kFused) {
    // dlogits may alias logits: another lane of the group overwrites l[t], which every lane
    // read above. The reductions' shuffles do not order memory between lanes (and with one
    // warp per group there is no __syncthreads): order the reads before the stores. Groups
    // are whole warps, and an inactive row's warp has returned as a whole.
    __syncwarp();
    float* d = dlogits + base;
    // softmax * grad_scale in one factor; sum >= 1 (the max's term is exp(0)).
    const float f = counted ? static_cast<float>(static_cast<double>(grad_scale) / sum) : 0.0f;
    for (Index q = G::rank(); q < quads; q += kGroup) {
      float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (counted) {
        load4<kVec>(l, 4 * q, v, x);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const Index j = 4 * q + k;
          const float e = math::fast_exp(x[k] - m) * f;
          x[k] = j == t ? e - grad_scale : e;
        }
      }
      store4<kVec>(d, 4 * q, v, x);
    }
  }
}

}  // namespace
}  // namespace detail

void run(void* stream, const kernels::detail::CrossEntropyArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  const bool fused = a.dlogits != nullptr;
  const char* kernel = fused ? "cross_entropy_fused" : "cross_entropy_forward";
  ScratchLayout layout;
  const std::size_t flag_at = layout.add(sizeof(unsigned long long));
  const Scratch sc = scratch(s, layout.bytes());
  check_targets(s, kernel, a.targets, a.n, a.v, a.ignore_index,
                reinterpret_cast<unsigned long long*>(sc.device + flag_at), sc.host);
  const bool vec = a.v % 4 == 0 && aligned16(a.logits) && (!fused || aligned16(a.dlogits));
  with_group(group_for(a.v), [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    with_flag(vec, [&](auto kVec) {
      with_flag(fused, [&](auto kFused) {
        DST_CUDA_LAUNCH(fused ? "dst::kernels::cross_entropy_fused::rows"
                              : "dst::kernels::cross_entropy_forward::rows",
                        rows<kGroup, decltype(kVec)::value, decltype(kFused)::value>,
                        row_grid<kGroup>(a.n, kernel), dim3(RowGroup<kGroup>::kBlock), s, a.logits,
                        a.targets, a.ignore_index, a.grad_scale, a.losses, a.dlogits, a.n, a.v);
      });
    });
  });
}

}  // namespace dst::kernels::cuda_backend
