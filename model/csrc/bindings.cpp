// The Python module of the CPU extension: binds the kernels kernels.h declares. The only file that includes
// PyTorch's Python headers (the slowest to compile), so the kernels' files build beside it.
#include <torch/csrc/utils/pybind.h>

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Every kernel lets go of the interpreter while it runs (it touches no Python object), as PyTorch's operators
  // do: a slot's pieces scored on threads of one process (model.scoring.score_pieces) then compute at once.
  using release = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("forward", &trustbeam::scan_forward, "selective scan forward: (y, last state)", release());
  m.def("backward", &trustbeam::scan_backward, "selective scan backward: (du, ddelta, dA, dB, dC)", release());
  m.def("inner_forward", &trustbeam::inner_forward,
        "fused Mamba block inference between in_proj and out_proj, 1 or 2 directions", release());
  m.def("pair_mlp", &trustbeam::pair_mlp, "a ReLU MLP per pair, first-layer rows gathered (the context head's networks)",
        release());
}
