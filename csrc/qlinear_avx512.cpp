// The AVX-512 VNNI kernel. One tile = 16 output columns x one group of k (16 or 32). The tile is loaded
// and unpacked into registers once and then used for every row of the call: that reuse is what keeps a
// few-row forward as cheap as a one-row forward while the weights, not the arithmetic, set the pace.
// Compiled for AVX-512 through function attributes only, so the rest of the library stays portable; the
// caller checks the CPU (cpu_has_avx512_vnni) before calling in.
#include <algorithm>
#include <cstring>
#include <utility>

#include "qlinear.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "qlinear_codes.h"
#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

namespace specdec {

bool cpu_has_avx512f() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

bool cpu_has_avx512_vnni() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

// Bytes ahead of the tile being unpacked that the kernel asks the memory system for (0 = hardware prefetch
// only). Tuned by measurement (python -m specdec.bench.kernels --prefetch ...).
static int64_t g_prefetch = 2048;   // measured: M = 4 and 8 forwards 10-20% faster, M = 1 unchanged
void set_prefetch_distance(int64_t bytes) { g_prefetch = bytes < 0 ? 0 : bytes; }
int64_t prefetch_distance() { return g_prefetch; }

namespace {

// An unaligned int32 that may alias int8 data: lets the compiler fold a 4-byte broadcast into the
// memory operand of the dot-product instruction ({1to16}) instead of going through a general register.
typedef int32_t __attribute__((may_alias, aligned(1))) i32u;

SPECDEC_AVX512 inline __m512i bcast4(const void* p) { return _mm512_set1_epi32(*static_cast<const i32u*>(p)); }

// Rows [r0, r0 + R) of column block cb. R rows' int32 sums S live in registers through the group loop (with the
// unpacked tile and temporaries: R + GROUP/4 + 6), then S and Mn through the superblock's epilogue (2R + 3); the
// fp32 sums build up in `out` itself, one load and store per row and superblock, not in registers. That lets a tile
// hold more than the 6 rows it could with fp32 sums in registers; past 9 rows it spills (measured: MAX_TILE). The
// group's unpacked tile is reused by all R rows.
template <int BITS, int GROUP, int R>
SPECDEC_AVX512 void rows_tile(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb, int64_t r0) {
    constexpr int NREG = GROUP / 4;                 // registers per tile: 16 lanes x 4 k each
    const int64_t ng = w.ngroups(), ns = w.nsuper(), tb = w.tile_bytes(), K = w.k, ngp = x.asum_stride;
    const int64_t pf = g_prefetch;
    float* orow = out + r0 * w.n + cb * 16;          // row r's 16 sums at orow + r * w.n
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(orow + r * w.n, _mm512_setzero_ps());
    for (int64_t s = 0; s < ns; ++s) {
        __m512i S[R], Mn[R];
        for (int r = 0; r < R; ++r) S[r] = Mn[r] = _mm512_setzero_si512();
        const int64_t g0 = s * w.sb, g1 = std::min(ng, g0 + w.sb);
        for (int64_t g = g0; g < g1; ++g) {
            const uint8_t* tile = w.qw + (cb * ng + g) * tb;
            if (pf)
                for (int64_t i = 0; i < tb; i += 64) _mm_prefetch(reinterpret_cast<const char*>(tile + pf + i), _MM_HINT_T0);
            __m512i W[NREG];
            load_codes<BITS, GROUP>(tile, W);
            // 3- and 4-bit codes in groups of 32: the group scale, per column in both int16 halves of its lane, and
            // S += d0 * sc + d1 * sc in one vpdpwssd (each chain covers 16 k: |d| <= 16 * 15 * 127 = 30480 fits
            // int16; the sum is the same exact int32 as (d0 + d1) * sc, which the portable kernel computes)
            const __m512i sc32 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w.sc + (cb * ng + g) * 16)));
            const __m512i vsc2 = _mm512_or_si512(_mm512_and_si512(sc32, _mm512_set1_epi32(0xFFFF)),
                                                 _mm512_slli_epi32(sc32, 16));          // (sc, sc) as int16 pairs
            for (int r = 0; r < R; ++r) {
                const int8_t* ar = x.a + (r0 + r) * K + g * GROUP;
                __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();   // two chains for ILP
                for (int j = 0; j < NREG; j += 2) {
                    d0 = _mm512_dpbusd_epi32(d0, W[j], bcast4(ar + 4 * j));
                    d1 = _mm512_dpbusd_epi32(d1, W[j + 1], bcast4(ar + 4 * j + 4));
                }
                if constexpr (BITS <= 4 && GROUP == 32) {
                    const __m512i pair = _mm512_mask_blend_epi16(0xAAAAAAAA, d0, _mm512_slli_epi32(d1, 16));
                    S[r] = _mm512_dpwssd_epi32(S[r], pair, vsc2);
                } else {                         // 6- and 8-bit codes: the chains' sums exceed int16
                    S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(_mm512_add_epi32(d0, d1), sc32));
                }
            }
        }
        // Mn = sum_g mn_g * asum_g: two groups per instruction (int16 pairs), a last odd group alone.
        int64_t g = g0;
        for (; g + 1 < g1; g += 2) {
            const __m512i pair = mins_pair(w.mn + (cb * ng + g) * 16);
            for (int r = 0; r < R; ++r) Mn[r] = _mm512_dpwssd_epi32(Mn[r], pair, bcast4(x.asum + (r0 + r) * ngp + g));
        }
        if (g < g1) {
            const __m512i one = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w.mn + (cb * ng + g) * 16)));
            for (int r = 0; r < R; ++r)
                Mn[r] = _mm512_add_epi32(Mn[r], _mm512_mullo_epi32(one, _mm512_set1_epi32(x.asum[(r0 + r) * ngp + g])));
        }
        const uint16_t* dm = w.dm + (cb * ns + s) * 32;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)dm));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dm + 16)));
        for (int r = 0; r < R; ++r) {
            // t = d*S - dmin*Mn (the second product fused, as std::fma in the portable kernel)
            const __m512 t = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(Mn[r]), _mm512_mul_ps(_mm512_cvtepi32_ps(S[r]), d));
            float* o = orow + r * w.n;
            _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_set1_ps(x.ascale[(r0 + r) * ns + s]), t, _mm512_loadu_ps(o)));
        }
    }
    if (bias)
        for (int r = 0; r < R; ++r) {
            float* o = orow + r * w.n;
            _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), _mm512_loadu_ps(bias + cb * 16)));
        }
}

