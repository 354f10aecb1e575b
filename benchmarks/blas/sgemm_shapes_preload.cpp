// LD_PRELOAD library: times every cblas_sgemm call of the process it is loaded into and
// writes one line per distinct call shape when the process exits. It shows where a real
// training step's matrix-product time goes, shape by shape, at the rate each shape reaches
// inside the run (caches, memory and neighbours as they are), next to the 2048^3 products
// dstrain times at start-up for its MFU peak. Used by gemm_shapes.sh; not part of dstrain.
//
// Output: $DSTRAIN_SGEMM_SHAPES_OUT.<pid>, lines
//   order trans_a trans_b m n k beta_is_zero start_up calls seconds
// start_up is 1 for the 2048^3 products made before any other shape: dstrain's start-up
// measurement of its SGEMM peak, told apart from a model's own 2048^3 products.
// (the CBLAS enum values as integers). Nothing is written without the variable.
#include <cblas.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

namespace {

using Shape = std::tuple<int, int, int, blasint, blasint, blasint, bool, bool>;
struct Tally {
  long calls = 0;
  double seconds = 0.0;
};

using SgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint,
                         float, const float*, blasint, const float*, blasint, float, float*,
                         blasint);

struct Recorder {
  std::mutex mutex;
  std::map<Shape, Tally> tallies;
  bool other_shape_seen = false;  ///< a product that is not 2048^3 has run
  ~Recorder() {
    const char* prefix = std::getenv("DSTRAIN_SGEMM_SHAPES_OUT");
    if (prefix == nullptr || tallies.empty()) return;
    char path[4096];
    std::snprintf(path, sizeof path, "%s.%ld", prefix, static_cast<long>(getpid()));
    std::FILE* f = std::fopen(path, "w");
    if (f == nullptr) {
      std::fprintf(stderr, "sgemm_shapes_preload: cannot write %s\n", path);
      return;
    }
    for (const auto& [s, t] : tallies)
      std::fprintf(f, "%d %d %d %d %d %d %d %d %ld %.9f\n", std::get<0>(s), std::get<1>(s),
                   std::get<2>(s), static_cast<int>(std::get<3>(s)),
                   static_cast<int>(std::get<4>(s)), static_cast<int>(std::get<5>(s)),
                   std::get<6>(s) ? 1 : 0, std::get<7>(s) ? 1 : 0, t.calls, t.seconds);
    std::fclose(f);
  }
};

Recorder& recorder() {
  static Recorder r;  // destroyed at exit, after main's products
  return r;
}

SgemmFn real_sgemm() {
  static const SgemmFn fn = reinterpret_cast<SgemmFn>(dlsym(RTLD_NEXT, "cblas_sgemm"));
  if (fn == nullptr) {
    std::fprintf(stderr, "sgemm_shapes_preload: no cblas_sgemm after this library\n");
    std::abort();
  }
  return fn;
}

}  // namespace

extern "C" void cblas_sgemm(const CBLAS_ORDER order, const CBLAS_TRANSPOSE ta,
                            const CBLAS_TRANSPOSE tb, const blasint m, const blasint n,
                            const blasint k, const float alpha, const float* a, const blasint lda,
                            const float* b, const blasint ldb, const float beta, float* c,
                            const blasint ldc) {
  const SgemmFn fn = real_sgemm();
  Recorder& rec = recorder();
  const auto t0 = std::chrono::steady_clock::now();
  fn(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::lock_guard<std::mutex> lock(rec.mutex);
  const bool cube = m == 2048 && n == 2048 && k == 2048;
  rec.other_shape_seen = rec.other_shape_seen || !cube;
  Tally& t =
      rec.tallies[Shape{order, ta, tb, m, n, k, beta == 0.0F, cube && !rec.other_shape_seen}];
  ++t.calls;
  t.seconds += dt;
}
