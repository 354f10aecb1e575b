#pragma once
/// \file kokkos_backend.hpp
/// The Kokkos back end's entry points, one `run` overload per kernel over the validated
/// arguments of kernels/detail/args.hpp. This header includes no Kokkos, so kernels.cpp
/// (and through it the model layer) never sees Kokkos; the kernels themselves live in the
/// .cpp files of this folder, templated on the execution space and instantiated for
/// Kokkos::DefaultExecutionSpace.

#include "kernels/detail/args.hpp"
#include "tensor/tensor.hpp"

namespace dst::kernels::kokkos_backend {

/// True once Kokkos::initialize has run (and finalize has not).
bool initialized();
/// Where the tensors of this back end must live: host when the default execution space
/// reads host memory (Serial, OpenMP, Threads), cuda otherwise.
tensor::Device device();

/// Throws dst::Error naming the kernel and the first bad token id and its position.
void run(const kernels::detail::EmbeddingForwardArgs& a);
/// Throws dst::Error naming the kernel and the first bad token id and its position.
void run(const kernels::detail::EmbeddingBackwardArgs& a);
void run(const kernels::detail::RmsnormForwardArgs& a);
void run(const kernels::detail::RmsnormBackwardArgs& a);
void run(const kernels::detail::RopeTablesArgs& a);
void run(const kernels::detail::RopeArgs& a);
void run(const kernels::detail::RopeInterleavedArgs& a);
void run(const kernels::detail::SoftmaxForwardArgs& a);
void run(const kernels::detail::SoftmaxBackwardArgs& a);
void run(const kernels::detail::SwigluForwardArgs& a);
void run(const kernels::detail::SwigluBackwardArgs& a);
/// Forward only when a.dlogits is nullptr. Throws dst::Error naming the first target
/// outside [0, V) that is not the ignore index, and its position.
void run(const kernels::detail::CrossEntropyArgs& a);
void run(const kernels::detail::EmbeddingSliceForwardArgs& a);
void run(const kernels::detail::EmbeddingSliceBackwardArgs& a);
void run(const kernels::detail::CrossEntropySliceMaxArgs& a);
void run(const kernels::detail::CrossEntropySliceSumsArgs& a);
void run(const kernels::detail::CrossEntropySliceFinishArgs& a);
void run(const kernels::detail::AddArgs& a);
void run(const kernels::detail::AccumulateArgs& a);
void run(const kernels::detail::ZeroArgs& a);
void run(const kernels::detail::ScaleArgs& a);
void run(const kernels::detail::RoundToStorageArgs& a);
void run(const kernels::detail::SumOfSquaresArgs& a);
void run(const kernels::detail::SumOfSquaresIntoArgs& a);
void run(const kernels::detail::FirstNonfiniteArgs& a);
void run(const kernels::detail::FirstNonfiniteMinArgs& a);
void run(const kernels::detail::AdamwArgs& a);
void run(const kernels::detail::GatherRowsBackwardArgs& a);
void run(const kernels::detail::MoeCombineForwardArgs& a);
void run(const kernels::detail::MoeCombineBackwardArgs& a);

}  // namespace dst::kernels::kokkos_backend
