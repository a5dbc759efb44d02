// The CPU kernel of the context head's networks at inference: a ReLU MLP per candidate pair, one pass over the pairs
// with each pair's activations in cache.
//
//   h_1 = relu(b_1 + sum_k W_k x_k[p] + sum_g T_g[index_g[p]])     (first layer: per-pair inputs x_k, and rows of
//   h_l = relu(b_l + W_l h_{l-1})                                    per-device tables gathered per pair)
//   out[p] = b_L + W_L h_{L-1}                                       (the last layer without ReLU)
//
// PyTorch runs the same network as one operator per layer over every pair of a call, so each layer's (P, width)
// activations go through memory; here a block of pairs at a time keeps them in registers and L1, and the weights
// (a few KiB, transposed to (in, out) so every inner loop runs over contiguous outputs) stay in L1. Each pair's
// result depends on that pair alone, never on how many pairs share a call.
#include "kernels.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace trustbeam {
namespace {

constexpr int64_t kBlock = 8;  // pairs per step: a weight row loaded once serves this many pairs

// One layer over a block of rows: out (rows, width) = relu?(init + a (rows `a_stride` apart, `inner` columns) @ w
// (inner, width)), init's rows `init_stride` apart (0: one bias row for all). Widths 32 and 16 keep 2 x width sums
// in registers (8 AVX2 registers at 32 floats), width 1 (an output logit) is a dot product per row, any other
// width goes one input column at a time through memory.
template <typename T, int W, int Q>
inline void tile_layer(const T* a, int64_t a_stride, int64_t inner, const T* w, const T* init, int64_t init_stride,
                       bool relu, T* out) {
  T acc[Q][W];
  for (int q = 0; q < Q; ++q)
    for (int j = 0; j < W; ++j) acc[q][j] = init[q * init_stride + j];
  for (int64_t c = 0; c < inner; ++c) {
    const T* w_row = w + c * W;
    for (int q = 0; q < Q; ++q) {
      const T v = a[q * a_stride + c];
#pragma omp simd
      for (int j = 0; j < W; ++j) acc[q][j] += v * w_row[j];
    }
  }
  for (int q = 0; q < Q; ++q)
    for (int j = 0; j < W; ++j) out[q * W + j] = relu ? std::max(acc[q][j], T(0)) : acc[q][j];
}

template <typename T, int W>
inline void tiled_layer(const T* a, int64_t a_stride, int64_t rows, int64_t inner, const T* w, const T* init,
                        int64_t init_stride, bool relu, T* out) {
  int64_t q = 0;
  for (; q + 2 <= rows; q += 2)
    tile_layer<T, W, 2>(a + q * a_stride, a_stride, inner, w, init + q * init_stride, init_stride, relu, out + q * W);
  for (; q < rows; ++q)
    tile_layer<T, W, 1>(a + q * a_stride, a_stride, inner, w, init + q * init_stride, init_stride, relu, out + q * W);
}

template <typename T>
inline void block_layer(const T* a, int64_t a_stride, int64_t rows, int64_t inner, const T* w, int64_t width,
                        const T* init, int64_t init_stride, bool relu, T* out) {
  if (width == 32) return tiled_layer<T, 32>(a, a_stride, rows, inner, w, init, init_stride, relu, out);
  if (width == 16) return tiled_layer<T, 16>(a, a_stride, rows, inner, w, init, init_stride, relu, out);
  if (width == 1) {
    for (int64_t q = 0; q < rows; ++q) {
      const T* row = a + q * a_stride;
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < inner; ++c) sum += row[c] * w[c];
      sum += init[q * init_stride];
      out[q] = relu ? std::max(sum, T(0)) : sum;
    }
    return;
  }
  if (init != out)
    for (int64_t q = 0; q < rows; ++q) std::copy(init + q * init_stride, init + q * init_stride + width, out + q * width);
  accumulate_product(a, a_stride, inner, w, width, rows, out);
  if (relu)
    for (int64_t i = 0; i < rows * width; ++i) out[i] = std::max(out[i], T(0));
}

template <typename T>
void pair_mlp_kernel(const std::vector<const T*>& xs, const std::vector<int64_t>& x_widths,
                     const std::vector<const T*>& w_inputs, const std::vector<const T*>& tables,
                     const std::vector<const int64_t*>& indices, const std::vector<const T*>& layers,
                     const std::vector<const T*>& biases, const std::vector<int64_t>& widths, int64_t pairs, T* out) {
  const int64_t depth = static_cast<int64_t>(widths.size()) - 1;  // layers after the first
  const int64_t widest = *std::max_element(widths.begin(), widths.end()), w0 = widths[0];
  const size_t inputs = xs.size();
  at::parallel_for(0, (pairs + kBlock - 1) / kBlock, 64, [&](int64_t begin, int64_t end) {
    std::vector<T> h(kBlock * widest), g(kBlock * widest);
    for (int64_t block = begin; block < end; ++block) {
      const int64_t p0 = block * kBlock, rows = std::min(kBlock, pairs - p0);
      for (size_t t = 0; t < tables.size(); ++t) {  // the next block's rows, scattered over tables larger than
        if (indices[t] == nullptr) continue;       // L2, are fetched while this block computes
        for (int64_t p = p0 + kBlock; p < std::min(p0 + 2 * kBlock, pairs); ++p)
          for (int64_t line = 0; line < w0 * int64_t(sizeof(T)); line += 64)
            __builtin_prefetch(reinterpret_cast<const char*>(tables[t] + indices[t][p] * w0) + line);
      }
      const T* init = biases[0];  // the first layer starts from its bias plus each table's row of the pair
      int64_t init_stride = 0;
      if (!tables.empty()) {
        for (int64_t q = 0; q < rows; ++q) {
          T* hq = h.data() + q * w0;
          std::copy(biases[0], biases[0] + w0, hq);
          for (size_t t = 0; t < tables.size(); ++t) {
            const T* r = tables[t] + (indices[t] == nullptr ? p0 + q : indices[t][p0 + q]) * w0;
#pragma omp simd
            for (int64_t j = 0; j < w0; ++j) hq[j] += r[j];
          }
        }
        init = h.data();
        init_stride = w0;
      }
      for (size_t k = 0; k < inputs; ++k) {  // each input block adds its product; the last applies the ReLU
        const bool last_input = k + 1 == inputs;
        block_layer(xs[k] + p0 * x_widths[k], x_widths[k], rows, x_widths[k], w_inputs[k], w0, init, init_stride,
                    last_input && depth > 0, h.data());
        init = h.data();
        init_stride = w0;
      }
      int64_t width = w0;
      for (int64_t l = 0; l < depth; ++l) {
        const int64_t next = widths[l + 1];
        block_layer(h.data(), width, rows, width, layers[l], next, biases[l + 1], int64_t(0), l + 1 < depth, g.data());
        std::swap(h, g);
        width = next;
      }
      std::copy(h.data(), h.data() + rows * width, out + p0 * width);
    }
  });
}

}  // namespace

