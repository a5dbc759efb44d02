// Kernels of the CPU extension defined outside selective_scan.cpp (which binds them all).
#pragma once

#include <torch/types.h>

#include <vector>

namespace trustbeam {

// A ReLU MLP per pair (pair_mlp.cpp): inputs (P, k_i) with input_weights (h_1, k_i), tables (n_t, h_1) read at
// indices (P,) int64 (empty: pair p reads row p), biases (h_1), (h_2), ..., weights (h_{l+1}, h_l) -> (P, h_L).
torch::Tensor pair_mlp(std::vector<torch::Tensor> inputs, std::vector<torch::Tensor> input_weights,
                       std::vector<torch::Tensor> tables, std::vector<torch::Tensor> indices,
                       std::vector<torch::Tensor> weights, std::vector<torch::Tensor> biases);

}  // namespace trustbeam
