// What the CPU extension's sources share: the kernels bindings.cpp binds, and the inner loops more than one kernel
// runs. The kernels' files see ATen's tensor headers only (outputs made by Tensor::new_empty / new_zeros); PyTorch's
// Python headers, which take most of a build's time, are bindings.cpp's alone, so the three files build side by side.
#pragma once

#include <ATen/core/Tensor.h>

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

// The selective scan (selective_scan.cpp): u, delta (batch, dim, L), A (dim, N), B, C (batch, L, N) ->
// (y (batch, dim, L), last state (batch, dim, N)); its backward adds dy (batch, dim, L) -> (du, ddelta, dA, dB, dC).
std::vector<at::Tensor> scan_forward(at::Tensor u, at::Tensor delta, at::Tensor A, at::Tensor B, at::Tensor C);
std::vector<at::Tensor> scan_backward(at::Tensor u, at::Tensor delta, at::Tensor A, at::Tensor B, at::Tensor C,
                                      at::Tensor dy);

// A Mamba block between its two projections, 1 or 2 directions (selective_scan.cpp): xz (batch, L, 2 dim dirs) ->
// y (batch, L, dim dirs); the weights' shapes where it is defined.
at::Tensor inner_forward(at::Tensor xz, at::Tensor lengths, at::Tensor conv_w, at::Tensor conv_b, at::Tensor x_proj,
                         at::Tensor dt_proj, at::Tensor dt_bias, at::Tensor A, at::Tensor D);

// A ReLU MLP per pair (pair_mlp.cpp): inputs (P, k_i) with input_weights (h_1, k_i), tables (n_t, h_1) read at
// indices (P,) int64 (empty: pair p reads row p), biases (h_1), (h_2), ..., weights (h_{l+1}, h_l) -> (P, h_L).
at::Tensor pair_mlp(std::vector<at::Tensor> inputs, std::vector<at::Tensor> input_weights,
                    std::vector<at::Tensor> tables, std::vector<at::Tensor> indices, std::vector<at::Tensor> weights,
                    std::vector<at::Tensor> biases);

}  // namespace trustbeam
