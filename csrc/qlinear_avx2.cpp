// The AVX2 kernel, for CPUs without AVX-512 VNNI (AMD Zen 2/3, most Intel client cores). Same packed layout and
// the same arithmetic as the AVX-512 kernel: exact int32 sums S and Mn per superblock, then the float steps in the
// portable kernel's order, so its results are bit-identical to both (tested).
//
// AVX2 has no 4-way int8 dot product. vpmaddubsw multiplies unsigned codes by signed int8 activations and adds
// neighbouring pairs into int16 (exact while |pair| <= 32767: 4-bit codes give <= 2 * 15 * 127 = 3810, 6-bit
// 16002). For 4-bit codes the pairs of a whole group of 32 are summed in int16 (<= 8 * 3810 = 30480) and scaled
// by the group's sc in one vpmaddwd; 6-bit pairs of two k-slices are summed (<= 32004) and scaled into int32 at
// once. 8-bit codes (up to 255) would saturate a pair, so they are recentred, c = code - 128 in -128..127, and
// multiplied as |c| (unsigned, <= 128) times the activation with c's sign (vpsignb): a pair is then at most
// 2 * 128 * 127 = 32512, and <code, a> = <c, a> + 128 * asum, asum being the group's activation sum. A ymm holds 8 columns x 4 k, so a 16-column tile is done as two
// halves of 8 columns; the unpacked 4 k x 8 columns register is reused by every row of a tile.
#include <algorithm>

#include "qlinear.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SPECDEC_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace specdec {

bool cpu_has_avx2() {
    static const bool has = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    }();
    return has;
}

namespace {

typedef int32_t __attribute__((may_alias, aligned(1))) i32u;

SPECDEC_AVX2 inline __m256i bcast4(const void* p) { return _mm256_set1_epi32(*static_cast<const i32u*>(p)); }

// A group's scales of 8 columns (sc: 8 int8), each in both int16 halves of its lane: the vpmaddwd operand that
// scales int16 pair sums into int32 (its low halves alone, sc against (x, 0), scale a single int16).
SPECDEC_AVX2 inline __m256i group_scales(const int8_t* sc) {
    const __m256i sc32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)sc));
    return _mm256_or_si256(_mm256_and_si256(sc32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(sc32, 16));
}

// Rows a tile takes at once: the weights are unpacked once for all of them. Only the group loop's state is in
// registers (per row an int16 or int32 sum; 4-bit codes keep S in memory, added to once a group), so 8 rows fit
// beside the unpacked weights (measured on Zen 3: 8-row forwards 1.2-1.7x faster than with tiles of 4).
constexpr int MAX_TILE = 8;