SPECDEC_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
SPECDEC_AVX512 inline __m512 load16(const uint16_t* p) {   // 16 bf16 -> fp32 (exact)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

template <typename T>
SPECDEC_AVX512 void quantize_impl(const T* x, int64_t m, int64_t k, int group, int sb, int8_t* a8, int16_t* asum,
                                  float* ascale) {
    // The same arithmetic as the portable quantize_rows, 16 values at a time (k is a multiple of 16).
    const int64_t ng = k / group, ns = (ng + sb - 1) / sb, span = int64_t(group) * sb, stride = asum_stride(k, group);
    const __m512 lim = _mm512_set1_ps(127.f);
    for (int64_t r = 0; r < m; ++r) {
        const T* xr = x + r * k;
        int8_t* ar = a8 + r * k;
        for (int64_t s = 0; s < ns; ++s) {
            const int64_t k0 = s * span, k1 = std::min(k, k0 + span);
            __m512 vmax = _mm512_setzero_ps();
            for (int64_t i = k0; i < k1; i += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(load16(xr + i)));
            const float amax = _mm512_reduce_max_ps(vmax);
            const float inv = amax > 0.f ? 127.f / amax : 0.f;
            ascale[r * ns + s] = amax / 127.f;
            const __m512 vinv = _mm512_set1_ps(inv);
            for (int64_t i = k0; i < k1; i += 16) {
                __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(load16(xr + i), vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                v = _mm512_max_ps(_mm512_set1_ps(-127.f), _mm512_min_ps(lim, v));
                _mm_storeu_si128((__m128i*)(ar + i), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
            }
        }
        for (int64_t g = 0; g < stride; ++g) {
            int32_t t = 0;
            if (g < ng)
                for (int64_t i = g * group; i < (g + 1) * group; i += 16)
                    t += _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(ar + i))));
            asum[r * stride + g] = int16_t(t);
        }
    }
}


