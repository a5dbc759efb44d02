// The CPU kernels of the Mamba blocks: the selective scan (training and inference) and a fused inference pass
// (bound, with the context head's pair networks, in bindings.cpp).
//
// Selective scan: one pass per (batch, channel) with the state in registers.
//
//   h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t      (h: N values per channel)
//   y_t = <C_t, h_t>
//
// Shapes: u, delta (batch, dim, L); A (dim, N); B, C (batch, L, N) -- time-major so the
// state loop reads contiguous memory. D, z gating and the delta bias/softplus are applied by
// the caller (elementwise, autograd). The backward pass recomputes the states of one
// (batch, channel) into a small buffer and runs the adjoint recurrence in reverse.
//
// Fused inference (inner_forward): everything of a Mamba block between its two projections, for one or
// both directions of a BiMamba layer, one sequence at a time so that its intermediates stay in cache:
//
//   x, z = xz                      (the in_proj output, (L, 2 dim) per direction)
//   x = silu(conv1d_causal(x))     (depthwise, d_conv taps)
//   dt, B, C = x @ x_proj^T;  delta = softplus(dt @ dt_proj^T + dt_bias)
//   y = (scan(x, delta, A, B, C) + D x) * silu(z)
//
// vectorized over channels (the state is (N, dim), so each step is dim-wide FMAs and exps with no
// reduction across lanes). Direction k reads xz[..., 2 dim k : 2 dim (k + 1)] and writes
// y[..., dim k : dim (k + 1)]; direction 1 runs over each sequence's valid prefix reversed (a BiMamba
// layer's backward block), and padding positions (t >= length) are written as zeros: they never reach a
// valid position of either causal direction.
#include "kernels.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace trustbeam {
namespace {

template <typename T>
void forward_kernel(const T* u, const T* delta, const T* A, const T* B, const T* C, T* y,
                    int64_t batch, int64_t dim, int64_t L, int64_t N, T* last_state) {
  at::parallel_for(0, batch * dim, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> h(N), dA(N);
    for (int64_t bd = begin; bd < end; ++bd) {
      const int64_t b = bd / dim, d = bd % dim;
      const T* u_row = u + bd * L;
      const T* dt_row = delta + bd * L;
      const T* A_row = A + d * N;
      std::fill(h.begin(), h.end(), T(0));
      for (int64_t t = 0; t < L; ++t) {
        const T dt = dt_row[t], dtu = dt * u_row[t];
        const T* B_t = B + (b * L + t) * N;
        const T* C_t = C + (b * L + t) * N;
#pragma omp simd
        for (int64_t n = 0; n < N; ++n) dA[n] = std::exp(dt * A_row[n]);
        T acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t n = 0; n < N; ++n) {
          h[n] = dA[n] * h[n] + dtu * B_t[n];
          acc += h[n] * C_t[n];
        }
        y[bd * L + t] = acc;
      }
      if (last_state) std::copy(h.begin(), h.end(), last_state + bd * N);
    }
  });
}

template <typename T>
void backward_kernel(const T* u, const T* delta, const T* A, const T* B, const T* C, const T* dy,
                     T* du, T* ddelta, T* dA_part, T* dB, T* dC,
                     int64_t batch, int64_t dim, int64_t L, int64_t N) {
  // Parallel over batch: dB and dC (batch, L, N) sum over channels of one batch row, so each
  // thread owns its rows; dA sums over the batch, so each row writes its own slice of dA_part.
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> states((L + 1) * N), decay(L * N), dh(N);
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t d = 0; d < dim; ++d) {
        const int64_t bd = b * dim + d;
        const T *u_row = u + bd * L, *dt_row = delta + bd * L, *dy_row = dy + bd * L;
        const T* A_row = A + d * N;
        T* dA_row = dA_part + bd * N;
        std::fill(states.begin(), states.begin() + N, T(0));
        for (int64_t t = 0; t < L; ++t) {
          const T dt = dt_row[t], dtu = dt * u_row[t];
          const T* B_t = B + (b * L + t) * N;
          T* a = decay.data() + t * N;
          const T* prev = states.data() + t * N;
          T* next = states.data() + (t + 1) * N;
#pragma omp simd
          for (int64_t n = 0; n < N; ++n) {
            a[n] = std::exp(dt * A_row[n]);
            next[n] = a[n] * prev[n] + dtu * B_t[n];
          }
        }
        std::fill(dh.begin(), dh.end(), T(0));
        for (int64_t t = L - 1; t >= 0; --t) {
          const T dt = dt_row[t], ut = u_row[t], g = dy_row[t];
          const T* B_t = B + (b * L + t) * N;
          const T* C_t = C + (b * L + t) * N;
          T* dB_t = dB + (b * L + t) * N;
          T* dC_t = dC + (b * L + t) * N;
          const T* a = decay.data() + t * N;
          const T* prev = states.data() + t * N;
          const T* h = states.data() + (t + 1) * N;
          T g_dt = 0, g_u = 0;
#pragma omp simd reduction(+ : g_dt, g_u)
          for (int64_t n = 0; n < N; ++n) {
            dC_t[n] += g * h[n];
            const T gh = dh[n] + g * C_t[n];          // dL/dh_t
            const T ga = gh * prev[n] * a[n];          // dL/d(dt*A) through the decay
            dA_row[n] += ga * dt;
            g_dt += ga * A_row[n] + gh * B_t[n] * ut;
            g_u += gh * dt * B_t[n];
            dB_t[n] += gh * dt * ut;
            dh[n] = gh * a[n];                         // carried to h_{t-1}
          }
          ddelta[bd * L + t] = g_dt;
          du[bd * L + t] = g_u;
        }
      }
    }
  });
}