at::Tensor pair_mlp(std::vector<at::Tensor> inputs, std::vector<at::Tensor> input_weights,
                    std::vector<at::Tensor> tables, std::vector<at::Tensor> indices, std::vector<at::Tensor> weights,
                    std::vector<at::Tensor> biases) {
  TORCH_CHECK(!inputs.empty() && inputs.size() == input_weights.size(), "inputs and input_weights: one weight each");
  TORCH_CHECK(tables.size() == indices.size(), "tables and indices: one index each");
  TORCH_CHECK(biases.size() == weights.size() + 1, "biases: the first layer's, then one per further layer");
  const int64_t pairs = inputs[0].size(0), first = biases[0].size(0);
  const auto dtype = inputs[0].scalar_type();
  std::vector<at::Tensor> keep;  // contiguous (transposed) copies, alive for the call
  auto hold = [&](at::Tensor t) { keep.push_back(t.contiguous().to(dtype)); return keep.back(); };
  std::vector<int64_t> x_widths, widths{first};
  std::vector<at::Tensor> xs, w_in, tabs, idx, layers, bs;
  for (size_t k = 0; k < inputs.size(); ++k) {
    TORCH_CHECK(inputs[k].dim() == 2 && inputs[k].size(0) == pairs && inputs[k].device().is_cpu(),
                "inputs[", k, "]: (pairs, width) on the CPU");
    TORCH_CHECK(input_weights[k].dim() == 2 && input_weights[k].size(0) == first &&
                input_weights[k].size(1) == inputs[k].size(1), "input_weights[", k, "]: (first width, its input width)");
    xs.push_back(hold(inputs[k]));
    x_widths.push_back(inputs[k].size(1));
    w_in.push_back(hold(input_weights[k].t()));  // (input width, first width)
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    TORCH_CHECK(tables[t].dim() == 2 && tables[t].size(1) == first, "tables[", t, "]: (rows, first width)");
    const bool identity = indices[t].numel() == 0;  // pair p reads row p
    TORCH_CHECK(identity ? tables[t].size(0) == pairs : (indices[t].dim() == 1 && indices[t].size(0) == pairs &&
                                                         indices[t].scalar_type() == at::kLong),
                "indices[", t, "]: (pairs,) int64, or empty where pair p reads row p of a (pairs, width) table");
    if (!identity && pairs > 0)
      TORCH_CHECK(indices[t].min().item<int64_t>() >= 0 && indices[t].max().item<int64_t>() < tables[t].size(0),
                  "indices[", t, "]: every row must lie in [0, ", tables[t].size(0), ")");
    tabs.push_back(hold(tables[t]));
    idx.push_back(identity ? indices[t] : indices[t].contiguous());
  }
  bs.push_back(hold(biases[0]));
  for (size_t l = 0; l < weights.size(); ++l) {
    TORCH_CHECK(weights[l].dim() == 2 && weights[l].size(1) == widths.back() && biases[l + 1].dim() == 1 &&
                biases[l + 1].size(0) == weights[l].size(0), "weights[", l, "]: (out, in) after a layer of width in, "
                "biases[", l + 1, "]: (out,)");
    layers.push_back(hold(weights[l].t()));  // (in, out)
    bs.push_back(hold(biases[l + 1]));
    widths.push_back(weights[l].size(0));
  }
  auto out = inputs[0].new_empty({pairs, widths.back()});
  AT_DISPATCH_FLOATING_TYPES(dtype, "pair_mlp", [&] {
    auto ptrs = [](const std::vector<at::Tensor>& ts) {
      std::vector<const scalar_t*> p;
      for (const auto& t : ts) p.push_back(t.data_ptr<scalar_t>());
      return p;
    };
    std::vector<const int64_t*> index_ptrs;
    for (const auto& t : idx) index_ptrs.push_back(t.numel() == 0 ? nullptr : t.data_ptr<int64_t>());
    pair_mlp_kernel<scalar_t>(ptrs(xs), x_widths, ptrs(w_in), ptrs(tabs), index_ptrs, ptrs(layers), ptrs(bs), widths,
                              pairs, out.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace trustbeam
