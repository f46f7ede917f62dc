// One translation unit for the sources that include <torch/extension.h>: parsing those headers is most of their
// compile time (tens of seconds per file), so they are compiled together, once, while the header-light kernels
// (qlinear_*.cpp) compile beside them on the other cores (setup.py). The files keep their own anonymous
// namespaces; nothing here but the includes.
#include "bindings.cpp"
#include "ops.cpp"
#include "attention.cpp"
#include "bf16_linear.cpp"
#include "stack.cpp"
#include "cpu_allocator.cpp"
