// Fused elementwise ops of the decoder layer (ops.cpp) and ragged attention (attention.cpp), registered on specdec._C beside the linear kernels.
#pragma once
#include <torch/extension.h>

namespace specdec {
void register_ops(pybind11::module_& m);
void register_attention(pybind11::module_& m);   // attention.cpp
}
