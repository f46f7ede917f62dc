// Fused elementwise steps of a decoder layer on CPU: residual add + RMSNorm, and rotary embedding of the
// q and k parts of a fused qkv projection, in place.
//
// In eager PyTorch each of these is 8-20 small ops (casts, pow, mean, rsqrt, slices, cat, mul, add), and
// a one-token decode step of a 28-layer model spends milliseconds dispatching them. Here each is one call.
// Every row is computed on its own, in a fixed order (batch invariance: a row's result does not depend on
// how many rows share the call), with the roundings eager PyTorch does: fp32 arithmetic, then one rounding
// to the tensor's dtype where the eager code rounds.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cmath>

#include "ops.h"
#include "vec_math.h"

namespace {

template <typename T>
inline float f32(T v) { return static_cast<float>(v); }

template <typename T>
inline float round_to(float v) { return static_cast<float>(static_cast<T>(v)); }   // T's rounding, back as fp32

// One row of `residual += x` (when add) then `out = w * norm(residual)`.
template <typename T>
void rms_norm_row(const T* x, T* res, const T* w, T* out, int64_t h, float eps, bool add) {
    const T* src = x;
    if (add) {
        for (int64_t i = 0; i < h; ++i) res[i] = static_cast<T>(f32(x[i]) + f32(res[i]));
        src = res;
    }
    double ss = 0.0;   // exact enough that the order of the sum does not matter for the fp32 result
    for (int64_t i = 0; i < h; ++i) {
        const double v = f32(src[i]);
        ss += v * v;
    }
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / double(h)) + eps);
    for (int64_t i = 0; i < h; ++i) out[i] = static_cast<T>(f32(w[i]) * round_to<T>(f32(src[i]) * inv));
}

#ifdef SPECDEC_HAVE_AVX512
// rms_norm_row, 16 lanes at a time (h a multiple of 16; B: float or bf16 bits): the same fp32 sum and bf16 rounding
// per element for the residual and the output. The squares are summed in double, as there: each is exact (a square of
// an fp32 value fits a double's mantissa), the sum is taken over two lanes of 8 and then one fixed order, where the
// scalar loop chained all h of them (~6,000 cycles a row of 1,536 on one double add's latency: a prompt chunk's norms
// were 3.4% of it). Only the order of those double additions differs, which does not reach the fp32 result in
// practice; a row's bits still depend on that row alone.
template <typename B>
SPECDEC_AVX512F void rms_norm_row_avx512(const B* x, B* res, const B* w, B* out, int64_t h, float eps, bool add) {
    const B* src = x;
    if (add) {
        for (int64_t i = 0; i < h; i += 16) specdec::vstore(res + i, _mm512_add_ps(specdec::vload(x + i), specdec::vload(res + i)));
        src = res;
    }
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < h; i += 16) {
        const __m512 v = specdec::vload(src + i);
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0);   // the product is exact: one rounding, as ss += v * v
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    const double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(static_cast<float>(ss / double(h)) + eps));
    for (int64_t i = 0; i < h; i += 16) {
        const __m512 normed = specdec::round_like(_mm512_mul_ps(specdec::vload(src + i), inv), src);
        specdec::vstore(out + i, _mm512_mul_ps(specdec::vload(w + i), normed));
    }
}
#endif

// rows [N, hidden]; residual: optional [N, hidden], updated in place to x + residual.
// Returns w * x / rms(x) (of the updated residual when one is given), in x's dtype.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                       const c10::optional<torch::Tensor>& residual) {
    TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous(), "rms_norm: x must be a contiguous 2-D CPU tensor");
    TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.is_contiguous() && weight.numel() == x.size(1),
                "rms_norm: weight must match x's dtype and width");
    const bool add = residual.has_value() && residual->defined();
    if (add)
        TORCH_CHECK(residual->scalar_type() == x.scalar_type() && residual->is_contiguous() &&
                    residual->sizes() == x.sizes(), "rms_norm: residual must match x");
    const int64_t n = x.size(0), h = x.size(1);
    auto out = torch::empty_like(x);
    AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, x.scalar_type(), "rms_norm", [&] {
        const scalar_t* xp = x.data_ptr<scalar_t>();
        const scalar_t* wp = weight.data_ptr<scalar_t>();
        scalar_t* rp = add ? residual->data_ptr<scalar_t>() : nullptr;
        scalar_t* op = out.data_ptr<scalar_t>();
#ifdef SPECDEC_HAVE_AVX512
        if (h % 16 == 0 && specdec::cpu_has_avx512f()) {
            using B = std::conditional_t<std::is_same_v<scalar_t, float>, float, uint16_t>;   // bf16 as its bits
            if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, at::BFloat16>) {
                at::parallel_for(0, n, 64, [&](int64_t r0, int64_t r1) {
                    for (int64_t r = r0; r < r1; ++r)
                        rms_norm_row_avx512<B>(reinterpret_cast<const B*>(xp + r * h),
                                               add ? reinterpret_cast<B*>(rp + r * h) : nullptr,
                                               reinterpret_cast<const B*>(wp), reinterpret_cast<B*>(op + r * h), h,
                                               float(eps), add);
                });
                return;
            }
        }