void check(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
           const at::Tensor& B, const at::Tensor& C) {
  TORCH_CHECK(u.dim() == 3 && delta.sizes() == u.sizes(), "u, delta: (batch, dim, L) of equal shape");
  TORCH_CHECK(A.dim() == 2 && A.size(0) == u.size(1), "A: (dim, N)");
  TORCH_CHECK(B.dim() == 3 && B.size(0) == u.size(0) && B.size(1) == u.size(2) && B.size(2) == A.size(1),
              "B: (batch, L, N)");
  TORCH_CHECK(C.sizes() == B.sizes(), "C: (batch, L, N)");
  for (const auto* t : {&u, &delta, &A, &B, &C}) {
    TORCH_CHECK(t->is_contiguous() && t->device().is_cpu() && t->scalar_type() == u.scalar_type(),
                "inputs must be contiguous CPU tensors of one dtype");
  }
}

}  // namespace

std::vector<at::Tensor> scan_forward(at::Tensor u, at::Tensor delta, at::Tensor A, at::Tensor B, at::Tensor C) {
  check(u, delta, A, B, C);
  auto y = u.new_empty(u.sizes());
  auto last = u.new_empty({u.size(0), u.size(1), A.size(1)});
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "selective_scan_forward", [&] {
    forward_kernel<scalar_t>(u.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(),
                             B.data_ptr<scalar_t>(), C.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                             u.size(0), u.size(1), u.size(2), A.size(1), last.data_ptr<scalar_t>());
  });
  return {y, last};
}

std::vector<at::Tensor> scan_backward(at::Tensor u, at::Tensor delta, at::Tensor A, at::Tensor B, at::Tensor C,
                                      at::Tensor dy) {
  check(u, delta, A, B, C);
  dy = dy.contiguous();
  auto du = u.new_empty(u.sizes()), ddelta = delta.new_empty(delta.sizes());
  auto dA_part = u.new_zeros({u.size(0), u.size(1), A.size(1)});
  auto dB = B.new_zeros(B.sizes()), dC = C.new_zeros(C.sizes());
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "selective_scan_backward", [&] {
    backward_kernel<scalar_t>(u.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(),
                              B.data_ptr<scalar_t>(), C.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                              du.data_ptr<scalar_t>(), ddelta.data_ptr<scalar_t>(), dA_part.data_ptr<scalar_t>(),
                              dB.data_ptr<scalar_t>(), dC.data_ptr<scalar_t>(),
                              u.size(0), u.size(1), u.size(2), A.size(1));
  });
  return {du, ddelta, dA_part.sum(0), dB, dC};
}

