#include "train/baseline.hpp"

#include <cmath>

#include "core/error.hpp"

namespace dst::train {

double bigram_cross_entropy(const std::vector<std::int32_t>& train,
                            const std::vector<std::int32_t>& valid, std::int32_t vocab_size,
                            double alpha) {
  const auto V = static_cast<std::size_t>(vocab_size);
  std::vector<double> pair(V * V, 0.0), row(V, 0.0);
  auto check = [&](std::int32_t t) {
    if (t < 0 || t >= vocab_size)
      throw Error("bigram baseline: token " + std::to_string(t) + " outside the vocabulary");
    return static_cast<std::size_t>(t);
  };
  for (std::size_t i = 0; i + 1 < train.size(); ++i) {
    const auto a = check(train[i]), b = check(train[i + 1]);
    pair[a * V + b] += 1.0;
    row[a] += 1.0;
  }
  double nll = 0.0;
  std::size_t n = 0;
  for (std::size_t i = 0; i + 1 < valid.size(); ++i) {
    const auto a = check(valid[i]), b = check(valid[i + 1]);
    nll -= std::log((pair[a * V + b] + alpha) / (row[a] + alpha * static_cast<double>(V)));
    ++n;
  }
  return n ? nll / static_cast<double>(n) : 0.0;
}

}  // namespace dst::train