#endif
        at::parallel_for(0, n, 64, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r)
                rms_norm_row<scalar_t>(xp + r * h, add ? rp + r * h : nullptr, wp, op + r * h, h, float(eps), add);
        });
    });
    return out;
}

// qkv: [N, (Hq + 2 Hkv) * D], rotated in place for its first Hq + Hkv heads (q, then k), NeoX half-split
// layout: for i < D/2, (a, b) = (x[i], x[i + D/2]) -> (a cos_i - b sin_i, b cos_{i+D/2} + a sin_{i+D/2}).
// cos, sin: [P, D] fp32 tables; positions: [N] int64, each < P.
void rope_(torch::Tensor& qkv, const torch::Tensor& positions, const torch::Tensor& cos, const torch::Tensor& sin,
           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
    TORCH_CHECK(qkv.device().is_cpu() && qkv.dim() == 2 && qkv.is_contiguous(), "rope_: qkv must be a contiguous 2-D CPU tensor");
    TORCH_CHECK(qkv.size(1) == (num_heads + 2 * num_kv_heads) * head_dim && head_dim % 2 == 0,
                "rope_: qkv width does not match the heads");
    TORCH_CHECK(positions.scalar_type() == torch::kLong && positions.numel() == qkv.size(0), "rope_: one int64 position per row");
    TORCH_CHECK(cos.scalar_type() == torch::kFloat && sin.scalar_type() == torch::kFloat && cos.is_contiguous() &&
                sin.is_contiguous() && cos.dim() == 2 && cos.size(1) == head_dim && sin.sizes() == cos.sizes(),
                "rope_: cos/sin must be contiguous fp32 [positions, head_dim]");
    const int64_t n = qkv.size(0), width = qkv.size(1), heads = num_heads + num_kv_heads, half = head_dim / 2;
    const int64_t* pos = positions.data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r)
        TORCH_CHECK(pos[r] >= 0 && pos[r] < cos.size(0), "rope_: position ", pos[r], " outside the table");
    AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, qkv.scalar_type(), "rope_", [&] {
        scalar_t* base = qkv.data_ptr<scalar_t>();
        const float* cp = cos.data_ptr<float>();
        const float* sp = sin.data_ptr<float>();
        at::parallel_for(0, n, 32, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
                const float* c = cp + pos[r] * head_dim;
                const float* s = sp + pos[r] * head_dim;
                for (int64_t hd = 0; hd < heads; ++hd) {
                    scalar_t* x = base + r * width + hd * head_dim;
                    for (int64_t i = 0; i < half; ++i) {
                        const float a = f32(x[i]), b = f32(x[i + half]);
                        // the eager code's order: x * cos + rotate_half(x) * sin, each product rounded in fp32
                        const float lo = a * c[i] + (-b) * s[i];
                        const float hi = b * c[i + half] + a * s[i + half];
                        x[i] = static_cast<scalar_t>(lo);
                        x[i + half] = static_cast<scalar_t>(hi);
                    }
                }
            }
        });
    });
}

// out[r, i] = silu(x[r, i]) * x[r, I + i] for x = [gate | up] of width 2I; silu rounded to the dtype first, as
// eager F.silu(gate) * up rounds it.
template <typename T>
void silu_mul_scalar(const T* x, T* out, int64_t n, int64_t inter) {
    for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < inter; ++i) {
            const float g = f32(x[r * 2 * inter + i]);
            const float s = round_to<T>(g / (1.0f + std::exp(-g)));
            out[r * inter + i] = static_cast<T>(s * f32(x[r * 2 * inter + inter + i]));
        }
}

#ifdef SPECDEC_HAVE_AVX512
template <typename B>
SPECDEC_AVX512F void silu_mul_avx512(const B* x, B* out, int64_t n, int64_t inter) {
    using specdec::round_like;
    using specdec::vexp;
    using specdec::vload;
    using specdec::vstore;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t r = 0; r < n; ++r) {
        const B* g = x + r * 2 * inter;
        const B* u = g + inter;
        B* o = out + r * inter;
        for (int64_t i = 0; i < inter; i += 16) {
            const __m512 gv = vload(g + i);
            // g / (1 + e^-g); e^-g overflows to inf for g < -88.7, giving -0 as silu does
            const __m512 sv = round_like(_mm512_div_ps(gv, _mm512_add_ps(one, vexp(_mm512_sub_ps(_mm512_setzero_ps(), gv)))), g);
            vstore(o + i, _mm512_mul_ps(sv, vload(u + i)));
        }
    }
}

