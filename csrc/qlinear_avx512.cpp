// The AVX-512 VNNI kernel. One tile = 16 output columns x one group of k (16 or 32). The tile is loaded
// and unpacked into registers once and then used for every row of the call: that reuse is what keeps a
// few-row forward as cheap as a one-row forward while the weights, not the arithmetic, set the pace.
// Compiled for AVX-512 through function attributes only, so the rest of the library stays portable; the
// caller checks the CPU (cpu_has_avx512_vnni) before calling in.
#include <algorithm>
#include <cstring>

#include "qlinear.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

namespace specdec {

bool cpu_has_avx512_vnni() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

namespace {

constexpr int64_t ROW_TILE = 16;   // rows whose int32 sums stay in one L1-resident scratch block

SPECDEC_AVX512 inline __m512i bcast4(const int8_t* p) {  // 4 int8 activations into every lane
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

template <int BITS, int GROUP>
SPECDEC_AVX512 void kernel(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0,
                           int64_t cb1) {
    constexpr int NREG = GROUP / 4;                 // registers per tile: 16 lanes x 4 k each
    const int64_t ng = w.ngroups(), ns = w.nsuper(), tb = w.tile_bytes(), K = w.k;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    alignas(64) int32_t S[ROW_TILE][16], Mn[ROW_TILE][16];
    alignas(64) float acc[ROW_TILE][16];
    for (int64_t cb = cb0; cb < cb1; ++cb) {
        for (int64_t r0 = 0; r0 < x.m; r0 += ROW_TILE) {
            const int64_t rows = std::min(ROW_TILE, x.m - r0);
            for (int64_t r = 0; r < rows; ++r) _mm512_store_ps(acc[r], _mm512_setzero_ps());
            for (int64_t s = 0; s < ns; ++s) {
                for (int64_t r = 0; r < rows; ++r) {
                    _mm512_store_si512(S[r], _mm512_setzero_si512());
                    _mm512_store_si512(Mn[r], _mm512_setzero_si512());
                }
                const int64_t g1 = std::min(ng, (s + 1) * w.sb);
                for (int64_t g = s * w.sb; g < g1; ++g) {
                    const uint8_t* tile = w.qw + (cb * ng + g) * tb;
                    __m512i W[NREG];
                    if constexpr (BITS == 4) {
                        for (int i = 0; i < NREG / 2; ++i) {
                            const __m512i b = _mm512_loadu_si512(tile + 64 * i);
                            W[2 * i] = _mm512_and_si512(b, low4);
                            W[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(b, 4), low4);
                        }
                    } else {
                        for (int j = 0; j < NREG; ++j) W[j] = _mm512_loadu_si512(tile + 64 * j);
                    }
                    const __m512i vsc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w.sc + (cb * ng + g) * 16)));
                    const __m512i vmn = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w.mn + (cb * ng + g) * 16)));
                    const int8_t* ag = x.a + r0 * K + g * GROUP;
                    const int32_t* sg = x.asum + r0 * ng + g;
                    for (int64_t r = 0; r < rows; ++r) {
                        const int8_t* ar = ag + r * K;
                        __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();   // two chains for ILP
                        for (int j = 0; j < NREG; j += 2) {
                            d0 = _mm512_dpbusd_epi32(d0, W[j], bcast4(ar + 4 * j));
                            d1 = _mm512_dpbusd_epi32(d1, W[j + 1], bcast4(ar + 4 * j + 4));
                        }
                        const __m512i isum = _mm512_add_epi32(d0, d1);
                        _mm512_store_si512(S[r], _mm512_add_epi32(_mm512_load_si512(S[r]), _mm512_mullo_epi32(isum, vsc)));
                        _mm512_store_si512(Mn[r], _mm512_add_epi32(_mm512_load_si512(Mn[r]),
                                                                   _mm512_mullo_epi32(vmn, _mm512_set1_epi32(sg[r * ng]))));
                    }
                }
                const uint16_t* dm = w.dm + (cb * ns + s) * 32;
                const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)dm));
                const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dm + 16)));
                for (int64_t r = 0; r < rows; ++r) {
                    // t = d*S - dmin*Mn (the second product fused, as std::fma in the portable kernel)
                    const __m512 t = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(_mm512_load_si512(Mn[r])),
                                                      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(S[r])), d));
                    const __m512 a = _mm512_set1_ps(x.ascale[(r0 + r) * ns + s]);
                    _mm512_store_ps(acc[r], _mm512_fmadd_ps(a, t, _mm512_load_ps(acc[r])));
                }
            }
            for (int64_t r = 0; r < rows; ++r) {
                __m512 v = _mm512_load_ps(acc[r]);
                if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + cb * 16));
                _mm512_storeu_ps(out + (r0 + r) * w.n + cb * 16, v);
            }
        }
    }
}

}  // namespace

void qlinear_avx512(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1) {
    if (w.bits == 4 && w.group == 32) return kernel<4, 32>(w, x, bias, out, cb0, cb1);
    if (w.bits == 8 && w.group == 32) return kernel<8, 32>(w, x, bias, out, cb0, cb1);
    if (w.bits == 8 && w.group == 16) return kernel<8, 16>(w, x, bias, out, cb0, cb1);
    if (w.bits == 4 && w.group == 16) return kernel<4, 16>(w, x, bias, out, cb0, cb1);
    qlinear_portable(w, x, bias, out, cb0, cb1);   // formats without a vector kernel
}

}  // namespace specdec

#else  // not x86-64 with GCC/Clang: the portable kernel only

namespace specdec {
bool cpu_has_avx512_vnni() { return false; }
void qlinear_avx512(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1) {
    qlinear_portable(w, x, bias, out, cb0, cb1);
}
}  // namespace specdec

#endif
