// Fused elementwise ops of the decoder layer (ops.cpp) and ragged attention (attention.cpp), registered on specdec._C beside the linear kernels.
#pragma once
#include <torch/extension.h>

namespace specdec {

// Calls fn(T*, B*) with null pointers whose types name the element type: T is the tensor's C++ type (float or
// c10::BFloat16), B its bits as the vector kernels read them (float or uint16_t). Any other dtype is an error.
template <typename F>
void dispatch_float_bf16(at::ScalarType dtype, const char* what, F&& fn) {
    if (dtype == at::kFloat)
        fn(static_cast<float*>(nullptr), static_cast<float*>(nullptr));
    else if (dtype == at::kBFloat16)
        fn(static_cast<c10::BFloat16*>(nullptr), static_cast<uint16_t*>(nullptr));
    else
        TORCH_CHECK(false, what, ": float32 or bfloat16, got ", dtype);
}

// The path silu_mul and ragged_attention take (an OpsImpl of vec_math.h): for impl 0 the best this CPU runs, else
// the one asked for (an error if the CPU lacks it); scalar when the data do not fit that path's vectors
// (width16: a multiple of 16 lanes, width8: of 8).
int ops_path(int64_t impl, bool width16, bool width8, const char* what);

void register_ops(pybind11::module_& m);
void register_attention(pybind11::module_& m);   // attention.cpp
void register_bf16_linear(pybind11::module_& m);   // bf16_linear.cpp
void register_stack(pybind11::module_& m);   // stack.cpp
void register_cpu_allocator(pybind11::module_& m);   // cpu_allocator.cpp
}
