// bf16 linear for a few rows (decode steps, verification rows, draft steps) with AVX-512 BF16 (vdpbf16ps), and
// with AVX2 + FMA on CPUs without it (below).
//
// Why: oneDNN's packed bf16 matmul streams the weights at the machine's read bandwidth for 1-6 rows, but past
// 6 rows it switches blocking and a forward costs ~30% more (measured on the 1.5B's linears: 102 ms at 6 rows,
// 134 ms at 8). A decode step of 8 sequences is exactly that case. More than 12 rows go in tiles that re-read
// each 128 KB chunk of weights from L2.
//
// Layout (packed once at load time, see models/packed_linear.py): the weight [N, K] in super-blocks of 32 output
// columns, [N/32, K/2, 32, 2] bf16: for one super-block and one pair of k, 128 contiguous bytes = two zmm, each
// 16 columns x (k, k+1), the operand shape of vdpbf16ps. N is zero-padded to a multiple of 32. A tile of up to
// 12 rows holds its 24 accumulators in registers, so a call of up to 12 rows reads each weight byte once, in one
// contiguous sweep, while the arithmetic overlaps the reads.
//
// Batch invariance by construction: every output is accumulated in fp32 over k pairs 0, 1, ..., K/2-1 in that
// order in one register (spilled to memory, exactly, between k chunks), then the bias is added and the result
// rounded to bf16 (nearest even). No step depends on the number of rows, their tile, or the thread: a row's
// output is the same bits alone or inside any batch.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "ops.h"
#include "qlinear.h"
#include "vec_math.h"

#if defined(SPECDEC_HAVE_AVX512)
namespace {

using specdec::cpu_has_avx512_bf16;

typedef int32_t __attribute__((may_alias, aligned(1))) i32u;

constexpr int64_t COLS = 32;     // columns per super-block: two zmm of 16 columns x (k, k+1)
constexpr int64_t KC = 1024;     // k pairs per chunk: 1024 x 128 B = 128 KB of weights, re-read from L2 by row tiles
constexpr int MAX_TILE = 12;     // 12 rows x 2 accumulators + 2 weight registers + 1 broadcast <= 32 zmm
constexpr int64_t PREFETCH = 2048;

// Rows [0, R) of x (row stride K) against one super-block w ([K/2][32][2]) over k pairs [kp0, kp1); part: [R][32]
// fp32 partial sums (read unless first, always written).
template <int R>
SPECDEC_AVX512BF16 void tile(const uint16_t* w, const uint16_t* x, int64_t K, int64_t kp0, int64_t kp1, float* part,
                             bool first) {
    __m512 acc[R][2];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        acc[r][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(part + r * COLS);
        acc[r][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(part + r * COLS + 16);
    }
    const i32u* xr = reinterpret_cast<const i32u*>(x);     // pair kp of row r: xr[r * K / 2 + kp]
    const int64_t ks = K / 2;
    for (int64_t kp = kp0; kp < kp1; ++kp) {
        const uint16_t* wk = w + kp * 64;
        _mm_prefetch(reinterpret_cast<const char*>(wk) + PREFETCH, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(wk) + PREFETCH + 64, _MM_HINT_T0);
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wk), w1 = (__m512bh)_mm512_loadu_si512(wk + 32);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(xr[r * ks + kp]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, w1);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        _mm512_storeu_ps(part + r * COLS, acc[r][0]);
        _mm512_storeu_ps(part + r * COLS + 16, acc[r][1]);
    }
}

template <int... Rs>
SPECDEC_AVX512BF16 void run_tile_impl(int rows, const uint16_t* w, const uint16_t* x, int64_t K, int64_t kp0,
                                      int64_t kp1, float* part, bool first, std::integer_sequence<int, Rs...>) {
    ((rows == Rs + 1 ? (tile<Rs + 1>(w, x, K, kp0, kp1, part, first), 0) : 0), ...);
}

SPECDEC_AVX512BF16 void run_tile(int rows, const uint16_t* w, const uint16_t* x, int64_t K, int64_t kp0, int64_t kp1,
                                 float* part, bool first) {
    run_tile_impl(rows, w, x, K, kp0, kp1, part, first, std::make_integer_sequence<int, MAX_TILE>{});
}

// out[M, N] bf16 for super-blocks [b0, b1)
SPECDEC_AVX512BF16 void kernel(const uint16_t* packed, const uint16_t* x, const float* bias, uint16_t* out, int64_t M,
                               int64_t K, int64_t N, int64_t b0, int64_t b1) {
    const int64_t KP = K / 2, tiles = (M + MAX_TILE - 1) / MAX_TILE;
    std::vector<float> part(M * COLS);
    for (int64_t b = b0; b < b1; ++b) {
        const uint16_t* w = packed + b * KP * 2 * COLS;
        for (int64_t kc = 0; kc < KP; kc += KC) {
            int64_t r0 = 0;
            for (int64_t t = 0; t < tiles; ++t) {   // balanced tiles (13 rows: 7 + 6); a row's arithmetic never
                                                    // depends on its tile
                const int rows = int((M - r0) / (tiles - t) + ((M - r0) % (tiles - t) ? 1 : 0));
                run_tile(rows, w, x + r0 * K, K, kc, std::min(KP, kc + KC), part.data() + r0 * COLS, kc == 0);
                r0 += rows;
            }
        }
        for (int j = 0; j < 2; ++j) {
            const int64_t col = b * COLS + 16 * j;
            if (col >= N) break;
            const __mmask16 keep = N - col >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (N - col)) - 1);
            const __m512 bv = bias ? _mm512_maskz_loadu_ps(keep, bias + col) : _mm512_setzero_ps();
            for (int64_t r = 0; r < M; ++r) {
                const __m512 v = _mm512_add_ps(_mm512_loadu_ps(part.data() + r * COLS + 16 * j), bv);
                _mm256_mask_storeu_epi16(out + r * N + col, keep, _mm512_cvtepi32_epi16(specdec::bf16_round_bits(v)));
            }
        }
    }
}