namespace {

// exp of a scan's decay argument (delta * A <= 0), inlined so a vector loop needs no call: Cephes' expf (range
// reduction by ln 2, degree-5 polynomial; within 2 ulp of std::exp on [-87, 0]); float64 keeps std::exp.
template <typename T>
inline T decay_exp(T v) { return std::exp(v); }

template <>
inline float decay_exp<float>(float v) {
  v = std::max(v, -87.0f);
  const float n = std::floor(v * 1.44269504088896341f + 0.5f);
  const float r = v - n * 0.693359375f - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n; n >= -126 on the clamped range
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

template <typename T>
inline T softplus(T v) { return v > T(20) ? v : std::log1p(std::exp(v)); }  // torch's threshold

template <typename T>
inline T silu(T v) { return v / (T(1) + std::exp(-v)); }

// One scan step on channels [c0, c0 + V): V a compile-time width, so the accumulator is a fixed-size local array
// the compiler keeps in vector registers while the loop over states runs outside the vector lanes (a
// runtime-length loop inside an `omp simd` loop vectorizes badly).
template <int V, typename T>
inline void scan_channels(int64_t c0, int64_t dim, int64_t N, const T* d, const T* x, const T* B_t, const T* C_t,
                          const T* A_t, const T* D, const T* z, T* h, T* out) {
  T acc[V], dx[V];
#pragma omp simd
  for (int v = 0; v < V; ++v) {
    acc[v] = 0;
    dx[v] = d[c0 + v] * x[c0 + v];
  }
  for (int64_t n = 0; n < N; ++n) {
    const T b = B_t[n], cn = C_t[n];
    const T* a = A_t + n * dim + c0;
    T* state = h + n * dim + c0;
#pragma omp simd
    for (int v = 0; v < V; ++v) {
      state[v] = decay_exp(d[c0 + v] * a[v]) * state[v] + dx[v] * b;
      acc[v] += state[v] * cn;
    }
  }
#pragma omp simd
  for (int v = 0; v < V; ++v) out[c0 + v] = (acc[v] + D[c0 + v] * x[c0 + v]) * silu(z[c0 + v]);
}

constexpr int kLanes = 16;  // channels per vector step (one AVX-512 register of floats); the rest one at a time

// One direction of the fused block over one sequence. Weights are pre-transposed so every inner loop runs
// over contiguous channels: conv_w (K, dim), x_proj_t (dim, J) with J = R + 2N, dt_proj_t (R, dim), A_t (N, dim).
template <typename T>
void inner_sequence(const T* xz, int64_t xz_stride, T* y, int64_t y_stride, int64_t length, bool reverse,
                    int64_t dim, int64_t K, int64_t R, int64_t N,
                    const T* conv_w, const T* conv_b, const T* x_proj_t, const T* dt_proj_t, const T* dt_bias,
                    const T* A_t, const T* D, T* xc, T* dbc, T* delta, T* h) {
  const int64_t J = R + 2 * N, wide = dim - dim % kLanes;
  auto row = [&](int64_t t) { return reverse ? length - 1 - t : t; };  // step t of the scan -> position
  // causal depthwise conv + silu, in the direction's order: tap by tap over every step (no chain between steps)
  for (int64_t t = 0; t < length; ++t) std::copy(conv_b, conv_b + dim, xc + t * dim);
  for (int64_t k = 0; k < K; ++k) {
    const T* w = conv_w + k * dim;
    for (int64_t t = std::max<int64_t>(0, K - 1 - k); t < length; ++t) {
      const T* x = xz + row(t - (K - 1) + k) * xz_stride;
      T* out = xc + t * dim;
#pragma omp simd
      for (int64_t c = 0; c < dim; ++c) out[c] += w[c] * x[c];
    }
  }
#pragma omp simd
  for (int64_t t = 0; t < length * dim; ++t) xc[t] = silu(xc[t]);
  std::fill(dbc, dbc + length * J, T(0));
  accumulate_product(xc, dim, dim, x_proj_t, J, length, dbc);  // dt, B, C = x @ x_proj^T
  // delta = softplus(dt @ dt_proj^T + dt_bias), rank by rank over every step
  for (int64_t t = 0; t < length; ++t) std::copy(dt_bias, dt_bias + dim, delta + t * dim);
  accumulate_product(dbc, J, R, dt_proj_t, dim, length, delta);
#pragma omp simd
  for (int64_t t = 0; t < length * dim; ++t) delta[t] = softplus(delta[t]);
  std::fill(h, h + N * dim, T(0));
  for (int64_t t = 0; t < length; ++t) {  // the scan, state (N, dim), then the D skip and the gate
    const T *d = delta + t * dim, *x = xc + t * dim, *B_t = dbc + t * J + R, *C_t = B_t + N;
    const T* z = xz + row(t) * xz_stride + dim;
    T* out = y + row(t) * y_stride;
    int64_t c = 0;
    for (; c < wide; c += kLanes) scan_channels<kLanes>(c, dim, N, d, x, B_t, C_t, A_t, D, z, h, out);
    for (; c < dim; ++c) scan_channels<1>(c, dim, N, d, x, B_t, C_t, A_t, D, z, h, out);
  }
}

}  // namespace

at::Tensor inner_forward(at::Tensor xz, at::Tensor lengths, at::Tensor conv_w, at::Tensor conv_b, at::Tensor x_proj,
                         at::Tensor dt_proj, at::Tensor dt_bias, at::Tensor A, at::Tensor D) {
  // xz (batch, L, 2 dim dirs); lengths (batch,) int64; per direction (dirs leading): conv_w (dim, K), conv_b (dim),
  // x_proj (R + 2N, dim), dt_proj (dim, R), dt_bias (dim), A (dim, N), D (dim) -> y (batch, L, dim dirs)
  TORCH_CHECK(xz.dim() == 3 && xz.device().is_cpu(), "xz: (batch, L, 2 dim dirs) on the CPU");
  TORCH_CHECK(A.dim() == 3 && (A.size(0) == 1 || A.size(0) == 2), "A: (dirs, dim, N) with dirs 1 or 2");
  const int64_t dirs = A.size(0), dim = A.size(1), N = A.size(2), K = conv_w.size(2), R = dt_proj.size(2);
  const int64_t batch = xz.size(0), L = xz.size(1), J = R + 2 * N;
  TORCH_CHECK(xz.size(2) == 2 * dim * dirs, "xz: last dimension must be 2 dim dirs");
  TORCH_CHECK(conv_w.sizes() == at::IntArrayRef({dirs, dim, K}) && conv_b.sizes() == at::IntArrayRef({dirs, dim}),
              "conv_w (dirs, dim, K), conv_b (dirs, dim)");
  TORCH_CHECK(x_proj.sizes() == at::IntArrayRef({dirs, J, dim}) && dt_proj.sizes() == at::IntArrayRef({dirs, dim, R}),
              "x_proj (dirs, R + 2N, dim), dt_proj (dirs, dim, R)");
  TORCH_CHECK(dt_bias.sizes() == at::IntArrayRef({dirs, dim}) && D.sizes() == at::IntArrayRef({dirs, dim}),
              "dt_bias, D (dirs, dim)");
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch && lengths.scalar_type() == at::kLong,
              "lengths: (batch,) int64");
  TORCH_CHECK(lengths.numel() == 0 || (lengths.min().item<int64_t>() >= 1 && lengths.max().item<int64_t>() <= L),
              "lengths: each must be in [1, L]");
  xz = xz.contiguous();
  auto lengths_c = lengths.contiguous();
  auto y = xz.new_zeros({batch, L, dim * dirs});
  // pre-transposed weights: every inner loop runs over contiguous channels
  auto conv_t = conv_w.transpose(1, 2).contiguous().to(xz.scalar_type());       // (dirs, K, dim)
  auto x_proj_t = x_proj.transpose(1, 2).contiguous().to(xz.scalar_type());     // (dirs, dim, J)
  auto dt_proj_t = dt_proj.transpose(1, 2).contiguous().to(xz.scalar_type());   // (dirs, R, dim)
  auto A_t = A.transpose(1, 2).contiguous().to(xz.scalar_type());               // (dirs, N, dim)
  auto conv_bc = conv_b.contiguous().to(xz.scalar_type()), dt_bc = dt_bias.contiguous().to(xz.scalar_type());
  auto Dc = D.contiguous().to(xz.scalar_type());
  AT_DISPATCH_FLOATING_TYPES(xz.scalar_type(), "mamba_inner_forward", [&] {
    const scalar_t* xz_p = xz.data_ptr<scalar_t>();
    scalar_t* y_p = y.data_ptr<scalar_t>();
    const int64_t* len_p = lengths_c.data_ptr<int64_t>();
    at::parallel_for(0, batch * dirs, 16, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> xc(L * dim), dbc(L * J), delta(L * dim), h(N * dim);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t b = item / dirs, k = item % dirs;
        inner_sequence<scalar_t>(xz_p + b * L * 2 * dim * dirs + k * 2 * dim, 2 * dim * dirs,
                                 y_p + b * L * dim * dirs + k * dim, dim * dirs, len_p[b], k == 1, dim, K, R, N,
                                 conv_t.data_ptr<scalar_t>() + k * K * dim, conv_bc.data_ptr<scalar_t>() + k * dim,
                                 x_proj_t.data_ptr<scalar_t>() + k * dim * J, dt_proj_t.data_ptr<scalar_t>() + k * R * dim,
                                 dt_bc.data_ptr<scalar_t>() + k * dim, A_t.data_ptr<scalar_t>() + k * N * dim,
                                 Dc.data_ptr<scalar_t>() + k * dim, xc.data(), dbc.data(),
                                 delta.data(), h.data());
      }
    });
  });
  return y;
}

}  // namespace trustbeam
