// What the CPU extension's sources share: kernels defined outside selective_scan.cpp (which binds them all), and
// the inner loops more than one kernel runs.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace trustbeam {

// out (length, width) += a (length, first `inner` columns of rows `a_stride` apart) @ w (inner, width): one input
// column at a time over every step, so consecutive updates touch different rows (no chain through memory).
template <typename T>
inline void accumulate_product(const T* a, int64_t a_stride, int64_t inner, const T* w, int64_t width, int64_t length,
                               T* out) {
  for (int64_t k = 0; k < inner; ++k) {
    const T* w_k = w + k * width;
    for (int64_t t = 0; t < length; ++t) {
      const T v = a[t * a_stride + k];
      T* row = out + t * width;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) row[j] += v * w_k[j];
    }
  }
}

// A ReLU MLP per pair (pair_mlp.cpp): inputs (P, k_i) with input_weights (h_1, k_i), tables (n_t, h_1) read at
// indices (P,) int64 (empty: pair p reads row p), biases (h_1), (h_2), ..., weights (h_{l+1}, h_l) -> (P, h_L).
torch::Tensor pair_mlp(std::vector<torch::Tensor> inputs, std::vector<torch::Tensor> input_weights,
                       std::vector<torch::Tensor> tables, std::vector<torch::Tensor> indices,
                       std::vector<torch::Tensor> weights, std::vector<torch::Tensor> biases);

}  // namespace trustbeam
