// What the AVX-512 kernels (VNNI and AMX) load alike. One group tile of codes as bytes in registers: GROUP/4 registers, each 16
// columns x 4 consecutive k (the layout in qlinear.h). 4-bit codes: low and high nibbles of each 64-byte chunk; 6-bit:
// those plus the top 2 bits from their plane, (plane >> 2j) & 3 moved to bits 4-5; 8-bit: the bytes as they lie;
// 3-bit (groups of 32): (plane >> 2j) & 3 of the 2-bit plane's chunks, plus bit j of the 1-bit plane moved to bit 2.
// Include only from a file compiled for x86-64 with GCC or Clang, after <immintrin.h>.
#pragma once
#include <cstdint>

namespace specdec {

template <int BITS, int GROUP>
__attribute__((target("avx512f,avx512bw"), always_inline)) inline void load_codes(const uint8_t* tile, __m512i* W) {
    constexpr int NREG = GROUP / 4;
    if constexpr (BITS == 8) {
        for (int j = 0; j < NREG; ++j) W[j] = _mm512_loadu_si512(tile + 64 * j);
    } else if constexpr (BITS == 3) {
        static_assert(GROUP == 32, "3-bit codes come in groups of 32");
        const __m512i two = _mm512_set1_epi8(0x03), one = _mm512_set1_epi8(0x01);
        for (int h = 0; h < NREG / 4; ++h) {   // a 16-bit shift moves bits across bytes; the mask keeps each byte's own
            const __m512i b = _mm512_loadu_si512(tile + 64 * h);
            for (int j = 0; j < 4; ++j) W[4 * h + j] = _mm512_and_si512(_mm512_srli_epi16(b, 2 * j), two);
        }
        const __m512i hb = _mm512_loadu_si512(tile + GROUP * 4);
        for (int j = 0; j < NREG; ++j)
            W[j] = _mm512_or_si512(W[j], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, j), one), 2));
    } else {
        const __m512i low4 = _mm512_set1_epi8(0x0F);
        for (int i = 0; i < NREG / 2; ++i) {
            const __m512i b = _mm512_loadu_si512(tile + 64 * i);
            W[2 * i] = _mm512_and_si512(b, low4);
            W[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(b, 4), low4);
        }
        if constexpr (BITS == 6) {
            const __m512i two = _mm512_set1_epi8(0x03);
            for (int h = 0; h < NREG / 4; ++h) {
                const __m512i hb = _mm512_loadu_si512(tile + GROUP * 8 + 64 * h);
                for (int j = 0; j < 4; ++j) {
                    const __m512i top = _mm512_and_si512(_mm512_srli_epi16(hb, 2 * j), two);
                    W[4 * h + j] = _mm512_or_si512(W[4 * h + j], _mm512_slli_epi16(top, 4));
                }
            }
        }
    }
}

// Two consecutive groups' mins (16 columns each, at mn and mn + 16) as int16 pairs, group g in the low half of each
// 32-bit lane and g + 1 in the high: one operand of the vpdpwssd that sums Mn over two groups.
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m512i mins_pair(const int8_t* mn) {
    const __m128i lo = _mm_loadu_si128((const __m128i*)mn), hi = _mm_loadu_si128((const __m128i*)(mn + 16));
    return _mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi)));
}

// 16 floats rounded to bf16 as c10::BFloat16 rounds: round half to even on the bits, a NaN to 0x7FC0
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m256i bf16_round16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(u, 16),
                                                                                      _mm512_set1_epi32(1)));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(r);
}

}  // namespace specdec
