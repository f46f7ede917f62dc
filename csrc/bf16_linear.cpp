// bf16 linear for a few rows (decode steps, verification rows, draft steps) with AVX-512 BF16 (vdpbf16ps).
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
#include "vec_math.h"

#if defined(SPECDEC_HAVE_AVX512)
#define SPECDEC_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace {

bool cpu_has_avx512_bf16() {   // asked on every call: answered once
    static const bool has = [] {
        __builtin_cpu_init();
        return specdec::cpu_has_avx512f() && __builtin_cpu_supports("avx512bf16");
    }();
    return has;
}

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

// x [M, K] bf16 @ W^T (+ bias) -> [M, N] bf16; packed: [ceil(N/32), K/2, 32, 2] bf16 (see the layout above)
torch::Tensor linear_bf16(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& bias,
                          int64_t n) {
    TORCH_CHECK(cpu_has_avx512_bf16(), "linear_bf16: this CPU lacks AVX-512 BF16");
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
        at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) { kernel(wp, xp, bp, op, M, K, n, b0, b1); });
    }
    return out;
}

}  // namespace

namespace specdec {
void register_bf16_linear(pybind11::module_& m) {
    m.def("linear_bf16", &linear_bf16, "y[M, n] bf16 = x[M, K] bf16 @ W^T (+ bias), W packed [N/32, K/2, 32, 2]");
    m.def("has_avx512_bf16", &cpu_has_avx512_bf16, "the CPU runs the AVX-512 BF16 linear");
}
}  // namespace specdec

#else  // not x86-64 with GCC/Clang

namespace specdec {
void register_bf16_linear(pybind11::module_& m) {
    m.def("has_avx512_bf16", []() { return false; }, "the CPU runs the AVX-512 BF16 linear");
}
}  // namespace specdec

#endif
