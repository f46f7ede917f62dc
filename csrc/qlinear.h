// Block-quantized linear layers for CPU decoding: weights of 3, 4, 6 or 8 bits in groups along K, with a
// two-level scale (llama.cpp's K-quant layout), times activations quantized per row to int8.
//
// A weight is  w[n, k] = d[n, s] * sc[n, g] * q[n, k]  -  dmin[n, s] * mn[n, g]
//   q  : unsigned code, 0 .. 2^bits - 1 (bits = 3, 4, 6 or 8; 3 in groups of 32 only)
//   g  : group of `group` consecutive k (16 or 32); sc, mn: int8 per group and column
//   s  : superblock of `sb` consecutive groups; d, dmin: fp16 per superblock and column
// GGUF's Q4_K, Q6_K, Q8_0 and Q5_0 blocks are all exactly of this form (see quantization/gguf.py).
//
// An activation row is quantized per superblock span of K: a[k] ~= ascale[s] * a8[k], a8 in -127..127,
// with asum[g] = sum of a8 over group g. Then per output
//   y[n] = sum_s ascale[s] * ( d * S  -  dmin * Mn ),  S = sum_g sc_g * <q, a8>_g,  Mn = sum_g mn_g * asum_g
// S and Mn are exact int32 sums; the float steps run per superblock in a fixed order, so a row's result
// never depends on which other rows share the call (batch invariance), nor on the thread count.
//
// Packed layout (N a multiple of 16; columns in blocks of 16, cb = n / 16, c = n % 16):
//   qw : uint8 [N/16, NG, group*16*bits/8]. Within one (cb, g) tile, 64-byte chunks; byte c*4 + t of
//        chunk j holds, for bits = 8, q[c, 4j + t]; for bits = 4, chunk i holds q[c, 8i + t] in its low
//        nibble and q[c, 8i + 4 + t] in its high nibble; for bits = 6, the low 4 bits are laid out as for
//        bits = 4 (group*8 bytes), then chunk h of the top-2-bit plane holds, in bits 2j..2j+1 of byte
//        c*4 + t, the top bits of q[c, 16h + 4j + t]; for bits = 3 (a draft's lossy re-quantization; group 32), two
//        chunks of a 2-bit plane, chunk h holding in bits 2j..2j+1 of byte c*4 + t the low 2 bits of
//        q[c, 16h + 4j + t], then one chunk holding in bit j of byte c*4 + t bit 2 of q[c, 4j + t]. So one 64-byte
//        load (+ AND / shift for 4 bits)
//        gives 16 lanes x 4 consecutive k: the operand shape of one VNNI dot-product instruction.
//   sc, mn : int8 [N/16, NG, 16];   dm : fp16 bits [N/16, NS, 2, 16] (d, then dmin)
#pragma once
#include <cstdint>

namespace specdec {

struct QWeight {
    const uint8_t* qw;
    const int8_t* sc;
    const int8_t* mn;
    const uint16_t* dm;
    int64_t n, k;
    int bits, group, sb;
    int64_t ngroups() const { return k / group; }
    int64_t nsuper() const { return (ngroups() + sb - 1) / sb; }
    int64_t tile_bytes() const { return int64_t(group) * 16 * bits / 8; }
};

struct QAct {
    const int8_t* a;        // [m, k]
    const int16_t* asum;    // [m, asum_stride]: NG group sums (|sum| <= 32 * 127), then a zero pad to even
    const float* ascale;    // [m, NS]
    int64_t m;
    int64_t asum_stride;    // NG rounded up to even, so two neighbouring groups load as one int32
    // The same codes in chunks of 64 k, every row's chunk q together ([ceil(k / 64)][m][64]): a tile of 16 rows x
    // 64 k is then 1 KB in one run, not 16 lines k bytes apart (pages apart for a wide k). Set for the AMX kernel
    // where a superblock spans a multiple of 64 k; nullptr elsewhere.
    const int8_t* a_chunks = nullptr;
};

inline int64_t asum_stride(int64_t k, int group) { return (k / group + 1) / 2 * 2; }

// x: [m, k] fp32, or bf16 given as its raw bits (uint16_t) -> a8, asum, ascale (the spans follow the
// weight's group and superblock). Both versions round identically: amax and the int sums are exact, the
// scale is one IEEE division, each code one IEEE product rounded half to even.
template <typename T>
void quantize_rows(const T* x, int64_t m, int64_t k, int group, int sb, int8_t* a8, int16_t* asum, float* ascale);
template <typename T>
void quantize_rows_avx512(const T* x, int64_t m, int64_t k, int group, int sb, int8_t* a8, int16_t* asum,
                          float* ascale);

inline float to_float(float v) { return v; }
inline float to_float(uint16_t bf16_bits) {   // bf16 -> fp32 is exact: the bits are the top half
    const uint32_t u = uint32_t(bf16_bits) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

// out[m, n] (fp32) for column blocks [cb0, cb1); bias may be null.
void qlinear_portable(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1);
void qlinear_avx512(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1);
bool cpu_has_avx512_vnni();
// fp32 -> bf16 bits as c10::BFloat16 rounds them (count: a multiple of 16; AVX-512 CPUs only)
void to_bf16_avx512(const float* src, uint16_t* dst, int64_t count);
// AMX-INT8 tile multiplies (bit-identical to the AVX-512 kernel); cpu_has_amx() also asks Linux for the tile state
// out_bf16: where given, the rows go there rounded to bf16 and nothing to `out` (which may be null)
void qlinear_amx(const QWeight& w, const QAct& x, const float* bias, float* out, uint16_t* out_bf16, int64_t cb0,
                 int64_t cb1);
bool cpu_has_amx();
// AVX2 (+ FMA, F16C) for CPUs without AVX-512 VNNI: 4- and 6-bit codes (8-bit ones fall back to the portable kernel)
void qlinear_avx2(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1);
bool qlinear_avx2_supports(const QWeight& w);
bool cpu_has_avx2();
void set_prefetch_distance(int64_t bytes);   // software prefetch ahead of the weight stream (0 = off)
int64_t prefetch_distance();

float half_to_float(uint16_t h);

// The formats every vector kernel is instantiated for: KERNEL<bits, group>(args) for w's format, else FALLBACK(args)
#define SPECDEC_DISPATCH_FORMAT(w, KERNEL, FALLBACK, ...)                                          \
    do {                                                                                           \
        const int bits_ = (w).bits, group_ = (w).group;                                            \
        if (bits_ == 4 && group_ == 32) KERNEL<4, 32>(__VA_ARGS__);                                \
        else if (bits_ == 4 && group_ == 16) KERNEL<4, 16>(__VA_ARGS__);                           \
        else if (bits_ == 6 && group_ == 16) KERNEL<6, 16>(__VA_ARGS__);                           \
        else if (bits_ == 6 && group_ == 32) KERNEL<6, 32>(__VA_ARGS__);                           \
        else if (bits_ == 8 && group_ == 32) KERNEL<8, 32>(__VA_ARGS__);                           \
        else if (bits_ == 8 && group_ == 16) KERNEL<8, 16>(__VA_ARGS__);                           \
        else FALLBACK(__VA_ARGS__);                                                                \
    } while (0)

}  // namespace specdec
