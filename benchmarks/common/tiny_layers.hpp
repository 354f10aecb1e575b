#pragma once
// The dense layers of the `tiny` preset (d_model 256, SwiGLU ffn 688, qkv 3 x 256, byte-level
// vocabulary 260) and its micro-batch's tokens (8 x 256), for benchmarks that run its
// products.
#include <cstdint>

namespace dst::bench {

constexpr std::int64_t kTinyTokens = 2048;

struct DenseLayer {
  std::int64_t out, in;
};

inline constexpr DenseLayer kTinyDenseLayers[] = {
    {768, 256}, {256, 256}, {688, 256}, {256, 688}, {260, 256}};

}  // namespace dst::bench
