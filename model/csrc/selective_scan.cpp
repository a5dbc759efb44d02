// Selective scan on the CPU: one pass per (batch, channel) with the state in registers.
//
//   h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t      (h: N values per channel)
//   y_t = <C_t, h_t>
//
// Shapes: u, delta (batch, dim, L); A (dim, N); B, C (batch, L, N) -- time-major so the
// state loop reads contiguous memory. D, z gating and the delta bias/softplus are applied by
// the caller (elementwise, autograd). The backward pass recomputes the states of one
// (batch, channel) into a small buffer and runs the adjoint recurrence in reverse.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

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

void check(const torch::Tensor& u, const torch::Tensor& delta, const torch::Tensor& A,
           const torch::Tensor& B, const torch::Tensor& C) {
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

std::vector<torch::Tensor> scan_forward(torch::Tensor u, torch::Tensor delta, torch::Tensor A,
                                        torch::Tensor B, torch::Tensor C) {
  check(u, delta, A, B, C);
  auto y = torch::empty_like(u);
  auto last = torch::empty({u.size(0), u.size(1), A.size(1)}, u.options());
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "selective_scan_forward", [&] {
    forward_kernel<scalar_t>(u.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(),
                             B.data_ptr<scalar_t>(), C.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                             u.size(0), u.size(1), u.size(2), A.size(1), last.data_ptr<scalar_t>());
  });
  return {y, last};
}

std::vector<torch::Tensor> scan_backward(torch::Tensor u, torch::Tensor delta, torch::Tensor A,
                                         torch::Tensor B, torch::Tensor C, torch::Tensor dy) {
  check(u, delta, A, B, C);
  dy = dy.contiguous();
  auto du = torch::empty_like(u), ddelta = torch::empty_like(delta);
  auto dA_part = torch::zeros({u.size(0), u.size(1), A.size(1)}, u.options());
  auto dB = torch::zeros_like(B), dC = torch::zeros_like(C);
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "selective_scan_backward", [&] {
    backward_kernel<scalar_t>(u.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(),
                              B.data_ptr<scalar_t>(), C.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                              du.data_ptr<scalar_t>(), ddelta.data_ptr<scalar_t>(), dA_part.data_ptr<scalar_t>(),
                              dB.data_ptr<scalar_t>(), dC.data_ptr<scalar_t>(),
                              u.size(0), u.size(1), u.size(2), A.size(1));
  });
  return {du, ddelta, dA_part.sum(0), dB, dC};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &scan_forward, "selective scan forward: (y, last state)");
  m.def("backward", &scan_backward, "selective scan backward: (du, ddelta, dA, dB, dC)");
}
