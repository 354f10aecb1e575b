// Token embedding: a row gather forward, a deterministic scatter-add backward.
#include <string>

#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

/// Throws unless every token id is in [0, v): a bad id would read or write outside wte.
template <class ExecSpace>
void check_tokens(const ExecSpace& space, const char* kernel,
                  const Vector<ExecSpace, const std::int32_t>& tokens, const Index v,
                  const char* table = "the vocabulary") {
  const std::string op = std::string("dst::kernels::") + kernel;
  const Index bad = first_bad_id(space, op + "::check_tokens", tokens, v, false, 0);
  if (bad < 0) return;
  const std::int32_t id = id_at(space, op + "::read_bad_token", tokens, bad);
  throw Error(std::string("kernels::") + kernel + ": token id " + std::to_string(id) +
              " at position " + std::to_string(bad) + " is outside " + table + " [0, " +
              std::to_string(v) + ")");
}

template <class T, class ExecSpace>
void embedding_forward(const ExecSpace& space,
                       const Vector<ExecSpace, const std::int32_t>& tokens,  // (N)
                       const Matrix<ExecSpace, const T>& wte,                // (V, C)
                       const Matrix<ExecSpace, T>& out,                      // (N, C)
                       const char* kernel, const char* table) {
  check_tokens(space, kernel, tokens, static_cast<Index>(wte.extent(0)), table);
  const Index c = static_cast<Index>(out.extent(1));
  Kokkos::parallel_for(
      "dst::kernels::embedding_forward::gather",
      Range<ExecSpace>(space, 0, static_cast<Index>(out.extent(0))), KOKKOS_LAMBDA(const Index n) {
        const T* src = &wte(tokens(n), 0);
        T* dst = &out(n, 0);
        for (Index j = 0; j < c; ++j)
          dst[j] = from_float<T>(to_float(src[j]));
      });
}

/// Each work item owns a block of columns and walks the tokens in order, so a row of dwte
/// hit by several tokens receives their rows in token order: no atomics, and the same
/// bits on every run and every back end.
template <class T, class ExecSpace>
void embedding_backward(const ExecSpace& space,
                        const Vector<ExecSpace, const std::int32_t>& tokens,  // (N)
                        const Matrix<ExecSpace, const T>& dout,               // (N, C)
                        const Matrix<ExecSpace, T>& dwte) {                   // (V, C)
  check_tokens(space, "embedding_backward", tokens, static_cast<Index>(dwte.extent(0)));
  const Index n_tok = static_cast<Index>(dout.extent(0));
  const Index c = static_cast<Index>(dout.extent(1));
  constexpr Index kBlock = column_block<ExecSpace>();
  const Index blocks = (c + kBlock - 1) / kBlock;
  Kokkos::parallel_for(
      "dst::kernels::embedding_backward::scatter_add", Range<ExecSpace>(space, 0, blocks),
      KOKKOS_LAMBDA(const Index blk) {
        const Index j0 = blk * kBlock;
        const Index width = c - j0 < kBlock ? c - j0 : kBlock;
        for (Index n = 0; n < n_tok; ++n) {
          const T* src = &dout(n, j0);
          T* dst = &dwte(tokens(n), j0);
          for (Index j = 0; j < width; ++j)
            dst[j] = from_float<T>(to_float(dst[j]) + to_float(src[j]));
        }
      });
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::EmbeddingForwardArgs& a) {
  using namespace detail;
  embedding_forward<float>(Space(), Vector<Space, const std::int32_t>(a.tokens, a.n),
                           Matrix<Space, const float>(a.wte, a.v, a.c),
                           Matrix<Space, float>(a.out, a.n, a.c), a.kernel, a.table);
}

void run(const kernels::detail::EmbeddingBackwardArgs& a) {
  using namespace detail;
  embedding_backward<float>(Space(), Vector<Space, const std::int32_t>(a.tokens, a.n),
                            Matrix<Space, const float>(a.dout, a.n, a.c),
                            Matrix<Space, float>(a.dwte, a.v, a.c));
}

}  // namespace dst::kernels::kokkos_backend