constexpr int MAX_TILE = 9;   // measured: 7-9 row tiles beat two smaller ones; past 9 rows the sums spill (see rows_tile)

template <int BITS, int GROUP, int... R>
SPECDEC_AVX512 void run_tile_impl(int rows, const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb,
                                  int64_t r0, std::integer_sequence<int, R...>) {
    ((rows == R + 1 ? (rows_tile<BITS, GROUP, R + 1>(w, x, bias, out, cb, r0), 0) : 0), ...);
}

template <int BITS, int GROUP>
SPECDEC_AVX512 void run_tile(int rows, const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb, int64_t r0) {
    run_tile_impl<BITS, GROUP>(rows, w, x, bias, out, cb, r0, std::make_integer_sequence<int, MAX_TILE>{});
}

template <int BITS, int GROUP>
SPECDEC_AVX512 void kernel(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1) {
    // Rows split into the fewest tiles of at most MAX_TILE, of balanced sizes (10 = 5 + 5, not 9 + 1): a
    // one-row tile pays a whole unpack for one row and runs latency-bound. The tile a row lands in never
    // changes its arithmetic.
    const int64_t tiles = (x.m + MAX_TILE - 1) / MAX_TILE;
    for (int64_t cb = cb0; cb < cb1; ++cb) {
        int64_t r0 = 0;
        for (int64_t t = 0; t < tiles; ++t) {
            const int rows = int((x.m - r0) / (tiles - t) + ((x.m - r0) % (tiles - t) ? 1 : 0));
            run_tile<BITS, GROUP>(rows, w, x, bias, out, cb, r0);
            r0 += rows;
        }
    }
}

}  // namespace

template <typename T>
void quantize_rows_avx512(const T* x, int64_t m, int64_t k, int group, int sb, int8_t* a8, int16_t* asum,
                          float* ascale) {
    quantize_impl(x, m, k, group, sb, a8, asum, ascale);
}
template void quantize_rows_avx512<float>(const float*, int64_t, int64_t, int, int, int8_t*, int16_t*, float*);
template void quantize_rows_avx512<uint16_t>(const uint16_t*, int64_t, int64_t, int, int, int8_t*, int16_t*, float*);

SPECDEC_AVX512 void to_bf16_avx512(const float* src, uint16_t* dst, int64_t count) {   // count: a multiple of 16
    for (int64_t i = 0; i < count; i += 16) _mm256_storeu_si256((__m256i*)(dst + i), bf16_round16(_mm512_loadu_ps(src + i)));
}

void qlinear_avx512(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1) {
    if (w.bits == 3 && w.group == 32) return kernel<3, 32>(w, x, bias, out, cb0, cb1);   // this kernel's alone
    SPECDEC_DISPATCH_FORMAT(w, kernel, qlinear_portable, w, x, bias, out, cb0, cb1);   // others: the portable kernel
}

}  // namespace specdec

#else  // not x86-64 with GCC/Clang: the portable kernel only

namespace specdec {
bool cpu_has_avx512_vnni() { return false; }
void to_bf16_avx512(const float*, uint16_t*, int64_t) {}
void set_prefetch_distance(int64_t) {}
int64_t prefetch_distance() { return 0; }
template <typename T>
void quantize_rows_avx512(const T* x, int64_t m, int64_t k, int group, int sb, int8_t* a8, int16_t* asum,
                          float* ascale) {
    quantize_rows(x, m, k, group, sb, a8, asum, ascale);
}
template void quantize_rows_avx512<float>(const float*, int64_t, int64_t, int, int, int8_t*, int16_t*, float*);
template void quantize_rows_avx512<uint16_t>(const uint16_t*, int64_t, int64_t, int, int, int8_t*, int16_t*, float*);
void qlinear_avx512(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1) {
    qlinear_portable(w, x, bias, out, cb0, cb1);
}
}  // namespace specdec

#endif
