// The decoder layers of a Qwen2 / Llama / Mistral model with block-quantized linears, as one call per forward.
//
// Each layer is the same sequence of calls the Python modules make (residual + RMSNorm, the fused qkv linear,
// rotary embedding, ragged attention, o_proj, RMSNorm, gate_up, SiLU-and-multiply, down), to the same functions of
// this extension with the same arguments, so every row gets the same bits. What the loop saves is what surrounds
// them in Python: ~10 module calls, wrappers and argument conversions per layer, and, larger on a CPU whose caches
// the weight stream flushes every layer, the interpreter's and dispatcher's own data brought back each time (what that
// cost a one-token step: docs/benchmarks/fused-stack).
//
// Included into torch_ops.cpp after bindings.cpp, ops.cpp and attention.cpp: their anonymous namespace is this one.
#include <torch/extension.h>

#include <tuple>
#include <vector>

#include "ops.h"

namespace {

// One BlockQuantLinear: its packed codes and scales, bias (fp32, padded) and true output width.
struct StackLinear {
    torch::Tensor qw, sc, mn, dm;
    c10::optional<torch::Tensor> bias;
    int64_t bits, group, sb, out_features;

    torch::Tensor operator()(const torch::Tensor& x) const {
        torch::Tensor y = qlinear(x, qw, sc, mn, dm, bias, bits, group, sb, 0);
        return y.size(1) == out_features ? y : y.narrow(1, 0, out_features);   // the kernel pads to 16 columns
    }
};

struct StackLayer {
    torch::Tensor input_norm, post_norm;   // RMSNorm weights, in the activations' dtype
    StackLinear qkv, o, gate_up, down;
    int64_t window;                        // sliding window of this layer's attention (0: every key)
};

class DecoderStack {
public:
    DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps)
        : hq_(num_heads), hkv_(num_kv_heads), d_(head_dim), eps_(eps) {}

    void add_layer(torch::Tensor input_norm, torch::Tensor post_norm, StackLinear qkv, StackLinear o,
                   StackLinear gate_up, StackLinear down, int64_t window) {
        TORCH_CHECK(qkv.out_features == (hq_ + 2 * hkv_) * d_ && o.out_features == input_norm.numel(),
                    "DecoderStack: the layer's linears do not match its heads");
        layers_.push_back({input_norm.contiguous(), post_norm.contiguous(), std::move(qkv), std::move(o),
                           std::move(gate_up), std::move(down), window});
    }

    int64_t size() const { return int64_t(layers_.size()); }

    // x: [N, hidden] (the embeddings); positions [N] int64; cos, sin: [P, D] fp32; then the attention metadata as
    // AttnMetadata.per_seq_lists gives it. Returns (x, residual) after the last layer (its MLP output and the
    // running hidden state, for the final norm) and, per index in aux_layers, the input of that layer (x +
    // residual), as Transformer.forward collects them.
    std::tuple<torch::Tensor, torch::Tensor, std::vector<torch::Tensor>> forward(
            torch::Tensor x, const torch::Tensor& positions, const torch::Tensor& cos, const torch::Tensor& sin,
            const std::vector<torch::Tensor>& k_caches, const std::vector<torch::Tensor>& v_caches,
            const std::vector<int64_t>& starts, const std::vector<int64_t>& counts,
            const std::vector<int64_t>& run_seq, const std::vector<int64_t>& run_row,
            const std::vector<int64_t>& run_rows, const std::vector<int64_t>& run_keys,
            const std::vector<c10::optional<torch::Tensor>>& run_masks, const std::vector<bool>& run_decode,
            const std::vector<c10::optional<torch::Tensor>>& run_trees, const std::vector<int64_t>& aux_layers) {
        TORCH_CHECK(x.dim() == 2, "DecoderStack: x must be [N, hidden]");
        const int64_t n = x.size(0), q_size = hq_ * d_, kv_size = hkv_ * d_;
        std::vector<torch::Tensor> aux;
        torch::Tensor residual;   // undefined before the first layer: its norm takes x itself as the residual
        for (int64_t i = 0; i < size(); ++i) {
            const StackLayer& layer = layers_[i];
            for (int64_t a : aux_layers)
                if (a == i) aux.push_back(residual.defined() ? x + residual : x.clone());
            x = x.contiguous();
            torch::Tensor h;
            if (residual.defined()) {
                h = rms_norm(x, layer.input_norm, eps_, residual);
            } else {
                h = rms_norm(x, layer.input_norm, eps_, c10::nullopt);
                residual = x;
            }
            torch::Tensor qkv = layer.qkv(h).contiguous();
            rope_(qkv, positions, cos, sin, hq_, hkv_, d_);
            torch::Tensor q = qkv.narrow(1, 0, q_size).view({n, hq_, d_});
            torch::Tensor k = qkv.narrow(1, q_size, kv_size).view({n, hkv_, d_});
            torch::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({n, hkv_, d_});
            torch::Tensor att = ragged_attention(q, k, v, k_caches, v_caches, i, starts, counts, run_seq, run_row,
                                                 run_rows, run_keys, run_masks, run_decode, run_trees, 0,
                                                 layer.window);
            h = layer.o(att).contiguous();
            h = rms_norm(h, layer.post_norm, eps_, residual);
            x = layer.down(silu_mul(layer.gate_up(h).contiguous(), 0));
        }
        return {x, residual, aux};
    }

private:
    std::vector<StackLayer> layers_;
    int64_t hq_, hkv_, d_;
    double eps_;
};

}  // namespace

namespace specdec {

void register_stack(pybind11::module_& m) {
    pybind11::class_<StackLinear>(m, "StackLinear")
        .def(pybind11::init([](torch::Tensor qw, torch::Tensor sc, torch::Tensor mn, torch::Tensor dm,
                               c10::optional<torch::Tensor> bias, int64_t bits, int64_t group, int64_t sb,
                               int64_t out_features) {
                 return StackLinear{qw, sc, mn, dm, bias, bits, group, sb, out_features};
             }),
             pybind11::arg("qw"), pybind11::arg("sc"), pybind11::arg("mn"), pybind11::arg("dm"), pybind11::arg("bias"),
             pybind11::arg("bits"), pybind11::arg("group"), pybind11::arg("sb"), pybind11::arg("out_features"));
    pybind11::class_<DecoderStack>(m, "DecoderStack")
        .def(pybind11::init<int64_t, int64_t, int64_t, double>(), pybind11::arg("num_heads"),
             pybind11::arg("num_kv_heads"), pybind11::arg("head_dim"), pybind11::arg("eps"))
        .def("add_layer", &DecoderStack::add_layer, pybind11::arg("input_norm"), pybind11::arg("post_norm"),
             pybind11::arg("qkv"), pybind11::arg("o"), pybind11::arg("gate_up"), pybind11::arg("down"),
             pybind11::arg("window") = 0)
        .def("__len__", &DecoderStack::size)
        .def("forward", &DecoderStack::forward,
             "the layers over a ragged batch: (x, residual, the inputs of aux_layers)", pybind11::arg("x"),
             pybind11::arg("positions"), pybind11::arg("cos"), pybind11::arg("sin"), pybind11::arg("k_caches"),
             pybind11::arg("v_caches"), pybind11::arg("starts"), pybind11::arg("counts"), pybind11::arg("run_seq"),
             pybind11::arg("run_row"), pybind11::arg("run_rows"), pybind11::arg("run_keys"),
             pybind11::arg("run_masks"), pybind11::arg("run_decode"), pybind11::arg("run_trees"),
             pybind11::arg("aux_layers"));
}

}  // namespace specdec