namespace v2 = specdec::avx2;

template <typename B>   // the same over 8 lanes
SPECDEC_AVX2F void silu_mul_avx2(const B* x, B* out, int64_t n, int64_t inter) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t r = 0; r < n; ++r) {
        const B* g = x + r * 2 * inter;
        const B* u = g + inter;
        B* o = out + r * inter;
        for (int64_t i = 0; i < inter; i += 8) {
            const __m256 gv = v2::vload(g + i);
            const __m256 sv = v2::round_like(_mm256_div_ps(gv, _mm256_add_ps(one, v2::vexp(_mm256_sub_ps(_mm256_setzero_ps(), gv)))), g);
            v2::vstore(o + i, _mm256_mul_ps(sv, v2::vload(u + i)));
        }
    }
}
#endif

}  // namespace

namespace specdec {

int ops_path(int64_t impl, bool width16, bool width8, const char* what) {
    TORCH_CHECK(impl >= 0 && impl <= 3, what, ": impl is 0 (auto), 1 (scalar), 2 (AVX-512) or 3 (AVX2)");
#ifdef SPECDEC_HAVE_AVX512
    const bool has512 = specdec::cpu_has_avx512f(), has2 = specdec::cpu_has_avx2();
#else
    const bool has512 = false, has2 = false;
#endif
    TORCH_CHECK(impl != specdec::kOpsAvx512 || has512, what, ": this CPU lacks AVX-512");
    TORCH_CHECK(impl != specdec::kOpsAvx2 || has2, what, ": this CPU lacks AVX2 with FMA");
    if (impl == specdec::kOpsAuto) impl = has512 && width16 ? specdec::kOpsAvx512 : has2 && width8 ? specdec::kOpsAvx2 : specdec::kOpsScalar;
    if ((impl == specdec::kOpsAvx512 && !width16) || (impl == specdec::kOpsAvx2 && !width8)) impl = specdec::kOpsScalar;
    return int(impl);
}

}  // namespace specdec

namespace {

using specdec::ops_path;

torch::Tensor silu_mul(const torch::Tensor& x, int64_t impl) {
    TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() && x.size(1) % 2 == 0,
                "silu_mul: x must be a contiguous 2-D CPU tensor [N, 2 * intermediate]");
    const int64_t n = x.size(0), inter = x.size(1) / 2;
    auto out = torch::empty({n, inter}, x.options());
    const int path = ops_path(impl, inter % 16 == 0, inter % 8 == 0, "silu_mul");
    specdec::dispatch_float_bf16(x.scalar_type(), "silu_mul", [&](auto* tag, auto* bits) {
        using T = std::remove_pointer_t<decltype(tag)>;
        using B = std::remove_pointer_t<decltype(bits)>;
        const T* xp = x.data_ptr<T>();
        T* op = out.data_ptr<T>();
        at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
#ifdef SPECDEC_HAVE_AVX512
            if (path == specdec::kOpsAvx512) {
                silu_mul_avx512<B>(reinterpret_cast<const B*>(xp + r0 * 2 * inter), reinterpret_cast<B*>(op + r0 * inter),
                                   r1 - r0, inter);
                return;
            }
            if (path == specdec::kOpsAvx2) {
                silu_mul_avx2<B>(reinterpret_cast<const B*>(xp + r0 * 2 * inter), reinterpret_cast<B*>(op + r0 * inter),
                                 r1 - r0, inter);
                return;
            }
#endif
            silu_mul_scalar<T>(xp + r0 * 2 * inter, op + r0 * inter, r1 - r0, inter);
        });
    });
    return out;
}

}  // namespace

namespace specdec {

void register_ops(pybind11::module_& m) {
    m.def("rms_norm", &rms_norm, "w * x / rms(x) per row; with residual: residual += x first (in place), normalised",
          pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("eps"), pybind11::arg("residual") = pybind11::none());
    m.def("silu_mul", &silu_mul, "silu(gate) * up of a fused [gate | up] row", pybind11::arg("x"),
          pybind11::arg("impl") = 0);
    m.def("ops_path", [](int64_t impl, bool width16, bool width8) { return ops_path(impl, width16, width8, "ops_path"); },
          "the path (1 scalar, 2 AVX-512, 3 AVX2) silu_mul and ragged_attention take for impl (0 auto), given whether "
          "the data fit 16- and 8-lane vectors", pybind11::arg("impl"), pybind11::arg("width16") = true,
          pybind11::arg("width8") = true);
    m.def("rope_", &rope_, "rotary embedding of the q and k heads of a fused qkv row, in place", pybind11::arg("qkv"),
          pybind11::arg("positions"), pybind11::arg("cos"), pybind11::arg("sin"), pybind11::arg("num_heads"),
          pybind11::arg("num_kv_heads"), pybind11::arg("head_dim"));
}

}  // namespace specdec