// Rows [r0, r0 + R) of columns 16 cb + 8 h .. + 7. The fp32 sums build up in `out` itself (one load and store per
// row and superblock), so only the group loop's state is in registers. The chunk loop is not unrolled: unrolled,
// the compiler hoisted every chunk's products ahead of their sums and spilled them (measured: 2-3x slower at 4-8 rows).
template <int BITS, int GROUP, int R>
SPECDEC_AVX2 void rows_tile(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb, int h,
                            int64_t r0) {
    constexpr int NREG = GROUP / 4;                 // 4-k slices per group
    const int64_t ng = w.ngroups(), ns = w.nsuper(), tb = w.tile_bytes(), K = w.k, ngp = x.asum_stride;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i low16 = _mm256_set1_epi32(0xFFFF);
    const int64_t pf = prefetch_distance();           // the first half's pass asks for the tiles ahead
    float* orow = out + r0 * w.n + cb * 16 + 8 * h;   // row r's 8 sums at orow + r * w.n
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(orow + r * w.n, _mm256_setzero_ps());
    for (int64_t s = 0; s < ns; ++s) {
        alignas(32) int32_t Sm[R][8];                  // 4-bit codes: S in memory, updated once a group
        __m256i S[R];
        for (int r = 0; r < R; ++r) S[r] = _mm256_setzero_si256();
        if constexpr (BITS == 4)
            for (int r = 0; r < R; ++r) _mm256_store_si256((__m256i*)Sm[r], _mm256_setzero_si256());
        const int64_t g0 = s * w.sb, g1 = std::min(ng, g0 + w.sb);
        for (int64_t g = g0; g < g1; ++g) {
            const uint8_t* tile = w.qw + (cb * ng + g) * tb + 32 * h;   // this half's 32 bytes of each 64-byte chunk
            const int8_t* sc = w.sc + (cb * ng + g) * 16 + 8 * h;         // and its 8 columns' group scales
            if (pf && h == 0)
                for (int64_t i = 0; i < tb; i += 64) _mm_prefetch(reinterpret_cast<const char*>(tile + pf + i), _MM_HINT_T0);
            const int8_t* a0 = x.a + r0 * K + g * GROUP;   // row r's activations of this group at a0 + r * K
            if constexpr (BITS == 8) {
                const __m256i vsc2 = group_scales(sc);
                const __m256i top = _mm256_set1_epi8(char(0x80));
#pragma GCC unroll 1
                for (int j = 0; j < NREG; ++j) {       // chunk j: k 4j..4j+3, one byte a code
                    const __m256i c = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(tile + 64 * j)), top);
                    const __m256i mag = _mm256_abs_epi8(c);   // |code - 128|: 128 reads as 128 unsigned
#pragma GCC unroll 8
                    for (int r = 0; r < R; ++r) {
                        const __m256i p = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(bcast4(a0 + r * K + 4 * j), c));
                        S[r] = _mm256_add_epi32(S[r], _mm256_madd_epi16(p, vsc2));
                    }
                }
                // + sc * 128 * asum_g: the sc lanes (sc, 0) against the int16 pair (asum_g, asum_g+1)
                const __m256i sc_lo = _mm256_and_si256(vsc2, low16);
                for (int r = 0; r < R; ++r)
                    S[r] = _mm256_add_epi32(S[r], _mm256_slli_epi32(_mm256_madd_epi16(sc_lo, bcast4(x.asum + (r0 + r) * ngp + g)), 7));
                continue;
            }
            __m256i d16[R];
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) d16[r] = _mm256_setzero_si256();
            __m256i vsc2 = _mm256_setzero_si256();
            if constexpr (BITS == 6) vsc2 = group_scales(sc);   // 4-bit codes take it after the chunk loop
#pragma GCC unroll 1
            for (int i = 0; i < NREG / 2; ++i) {        // chunk i: k 8i..8i+3 (low nibbles), 8i+4..8i+7 (high)
                const __m256i b = _mm256_loadu_si256((const __m256i*)(tile + 64 * i));
                __m256i W0 = _mm256_and_si256(b, low4), W1 = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);
                if constexpr (BITS == 6) {   // the top 2 bits of k-slice 2i + t: plane chunk (2i + t) / 4, bits 2 ((2i + t) % 4)
                    const __m256i hb = _mm256_loadu_si256((const __m256i*)(tile + GROUP * 8 + 64 * (i / 2)));
                    const __m256i three = _mm256_set1_epi8(0x03);
                    const int sh = 4 * (i % 2);
                    W0 = _mm256_or_si256(W0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, sh), three), 4));
                    W1 = _mm256_or_si256(W1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, sh + 2), three), 4));
                }
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    const int8_t* ar = a0 + r * K + 8 * i;
                    const __m256i p0 = _mm256_maddubs_epi16(W0, bcast4(ar));
                    const __m256i p1 = _mm256_maddubs_epi16(W1, bcast4(ar + 4));
                    if constexpr (BITS == 4)
                        d16[r] = _mm256_add_epi16(d16[r], _mm256_add_epi16(p0, p1));
                    else
                        S[r] = _mm256_add_epi32(S[r], _mm256_madd_epi16(_mm256_add_epi16(p0, p1), vsc2));
                }
            }
            if constexpr (BITS == 4) {
                vsc2 = group_scales(sc);
                for (int r = 0; r < R; ++r) {
                    __m256i* sp = (__m256i*)Sm[r];
                    _mm256_store_si256(sp, _mm256_add_epi32(_mm256_load_si256(sp), _mm256_madd_epi16(d16[r], vsc2)));
                }
            }
        }
        if constexpr (BITS == 4)
            for (int r = 0; r < R; ++r) S[r] = _mm256_load_si256((const __m256i*)Sm[r]);
        // Mn = sum_g mn_g * asum_g: two groups per vpmaddwd (int16 pairs), a last odd group alone
        __m256i Mn[R];
        for (int r = 0; r < R; ++r) Mn[r] = _mm256_setzero_si256();
        int64_t g = g0;
        for (; g + 1 < g1; g += 2) {
            const __m128i lo = _mm_loadl_epi64((const __m128i*)(w.mn + (cb * ng + g) * 16 + 8 * h));
            const __m128i hi = _mm_loadl_epi64((const __m128i*)(w.mn + (cb * ng + g + 1) * 16 + 8 * h));
            const __m256i pair = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(lo, hi));
            for (int r = 0; r < R; ++r)
                Mn[r] = _mm256_add_epi32(Mn[r], _mm256_madd_epi16(pair, bcast4(x.asum + (r0 + r) * ngp + g)));
        }
        if (g < g1) {
            const __m256i one = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(w.mn + (cb * ng + g) * 16 + 8 * h)));
            for (int r = 0; r < R; ++r)
                Mn[r] = _mm256_add_epi32(Mn[r], _mm256_mullo_epi32(one, _mm256_set1_epi32(x.asum[(r0 + r) * ngp + g])));
        }
        const uint16_t* dm = w.dm + (cb * ns + s) * 32 + 8 * h;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)dm));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(dm + 16)));
        for (int r = 0; r < R; ++r) {
            // t = d*S - dmin*Mn (the second product fused, as std::fma in the portable kernel)
            const __m256 t = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(Mn[r]), _mm256_mul_ps(_mm256_cvtepi32_ps(S[r]), d));
            float* o = orow + r * w.n;
            _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_set1_ps(x.ascale[(r0 + r) * ns + s]), t, _mm256_loadu_ps(o)));
        }
    }
    if (bias)
        for (int r = 0; r < R; ++r) {
            float* o = orow + r * w.n;
            _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), _mm256_loadu_ps(bias + cb * 16 + 8 * h)));
        }
}

