// Small AVX-512 and AVX2 helpers shared by the attention and activation kernels: bf16 <-> fp32 and a vector exp.
// Everything is deterministic (a fixed instruction sequence per lane), so a value never depends on which
// other values share its vector or call.
#pragma once
#include <cmath>
#include <cstdint>

namespace specdec {
// Which path an op runs (the `impl` argument of silu_mul and ragged_attention): 0 the best this CPU has.
// kOpsAvx512Bf16: ragged_attention only, bf16 caches on a CPU with AVX-512 BF16 (vdpbf16ps).
// kOpsAmx: ragged_attention only, bf16 caches on a CPU with AMX-BF16 tiles (attention_amx.cpp).
enum OpsImpl { kOpsAuto = 0, kOpsScalar = 1, kOpsAvx512 = 2, kOpsAvx2 = 3, kOpsAvx512Bf16 = 4, kOpsAmx = 5 };
}  // namespace specdec

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SPECDEC_HAVE_AVX512 1
#define SPECDEC_AVX512F __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define SPECDEC_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace specdec {

bool cpu_has_avx512f();
bool cpu_has_avx2();   // AVX2 + FMA + F16C (qlinear_avx2.cpp)

inline bool cpu_has_avx512_bf16() {   // asked on every call: answered once
    static const bool has = [] {
        __builtin_cpu_init();
        return cpu_has_avx512f() && __builtin_cpu_supports("avx512bf16");
    }();
    return has;
}

SPECDEC_AVX512F inline __m512 vload(const float* p) { return _mm512_loadu_ps(p); }
SPECDEC_AVX512F inline __m512 vload(const uint16_t* p) {   // 16 bf16 -> fp32 (exact)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
SPECDEC_AVX512F inline void vstore(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
SPECDEC_AVX512F inline __m512i bf16_round_bits(__m512 v) {   // fp32 -> bf16 bits in 32-bit lanes, nearest-even
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    // NaN stays NaN (quiet): keep the top bits of a NaN untouched
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_srli_epi32(_mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000)), 16);
}
SPECDEC_AVX512F inline void vstore(uint16_t* p, __m512 v) {
    _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(bf16_round_bits(v)));
}
SPECDEC_AVX512F inline __m512 round_like(__m512 v, const float*) { return v; }
SPECDEC_AVX512F inline __m512 round_like(__m512 v, const uint16_t*) {   // fp32 -> bf16 -> fp32
    return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_round_bits(v), 16));
}

// e^x for x in fp32 (|relative error| < 2e-7 over the range used: softmax arguments <= 0, activations);
// x below -87.3 gives 0, above 88.7 gives +inf.
SPECDEC_AVX512F inline __m512 vexp(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.72283f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);          // x - n ln2, in two parts
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);                               // Cephes expf polynomial
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(~under, _mm512_scalef_ps(p, n));
}

// s[0..nkeys) <- exp(s - max s), in place; returns their sum (the softmax's denominator).
SPECDEC_AVX512F inline float softmax_avx512(float* s, int64_t nkeys) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= nkeys; j += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + j));
    const __mmask16 tail = __mmask16((1u << (nkeys - j)) - 1);
    vmax = _mm512_mask_max_ps(vmax, tail, vmax, _mm512_maskz_loadu_ps(tail, s + j));
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 vsum = _mm512_setzero_ps();
    for (j = 0; j + 16 <= nkeys; j += 16) {
        const __m512 e = vexp(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
        _mm512_storeu_ps(s + j, e);
        vsum = _mm512_add_ps(vsum, e);
    }
    if (tail) {
        const __m512 e = _mm512_maskz_mov_ps(tail, vexp(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + j), m)));
        _mm512_mask_storeu_ps(s + j, tail, e);
        vsum = _mm512_add_ps(vsum, e);
    }
    return _mm512_reduce_add_ps(vsum);
}

// The softmax's numerators e[0..n) rounded to bf16 into w, in key order (a 32-bit word at an even key is the pair
// j, j + 1), and the sum of the rounded weights. Lanes past the last key store 0 up to the next multiple of 16 (an
// odd last key's partner).
SPECDEC_AVX512F inline float bf16_weights(const float* e, int64_t n, uint16_t* w) {
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
        const __m512 r = _mm512_maskz_mov_ps(m, round_like(_mm512_maskz_loadu_ps(m, e + i), w));
        vstore(w + i, r);
        vsum = _mm512_add_ps(vsum, r);
    }
    return _mm512_reduce_add_ps(vsum);
}

// ---- AVX2 + FMA: the same helpers over 8 lanes (CPUs without AVX-512) -------------------------------------
#define SPECDEC_AVX2F __attribute__((target("avx2,fma")))
namespace avx2 {

SPECDEC_AVX2F inline __m256 vload(const float* p) { return _mm256_loadu_ps(p); }
SPECDEC_AVX2F inline __m256 vload(const uint16_t* p) {   // 8 bf16 -> fp32 (exact)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
SPECDEC_AVX2F inline void vstore(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
SPECDEC_AVX2F inline __m256i bf16_round_bits(__m256 v) {   // fp32 -> bf16 bits in 32-bit lanes, nearest-even
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));   // NaN stays a quiet NaN
    const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    return _mm256_srli_epi32(_mm256_blendv_epi8(r, quiet, nan), 16);
}
SPECDEC_AVX2F inline void vstore(uint16_t* p, __m256 v) {
    const __m256i b = bf16_round_bits(v);   // each lane <= 0xFFFF, so the unsigned pack is exact
    _mm_storeu_si128((__m128i*)p, _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}
SPECDEC_AVX2F inline __m256 round_like(__m256 v, const float*) { return v; }
SPECDEC_AVX2F inline __m256 round_like(__m256 v, const uint16_t*) {   // fp32 -> bf16 -> fp32
    return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_round_bits(v), 16));
}
SPECDEC_AVX2F inline float hsum(__m256 v) {   // a fixed order: high half onto low, then pairs
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
// e^x as the AVX-512 vexp computes it (same reduction and polynomial); 2^n is applied as two exact factors
// 2^(n >> 1) and 2^(n - (n >> 1)), each a normal float over the clamped range.
SPECDEC_AVX2F inline __m256 vexp(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.72283f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_andnot_ps(under, _mm256_mul_ps(_mm256_mul_ps(p, f1), f2));
}

}  // namespace avx2
}  // namespace specdec
#endif