// ---- AVX2 + FMA (CPUs without AVX-512 BF16: AMD Zen 2/3, Intel client cores) -------------------------------
// The same packed layout: per k pair, 128 bytes = four ymm of 8 columns x (k, k+1). A bf16 pair in a 32-bit lane
// gives both fp32 weights exactly: k is the low half shifted up, k+1 the lane with its low half cleared. A tile of
// up to 2 rows keeps 4 accumulators a row (32 columns) in registers; each output is accumulated in fp32 over
// k = 0, 1, ..., K-1 in order (an FMA a k), spilled exactly between chunks, then the bias is added and the result
// rounded to bf16. Nothing depends on the rows' count, tile or thread: batch invariant as the AVX-512 kernel is.
#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))

// AVX2 with FMA (and F16C): specdec::cpu_has_avx2, the question the AVX2 block kernel asks too
using specdec::cpu_has_avx2;

constexpr int MAX_TILE2 = 2;     // 2 rows x 4 accumulators + 4 broadcasts + 3 weight registers + 1 mask <= 16 ymm

// Rows [0, R) of xf (fp32, row stride K) against one super-block w ([K/2][32][2]) over k pairs [kp0, kp1);
// part: [R][32] fp32 partial sums (read unless first, always written).
template <int R>
SPECDEC_AVX2 void tile2(const uint16_t* w, const float* xf, int64_t K, int64_t kp0, int64_t kp1, float* part,
                        bool first) {
    __m256 acc[R][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < 4; ++c)
            acc[r][c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(part + r * COLS + 8 * c);
    const __m256i high = _mm256_set1_epi32(int32_t(0xFFFF0000u));
    for (int64_t kp = kp0; kp < kp1; ++kp) {
        const uint16_t* wk = w + kp * 64;
        _mm_prefetch(reinterpret_cast<const char*>(wk) + PREFETCH, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(wk) + PREFETCH + 64, _MM_HINT_T0);
        __m256 xe[R], xo[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            xe[r] = _mm256_broadcast_ss(xf + r * K + 2 * kp);
            xo[r] = _mm256_broadcast_ss(xf + r * K + 2 * kp + 1);
        }
#pragma GCC unroll 8
        for (int c = 0; c < 4; ++c) {
            const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk + 16 * c));
            const __m256 e = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
            const __m256 o = _mm256_castsi256_ps(_mm256_and_si256(b, high));
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                acc[r][c] = _mm256_fmadd_ps(xe[r], e, acc[r][c]);
                acc[r][c] = _mm256_fmadd_ps(xo[r], o, acc[r][c]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < 4; ++c) _mm256_storeu_ps(part + r * COLS + 8 * c, acc[r][c]);
}

// out[M, N] bf16 for super-blocks [b0, b1), rows read from xf (fp32)
SPECDEC_AVX2 void kernel2(const uint16_t* packed, const float* xf, const float* bias, uint16_t* out, int64_t M,
                          int64_t K, int64_t N, int64_t b0, int64_t b1) {
    const int64_t KP = K / 2;
    std::vector<float> part(M * COLS);
    for (int64_t b = b0; b < b1; ++b) {
        const uint16_t* w = packed + b * KP * 2 * COLS;
        for (int64_t kc = 0; kc < KP; kc += KC) {
            const int64_t kend = std::min(KP, kc + KC);
            for (int64_t r0 = 0; r0 < M; r0 += MAX_TILE2) {
                if (M - r0 >= 2)
                    tile2<2>(w, xf + r0 * K, K, kc, kend, part.data() + r0 * COLS, kc == 0);
                else
                    tile2<1>(w, xf + r0 * K, K, kc, kend, part.data() + r0 * COLS, kc == 0);
            }
        }
        for (int64_t c = 0; c < COLS && b * COLS + c < N; ++c) {
            const int64_t col = b * COLS + c;
            const float bv = bias ? bias[col] : 0.f;
            for (int64_t r = 0; r < M; ++r) out[r * N + col] = c10::BFloat16(part[r * COLS + c] + bv).x;
        }
    }
}

// x [M, K] bf16 @ W^T (+ bias) -> [M, N] bf16; packed: [ceil(N/32), K/2, 32, 2] bf16 (see the layout above)
// impl: 0 = the best this CPU runs, 1 = AVX-512 BF16, 2 = AVX2 + FMA (1 and 2: an error on a CPU without it)
torch::Tensor linear_bf16(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& bias,
                          int64_t n, int64_t impl) {
    TORCH_CHECK(impl >= 0 && impl <= 2, "linear_bf16: impl is 0, 1 or 2");
    TORCH_CHECK(impl != 1 || cpu_has_avx512_bf16(), "linear_bf16: this CPU lacks AVX-512 BF16");
    TORCH_CHECK(impl != 2 || cpu_has_avx2(), "linear_bf16: this CPU lacks AVX2 with FMA");
    const bool avx512 = impl == 1 || (impl == 0 && cpu_has_avx512_bf16());
    TORCH_CHECK(avx512 || cpu_has_avx2(), "linear_bf16: this CPU lacks both AVX-512 BF16 and AVX2 with FMA");
    TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.scalar_type() == torch::kBFloat16,
                "linear_bf16: x must be a 2-D bf16 CPU tensor");
    TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == torch::kBFloat16 && packed.is_contiguous() &&
                packed.size(2) == COLS && packed.size(3) == 2, "linear_bf16: bad packed weight");
    const int64_t M = x.size(0), K = x.size(1), NB = packed.size(0);
    TORCH_CHECK(packed.size(1) * 2 == K, "linear_bf16: x has ", K, " features, the packed weight ", packed.size(1) * 2);
    TORCH_CHECK(n > (NB - 1) * COLS && n <= NB * COLS, "linear_bf16: n does not match the packed weight");
    const torch::Tensor xc = x.contiguous();
    torch::Tensor b;
    if (bias.has_value() && bias->defined()) {
        b = bias->to(torch::kFloat32).contiguous();
        TORCH_CHECK(b.numel() == n, "linear_bf16: bias has ", b.numel(), " entries, expected ", n);
    }
    auto out = torch::empty({M, n}, x.options());
    if (M == 0) return out;
    {
        pybind11::gil_scoped_release no_gil;
        const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
        const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
        auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
        const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
        // threads split the super-blocks; a column's arithmetic is the same whoever computes it
        if (avx512) {
            at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) { kernel(wp, xp, bp, op, M, K, n, b0, b1); });
        } else {
            std::vector<float> xf(M * K);              // the rows in fp32 once (exact), read as broadcasts
            for (int64_t i = 0; i < M * K; ++i) xf[i] = specdec::to_float(xp[i]);
            at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) { kernel2(wp, xf.data(), bp, op, M, K, n, b0, b1); });
        }
    }
    return out;
}

}  // namespace

namespace specdec {
void register_bf16_linear(pybind11::module_& m) {
    m.def("linear_bf16", &linear_bf16, "y[M, n] bf16 = x[M, K] bf16 @ W^T (+ bias), W packed [N/32, K/2, 32, 2]",
          pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("bias"), pybind11::arg("n"),
          pybind11::arg("impl") = 0);
    m.def("has_avx512_bf16", &cpu_has_avx512_bf16, "the CPU runs the AVX-512 BF16 linear");
    m.def("has_bf16_linear", []() { return cpu_has_avx512_bf16() || cpu_has_avx2(); },
          "the CPU runs linear_bf16 (AVX-512 BF16, else AVX2 + FMA)");
}
}  // namespace specdec

#else  // not x86-64 with GCC/Clang

namespace specdec {
void register_bf16_linear(pybind11::module_& m) {
    m.def("has_avx512_bf16", []() { return false; }, "the CPU runs the AVX-512 BF16 linear");
    m.def("has_bf16_linear", []() { return false; }, "the CPU runs linear_bf16 (AVX-512 BF16, else AVX2 + FMA)");
}
}  // namespace specdec

#endif
