// Small AVX-512 helpers shared by the attention and activation kernels: bf16 <-> fp32 and a vector exp.
// Everything is deterministic (a fixed instruction sequence per lane), so a value never depends on which
// other values share its vector or call.
#pragma once
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SPECDEC_HAVE_AVX512 1
#define SPECDEC_AVX512F __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace specdec {

bool cpu_has_avx512f();

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

}  // namespace specdec
#endif