template <int BITS, int GROUP>
SPECDEC_AVX2 void run_tile(int rows, const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb, int h,
                           int64_t r0) {
    switch (rows) {
        case 8: return rows_tile<BITS, GROUP, 8>(w, x, bias, out, cb, h, r0);
        case 7: return rows_tile<BITS, GROUP, 7>(w, x, bias, out, cb, h, r0);
        case 6: return rows_tile<BITS, GROUP, 6>(w, x, bias, out, cb, h, r0);
        case 5: return rows_tile<BITS, GROUP, 5>(w, x, bias, out, cb, h, r0);
        case 4: return rows_tile<BITS, GROUP, 4>(w, x, bias, out, cb, h, r0);
        case 3: return rows_tile<BITS, GROUP, 3>(w, x, bias, out, cb, h, r0);
        case 2: return rows_tile<BITS, GROUP, 2>(w, x, bias, out, cb, h, r0);
        default: return rows_tile<BITS, GROUP, 1>(w, x, bias, out, cb, h, r0);
    }
}

template <int BITS, int GROUP>
SPECDEC_AVX2 void kernel(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1) {
    const int64_t tiles = (x.m + MAX_TILE - 1) / MAX_TILE;   // balanced tiles, as in the AVX-512 kernel
    for (int64_t cb = cb0; cb < cb1; ++cb)
        for (int h = 0; h < 2; ++h) {
            int64_t r0 = 0;
            for (int64_t t = 0; t < tiles; ++t) {
                const int rows = int((x.m - r0) / (tiles - t) + ((x.m - r0) % (tiles - t) ? 1 : 0));
                run_tile<BITS, GROUP>(rows, w, x, bias, out, cb, h, r0);
                r0 += rows;
            }
        }
}

}  // namespace

bool qlinear_avx2_supports(const QWeight& w) {
    return (w.bits == 4 || w.bits == 6 || w.bits == 8) && (w.group == 16 || w.group == 32);
}

void qlinear_avx2(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1) {
    SPECDEC_DISPATCH_FORMAT(w, kernel, qlinear_portable, w, x, bias, out, cb0, cb1);   // others: the portable kernel
}

}  // namespace specdec

#else  // not x86-64 with GCC/Clang

namespace specdec {
bool cpu_has_avx2() { return false; }
bool qlinear_avx2_supports(const QWeight&) { return false; }
void qlinear_avx2(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1) {
    qlinear_portable(w, x, bias, out, cb0, cb1);
}
}  // namespace specdec

#endif
