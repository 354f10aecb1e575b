#pragma once
/// \file baseline.hpp
/// The bigram baseline a trained model must beat: next-token probabilities from bigram
/// counts of the training stream, add-alpha smoothed (alpha = 0.1: enough that unseen
/// pairs cost a finite loss, small enough not to flatten seen ones), scored as mean
/// cross-entropy (nats) on the validation stream.

#include <cstdint>
#include <vector>

namespace dst::train {

double bigram_cross_entropy(const std::vector<std::int32_t>& train,
                            const std::vector<std::int32_t>& valid, std::int32_t vocab_size,
                            double alpha = 0.1);

}  // namespace dst::train
