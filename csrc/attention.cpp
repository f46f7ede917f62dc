// The per-sequence part of attention for a ragged batch on CPU, as one call per layer: write each sequence's
// new K/V rows into its cache, run scaled-dot-product attention of each run of query rows over its sequence's
// cached keys (ATen's kernel, with the run's mask and query padding exactly as the eager code passes them),
// and gather the outputs into one [N, Hq * D] tensor. The arithmetic is ATen's; what this saves
// is the ~15 Python-level ops per sequence and layer around it (milliseconds per step at 8 sequences).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention_amx.h"
#include "ops.h"
#include "vec_math.h"

namespace {

// Decode and verification rows (and, where a model's rows are exact, prompt rows too) attend with the kernels below
// instead of ATen's: each (row, head) over exactly its keys 0..pos, in a fixed order, fp32 throughout (on AVX-512
// BF16 CPUs, bf16 rows weigh their values with bf16-rounded weights: attend_heads_dp). A row's result therefore
// depends on its position only -- never on how many rows share the call or how the keys are padded -- and a
// one-token step costs microseconds instead of ATen's ~100 us of per-call set-up per layer. The AVX2 path takes the
// rows of a sequence in blocks that share every key's loads (attend_rows); AVX-512 (both walks) and the scalar path
// go row by row. Other prompt rows keep ATen's flash attention, in key-block runs.

// Which cache slot a row's j-th key is in: keys 0..nprefix-1 are slots 0..nprefix-1; a token-tree row's further
// keys are its path's slots (its ancestors in the tree, then itself), in depth order. A chain row has no path
// (nprefix = nkeys), so a tree row and the chain row at the same depth attend over the same keys in the same
// order and get bit-identical results.
struct KeySlots {
    int64_t nprefix;
    const int64_t* path;   // nkeys - nprefix slots, or null
    int64_t first = 0;     // the kernels' key 0 is key `first` of the row (a sliding window's first key)
    inline int64_t operator()(int64_t j) const {
        j += first;
        return j < nprefix ? j : path[j - nprefix];
    }
};

// A sliding-window layer (window W > 0): a row at position p attends keys p - W + 1 .. p only. Its position is its
// last key's (nkeys - 1, chain or tree row alike: a tree row's path ends with itself), and the keys it drops are
// leading cache slots (positions = slots), never its tree path (shorter than W). A row whose window holds every key
// (p < W) attends exactly as without a window, so a model's rows before the window match the full kernel's bits.
struct RowKeys {
    int64_t row, nkeys;   // flat-batch row; the keys it attends (its position + 1 for a chain row)
    KeySlots slots;       // where they are
    int64_t first = 0;    // keys before it are outside the row's window
    KeySlots window_slots() const { return KeySlots{slots.nprefix, slots.path, first}; }
};

// One (row, head): q [D], keys/values [slots, D] (row stride D) -> out [D]; s: scratch of nkeys floats.
template <typename T>
void attend_scalar(const T* q, const T* kc, const T* vc, int64_t d, int64_t nkeys, KeySlots slot, float scale,
                   float* s, T* out) {
    float m = -INFINITY;
    for (int64_t j = 0; j < nkeys; ++j) {
        float acc = 0.f;
        const T* kj = kc + slot(j) * d;
        for (int64_t i = 0; i < d; ++i) acc += static_cast<float>(q[i]) * static_cast<float>(kj[i]);
        s[j] = acc * scale;
        m = std::max(m, s[j]);
    }
    float total = 0.f;
    for (int64_t j = 0; j < nkeys; ++j) total += (s[j] = std::exp(s[j] - m));
    std::vector<float> o(d, 0.f);
    for (int64_t j = 0; j < nkeys; ++j) {
        const T* vj = vc + slot(j) * d;
        for (int64_t i = 0; i < d; ++i) o[i] += s[j] * static_cast<float>(vj[i]);
    }
    for (int64_t i = 0; i < d; ++i) out[i] = static_cast<T>(o[i] / total);
}

#ifdef SPECDEC_HAVE_AVX512
// AVX-512: the query heads of one KV group attend together, one row at a time (attend_heads below). AVX2: several
// rows of one sequence and the heads of one KV group attend together (a "pair" is one row and one head): each key
// and value row is loaded and converted once for all pairs of a block instead of once per row and head, and a
// key's lane partials are summed 8 keys at a time (attend_rows). On an AVX2 EPYC that took 8 verification rows at
// 2k context from 50 to 31 ms; on an AVX-512 Xeon the same blocking (16 lanes) was no faster for 8 rows and slower
// for one (docs/benchmarks/attention), so AVX-512 keeps its row-by-row kernel.
//
// The invariant that keeps a row's bits the same however many rows share a call -- so that a decode step, a
// verification row and a prompt row of the same token give the same K/V and logits bit for bit (greedy parity; the
// prefix cache reusing generated tokens as they stand) -- is that every number is computed per (row, head) and per
// key in one fixed way: a key's score is its product chain over d, lane by lane, then one fixed tree over the lanes
// (sum8 on AVX2, _mm512_reduce_add_ps on AVX-512); the softmax runs over the pair's own scores; the output sums the
// pair's own keys in key order, one FMA per key and column, then one multiply by 1 / total. Which rows, heads and
// keys share a block decides only which loads are shared. (tests/test_cpu_ops.py checks rows alone against rows in
// blocks on every path this CPU runs; tests/test_trees.py tree rows against chain rows.)
using specdec::softmax_avx512;
using specdec::vexp;
using specdec::vload;
using specdec::vstore;
namespace v2 = specdec::avx2;

// The query heads of one KV group (G of them) attend together: each key and value row is read once for all G
// instead of once per head, which is what a verification row costs at long context (the cache of a layer no
// longer fits the inner caches, and one row per head read it 6x for Qwen2.5's 12/2 heads). Per head the
// arithmetic is the same op for op whatever G (the score chain over d, its horizontal sum, the softmax, the value
// sums key by key per column), so a head's result has the same bits however its heads are split into tasks.
template <typename B, int G, int C>   // C: columns of 16 accumulated per pass over the values (G * C registers)
SPECDEC_AVX512F void weighted_values_heads(const B* vc, int64_t d, int64_t nkeys, KeySlots slot, const float* s,
                                           const float* inv, B* out, int64_t out_stride) {
    const int nv = int(d / 16);
    for (int c0 = 0; c0 < nv; c0 += C) {
        __m512 o[G][C];
        for (int g = 0; g < G; ++g)
            for (int c = 0; c < C; ++c) o[g][c] = _mm512_setzero_ps();
        for (int64_t j = 0; j < nkeys; ++j) {
            const B* vj = vc + slot(j) * d + 16 * c0;
            __m512 vv[C];
            for (int c = 0; c < C; ++c) vv[c] = vload(vj + 16 * c);
            for (int g = 0; g < G; ++g) {
                const __m512 e = _mm512_set1_ps(s[g * nkeys + j]);
                for (int c = 0; c < C; ++c) o[g][c] = _mm512_fmadd_ps(e, vv[c], o[g][c]);
            }
        }
        for (int g = 0; g < G; ++g)
            for (int c = 0; c < C; ++c)
                vstore(out + g * out_stride + 16 * (c0 + c), _mm512_mul_ps(o[g][c], _mm512_set1_ps(inv[g])));
    }
}

// Sixteen keys' scores from their lane partials a[0..15]: lane j of the result is _mm512_reduce_add_ps(a[j]), by the
// same tree of additions (lanes i + i+8, then i + i+4, then i + i+2, then 0 + 1), so the bits are the one-key loop's;
// four shuffle-and-add levels shared by the sixteen keys instead of a horizontal reduction per key.
SPECDEC_AVX512F inline __m512 reduce16(const __m512* a) {
    __m512 t[8], u[4], v[2];
    for (int p = 0; p < 8; ++p)   // keys 2p, 2p+1: lanes i + i+8, each key's eight in two 128-bit blocks
        t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE));
    for (int p = 0; p < 4; ++p)   // keys 4p .. 4p+3: lanes i + i+4, a block each
        u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0xDD));
    for (int p = 0; p < 2; ++p)   // lanes 0 + 2 and 1 + 3 of each block: block k holds keys 8p+k and 8p+4+k
        v[p] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0xEE));
    // lanes 0 + 1: lane 4k + m holds key k + 4m; put key j in lane j
    const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), w);
}

template <typename B, int G>   // q: G heads, head h at q + h * q_stride; out likewise; s: G * nkeys floats
SPECDEC_AVX512F void attend_heads_avx512(const B* q, int64_t q_stride, const B* kc, const B* vc, int64_t d,
                                         int64_t nkeys, KeySlots slot, float scale, float* s, B* out,
                                         int64_t out_stride) {
    const int nv = int(d / 16);
    alignas(64) float qf[G][256];
    for (int g = 0; g < G; ++g)
        for (int i = 0; i < nv; ++i) _mm512_store_ps(qf[g] + 16 * i, vload(q + g * q_stride + 16 * i));
    // keys sixteen at a time: each key's lane partials as below, then one reduce16 per head
    alignas(64) float kf[16 * 256];
    int64_t j = 0;
    for (; j + 16 <= nkeys; j += 16) {
        for (int kk = 0; kk < 16; ++kk) {
            const B* kj = kc + slot(j + kk) * d;
            for (int i = 0; i < nv; ++i) _mm512_store_ps(kf + kk * d + 16 * i, vload(kj + 16 * i));
        }
        for (int g = 0; g < G; ++g) {
            __m512 acc[16];
            const __m512 q0 = _mm512_load_ps(qf[g]);
            for (int kk = 0; kk < 16; ++kk) acc[kk] = _mm512_mul_ps(q0, _mm512_load_ps(kf + kk * d));
            for (int i = 1; i < nv; ++i) {
                const __m512 qi = _mm512_load_ps(qf[g] + 16 * i);
                for (int kk = 0; kk < 16; ++kk)
                    acc[kk] = _mm512_fmadd_ps(qi, _mm512_load_ps(kf + kk * d + 16 * i), acc[kk]);
            }
            _mm512_storeu_ps(s + g * nkeys + j, _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(scale)));
        }
    }
    for (; j < nkeys; ++j) {
        const B* kj = kc + slot(j) * d;
        __m512 acc[G];
        const __m512 k0 = vload(kj);
        for (int g = 0; g < G; ++g) acc[g] = _mm512_mul_ps(_mm512_load_ps(qf[g]), k0);
        for (int i = 1; i < nv; ++i) {
            const __m512 ki = vload(kj + 16 * i);
            for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(_mm512_load_ps(qf[g] + 16 * i), ki, acc[g]);
        }
        for (int g = 0; g < G; ++g) s[g * nkeys + j] = _mm512_reduce_add_ps(acc[g]) * scale;
    }
    float inv[G];
    for (int g = 0; g < G; ++g) inv[g] = 1.0f / softmax_avx512(s + g * nkeys, nkeys);
    if (nv % 4 == 0 && G <= 6)
        weighted_values_heads<B, G, 4>(vc, d, nkeys, slot, s, inv, out, out_stride);
    else if (nv % 2 == 0)
        weighted_values_heads<B, G, 2>(vc, d, nkeys, slot, s, inv, out, out_stride);
    else
        weighted_values_heads<B, G, 1>(vc, d, nkeys, slot, s, inv, out, out_stride);
}

template <typename B>
SPECDEC_AVX512F void attend_heads(int nh, const B* q, int64_t q_stride, const B* kc, const B* vc, int64_t d,
                                  int64_t nkeys, KeySlots slot, float scale, float* s, B* out, int64_t out_stride) {
    switch (nh) {
        case 1: attend_heads_avx512<B, 1>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, out, out_stride); break;
        case 2: attend_heads_avx512<B, 2>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, out, out_stride); break;
        case 3: attend_heads_avx512<B, 3>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, out, out_stride); break;
        case 4: attend_heads_avx512<B, 4>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, out, out_stride); break;
        case 5: attend_heads_avx512<B, 5>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, out, out_stride); break;
        case 6: attend_heads_avx512<B, 6>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, out, out_stride); break;
        case 7: attend_heads_avx512<B, 7>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, out, out_stride); break;
        default: attend_heads_avx512<B, 8>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, out, out_stride); break;
    }
}

// AVX-512 BF16 (Zen 4, Sapphire Rapids and later), bf16 caches only: the same walk as attend_heads_avx512 with
// vdpbf16ps doing two multiply-adds per lane. A score is the pair-wise chain of dot products over d (q and k are
// bf16, so every product is exact), its lanes summed by the same fixed tree; the values are weighed by the
// softmax's numerators rounded to bf16 (as ATen's flash attention and FlashAttention round P before P.V), taken two
// keys at a time, and divided by the sum of those rounded weights, so the output stays a convex combination. Every
// number is still computed per (row, head) and per key in one fixed way: a row's bits do not depend on the rows
// beside it. Half the multiply instructions of the fp32 walk, and no conversion of the keys.
template <int G, int KB>   // KB keys' chains at once (G * KB accumulators in registers)
SPECDEC_AVX512BF16 inline void score_keys_dp(const uint16_t* qb, const uint16_t* const* keys, int nq, __m512* acc) {
    for (int i = 0; i < nq; ++i) {
        __m512bh kv[KB];
        for (int b = 0; b < KB; ++b) kv[b] = (__m512bh)_mm512_loadu_si512(keys[b] + 32 * i);
        for (int g = 0; g < G; ++g) {
            const __m512bh qg = (__m512bh)_mm512_load_si512(qb + g * 256 + 32 * i);
            for (int b = 0; b < KB; ++b)
                acc[g * KB + b] = _mm512_dpbf16_ps(i ? acc[g * KB + b] : _mm512_setzero_ps(), qg, kv[b]);
        }
    }
}

template <int G, int C>   // C chunks of 32 columns per pass over the keys (G * 2C accumulators)
SPECDEC_AVX512BF16 void weighted_values_dp(const uint16_t* vc, int64_t d, int64_t nkeys, KeySlots slot,
                                           const uint16_t* w, int64_t wstride, const float* inv, uint16_t* out,
                                           int64_t out_stride) {
    const int nc = int(d / 32);
    const __m512i lo_idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi_idx = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int c0 = 0; c0 < nc; c0 += C) {
        __m512 o[G][2 * C];
        for (int g = 0; g < G; ++g)
            for (int c = 0; c < 2 * C; ++c) o[g][c] = _mm512_setzero_ps();
        for (int64_t j = 0; j < nkeys; j += 2) {
            const uint16_t* va = vc + slot(j) * d + 32 * c0;
            const uint16_t* vb = j + 1 < nkeys ? vc + slot(j + 1) * d + 32 * c0 : nullptr;   // an odd last key
            __m512bh pv[2 * C];
            for (int c = 0; c < C; ++c) {
                const __m512i a = _mm512_loadu_si512(va + 32 * c);
                const __m512i b = vb ? _mm512_loadu_si512(vb + 32 * c) : _mm512_setzero_si512();
                // per 128-bit lane L: columns 8L..8L+3 of both keys (lo), then 8L+4..8L+7 (hi), key j first
                pv[2 * c] = (__m512bh)_mm512_unpacklo_epi16(a, b);
                pv[2 * c + 1] = (__m512bh)_mm512_unpackhi_epi16(a, b);
            }
            for (int g = 0; g < G; ++g) {
                uint32_t pair;
                std::memcpy(&pair, w + g * wstride + j, sizeof(pair));   // weights of keys j, j + 1 (0 past the end)
                const __m512bh e = (__m512bh)_mm512_set1_epi32(int(pair));
                for (int c = 0; c < 2 * C; ++c) o[g][c] = _mm512_dpbf16_ps(o[g][c], e, pv[c]);
            }
        }
        for (int g = 0; g < G; ++g)
            for (int c = 0; c < C; ++c) {
                const __m512 s = _mm512_set1_ps(inv[g]);
                uint16_t* dst = out + g * out_stride + 32 * (c0 + c);
                vstore(dst, _mm512_mul_ps(_mm512_permutex2var_ps(o[g][2 * c], lo_idx, o[g][2 * c + 1]), s));
                vstore(dst + 16, _mm512_mul_ps(_mm512_permutex2var_ps(o[g][2 * c], hi_idx, o[g][2 * c + 1]), s));
            }
    }
}

template <int G>   // as attend_heads_avx512; s: G * nkeys floats; w: G * (nkeys + 32) bf16 of scratch
SPECDEC_AVX512BF16 void attend_heads_dp(const uint16_t* q, int64_t q_stride, const uint16_t* kc, const uint16_t* vc,
                                        int64_t d, int64_t nkeys, KeySlots slot, float scale, float* s, uint16_t* w,
                                        uint16_t* out, int64_t out_stride) {
    constexpr int KB = G <= 6 ? 4 : 2;
    const int nq = int(d / 32);
    alignas(64) uint16_t qb[G * 256];
    for (int g = 0; g < G; ++g) std::memcpy(qb + g * 256, q + g * q_stride, sizeof(uint16_t) * d);
    alignas(64) __m512 part[G][16];   // sixteen keys' lane partials per head
    int64_t j = 0;
    for (; j + 16 <= nkeys; j += 16) {
        for (int kk = 0; kk < 16; kk += KB) {
            const uint16_t* keys[KB];
            for (int b = 0; b < KB; ++b) keys[b] = kc + slot(j + kk + b) * d;
            __m512 acc[G * KB];
            score_keys_dp<G, KB>(qb, keys, nq, acc);
            for (int g = 0; g < G; ++g)
                for (int b = 0; b < KB; ++b) part[g][kk + b] = acc[g * KB + b];
        }
        for (int g = 0; g < G; ++g)
            _mm512_storeu_ps(s + g * nkeys + j, _mm512_mul_ps(reduce16(part[g]), _mm512_set1_ps(scale)));
    }
    for (; j < nkeys; ++j) {   // the same chain per key; the same tree over its lanes as reduce16's
        const uint16_t* keys[1] = {kc + slot(j) * d};
        __m512 acc[G];
        score_keys_dp<G, 1>(qb, keys, nq, acc);
        for (int g = 0; g < G; ++g) s[g * nkeys + j] = _mm512_reduce_add_ps(acc[g]) * scale;
    }
    const int64_t wstride = nkeys + 32;
    float inv[G];
    for (int g = 0; g < G; ++g) {
        float* sg = s + g * nkeys;
        softmax_avx512(sg, nkeys);
        inv[g] = 1.0f / specdec::bf16_weights(sg, nkeys, w + g * wstride);
    }
    if (nq % 2 == 0 && G <= 6)
        weighted_values_dp<G, 2>(vc, d, nkeys, slot, w, wstride, inv, out, out_stride);
    else
        weighted_values_dp<G, 1>(vc, d, nkeys, slot, w, wstride, inv, out, out_stride);
}

SPECDEC_AVX512BF16 void attend_heads_bf16(int nh, const uint16_t* q, int64_t q_stride, const uint16_t* kc,
                                          const uint16_t* vc, int64_t d, int64_t nkeys, KeySlots slot, float scale,
                                          float* s, uint16_t* w, uint16_t* out, int64_t out_stride) {
    switch (nh) {
        case 1: attend_heads_dp<1>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, w, out, out_stride); break;
        case 2: attend_heads_dp<2>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, w, out, out_stride); break;
        case 3: attend_heads_dp<3>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, w, out, out_stride); break;
        case 4: attend_heads_dp<4>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, w, out, out_stride); break;
        case 5: attend_heads_dp<5>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, w, out, out_stride); break;
        case 6: attend_heads_dp<6>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, w, out, out_stride); break;
        case 7: attend_heads_dp<7>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, w, out, out_stride); break;
        default: attend_heads_dp<8>(q, q_stride, kc, vc, d, nkeys, slot, scale, s, w, out, out_stride); break;
    }
}

// Eight keys' scores at once: a[j] (8 floats) holds key j's lane partials; lane j of the result is their sum by one
// tree (in each 128-bit half elements 0+2 and 1+3, then the two; then the halves).
SPECDEC_AVX2F inline __m256 sum8(const float* a) {
    __m256 t[4], u[2];
    for (int i = 0; i < 4; ++i) {
        const __m256 x = _mm256_loadu_ps(a + 16 * i), y = _mm256_loadu_ps(a + 16 * i + 8);
        t[i] = _mm256_add_ps(_mm256_unpacklo_ps(x, y), _mm256_unpackhi_ps(x, y));
    }
    for (int i = 0; i < 2; ++i) {   // half h of u[i]: keys 4i .. 4i + 3, their half-h sums
        const __m256 x = t[2 * i], y = t[2 * i + 1];
        u[i] = _mm256_add_ps(_mm256_shuffle_ps(x, y, 0x44), _mm256_shuffle_ps(x, y, 0xEE));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

// The AVX2 + FMA kernels: 8 lanes, 8 keys a score block, 16 registers (hence the smaller register blocks).
struct Avx2 {
    static constexpr int kLanes = 8;

    template <int NP>   // NP pairs x 4 keys of chains, kept in registers
    SPECDEC_AVX2F static void chains(const float* qf, const float* const* keys, int64_t d, float* A) {
        const int nv = int(d / 8);
        __m256 acc[NP][4];
        for (int p = 0; p < NP; ++p) {
            const __m256 q0 = _mm256_loadu_ps(qf + p * d);
            for (int j = 0; j < 4; ++j) acc[p][j] = _mm256_mul_ps(q0, _mm256_loadu_ps(keys[j]));
        }
        for (int i = 1; i < nv; ++i) {
            __m256 qi[NP];
            for (int p = 0; p < NP; ++p) qi[p] = _mm256_loadu_ps(qf + p * d + 8 * i);
            for (int j = 0; j < 4; ++j) {
                const __m256 k = _mm256_loadu_ps(keys[j] + 8 * i);
                for (int p = 0; p < NP; ++p) acc[p][j] = _mm256_fmadd_ps(qi[p], k, acc[p][j]);
            }
        }
        for (int p = 0; p < NP; ++p)
            for (int j = 0; j < 4; ++j) _mm256_storeu_ps(A + (p * 8 + j) * 8, acc[p][j]);
    }

    SPECDEC_AVX2F static void scores(const float* qf, int np, const float* const* keys, int nk, int64_t d,
                                     float scale, float* const* s, int64_t j0, float* A) {
        for (int p = 0; p < np; p += 2)
            for (int j = 0; j < 8; j += 4) {
                if (np - p >= 2) chains<2>(qf + p * d, keys + j, d, A + (p * 8 + j) * 8);
                else chains<1>(qf + p * d, keys + j, d, A + (p * 8 + j) * 8);
            }
        const __m256 vscale = _mm256_set1_ps(scale);
        alignas(32) float r[8];
        for (int p = 0; p < np; ++p) {
            _mm256_store_ps(r, _mm256_mul_ps(sum8(A + p * 64), vscale));
            std::memcpy(s[p] + j0, r, sizeof(float) * nk);
        }
    }

    template <int PB, int C>
    SPECDEC_AVX2F static void value_block(const float* const* vrows, int64_t j0, int64_t j1, const float* const* e,
                                          float* const* o, int c0) {
        __m256 acc[PB][C];
        for (int p = 0; p < PB; ++p)
            for (int c = 0; c < C; ++c) acc[p][c] = _mm256_loadu_ps(o[p] + 8 * (c0 + c));
        for (int64_t j = j0; j < j1; ++j) {
            const float* vj = vrows[j - j0] + 8 * c0;
            __m256 vv[C];
            for (int c = 0; c < C; ++c) vv[c] = _mm256_loadu_ps(vj + 8 * c);
            for (int p = 0; p < PB; ++p) {
                const __m256 w = _mm256_set1_ps(e[p][j]);
                for (int c = 0; c < C; ++c) acc[p][c] = _mm256_fmadd_ps(w, vv[c], acc[p][c]);
            }
        }
        for (int p = 0; p < PB; ++p)
            for (int c = 0; c < C; ++c) _mm256_storeu_ps(o[p] + 8 * (c0 + c), acc[p][c]);
    }

    SPECDEC_AVX2F static void values(const float* const* vrows, int64_t d, int64_t j0, int64_t j1,
                                     const float* const* e, float* const* o, int np) {
        const int nv = int(d / 8);
        for (int p0 = 0; p0 < np; p0 += 4)
            for (int c0 = 0; c0 < nv; c0 += 2) {
                if (nv - c0 < 2) {
                    for (int p = p0; p < std::min(np, p0 + 4); ++p)
                        value_block<1, 1>(vrows, j0, j1, e + p, o + p, c0);
                    continue;
                }
                switch (std::min(4, np - p0)) {
                    case 4: value_block<4, 2>(vrows, j0, j1, e + p0, o + p0, c0); break;
                    case 3: value_block<3, 2>(vrows, j0, j1, e + p0, o + p0, c0); break;
                    case 2: value_block<2, 2>(vrows, j0, j1, e + p0, o + p0, c0); break;
                    default: value_block<1, 2>(vrows, j0, j1, e + p0, o + p0, c0); break;
                }
            }
    }

    SPECDEC_AVX2F static float softmax(float* s, int64_t n) {
        float m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
        const __m256 vm = _mm256_set1_ps(m);
        __m256 vsum = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
            const __m256 e = v2::vexp(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
            _mm256_storeu_ps(s + j, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        if (j < n) {   // the tail through a buffer padded with -inf (e^-inf = 0)
            alignas(32) float t[8];
            for (int i = 0; i < 8; ++i) t[i] = j + i < n ? s[j + i] : -INFINITY;
            const __m256 e = v2::vexp(_mm256_sub_ps(_mm256_load_ps(t), vm));
            _mm256_store_ps(t, e);
            for (int i = 0; j + i < n; ++i) s[j + i] = t[i];
            vsum = _mm256_add_ps(vsum, e);
        }
        return v2::hsum(vsum);
    }

    template <typename B>
    SPECDEC_AVX2F static void store(const float* o, float inv, int64_t d, B* dst) {
        const __m256 v = _mm256_set1_ps(inv);
        for (int64_t i = 0; i < d; i += 8) v2::vstore(dst + i, _mm256_mul_ps(_mm256_loadu_ps(o + i), v));
    }

    template <typename B>
    SPECDEC_AVX2F static void to_f32(const B* x, int64_t d, float* out) {
        for (int64_t i = 0; i < d; i += 8) _mm256_storeu_ps(out + i, v2::vload(x + i));
    }
};

// Scratch of one thread, grown as needed.
struct RowsScratch {
    std::vector<float> qf, s, o, A, kf, vf, zero;
};

// Keys or values j0 .. j0 + n of a row (slots `slot`) as fp32 row pointers: into the cache when it holds fp32, else
// converted once into buf, where every pair of the task reads them.
template <typename B>
void rows_f32(const B* cache, int64_t d, KeySlots slot, int64_t j0, int n, float* buf, const float** ptrs) {
    for (int j = 0; j < n; ++j) {
        const B* src = cache + slot(j0 + j) * d;
        if constexpr (std::is_same_v<B, float>) {
            ptrs[j] = src;
        } else {
            Avx2::to_f32(src, d, buf + j * d);
            ptrs[j] = buf + j * d;
        }
    }
}

// rows[0 .. nrows) of one sequence, query heads 0 .. nh - 1 of q / out (one KV group, caches kc / vc), on the AVX2
// kernels: scores of the keys every row has (the prefix they share, a block of 8 keys at a time) for every pair,
// then each row's own keys for its pairs; the softmax per pair; the values of the shared keys a chunk at a time for
// every pair, then each row's own keys.
template <typename B>
void attend_rows(const RowKeys* rows, int nrows, int nh, const B* q, int64_t qs0, int64_t qs1, const B* kc,
                 const B* vc, int64_t d, float scale, B* out, int64_t os0, RowsScratch& w) {
    constexpr int L = Avx2::kLanes;
    constexpr int64_t kChunk = 32;                 // value rows converted at a time (16 KB at d = 128: L1)
    const int np = nrows * nh;
    int64_t shared = rows[0].nkeys, most = 0;      // keys every row has at the same slots; the longest row
    int64_t lo = rows[0].first;                    // the first key any row attends (a window's start)
    for (int r = 0; r < nrows; ++r) {
        shared = std::min(shared, std::min(rows[r].slots.nprefix, rows[r].nkeys));
        most = std::max(most, rows[r].nkeys);
        lo = std::min(lo, rows[r].first);
    }
    shared = std::max(shared, lo);
    const int64_t stride = most + L;
    w.qf.resize(size_t(np) * d);
    w.o.assign(size_t(np) * d, 0.f);
    if (int64_t(w.s.size()) < np * stride) w.s.resize(size_t(np * stride));
    w.A.resize(size_t(L * L) * np);
    w.kf.resize(size_t(L) * d);
    w.vf.resize(size_t(kChunk) * d);
    w.zero.assign(size_t(d), 0.f);                 // the key that pads a short score block
    std::vector<float*> s(np), o(np);
    for (int r = 0, p = 0; r < nrows; ++r)
        for (int h = 0; h < nh; ++h, ++p) {
            Avx2::to_f32(q + rows[r].row * qs0 + h * qs1, d, w.qf.data() + p * d);
            s[p] = w.s.data() + p * stride;
            o[p] = w.o.data() + p * d;
        }
    const KeySlots direct{INT64_MAX, nullptr};
    const float* ptrs[kChunk];
    auto score_keys = [&](KeySlots slot, int64_t j0, int64_t j1, int first_pair, int pairs) {
        for (; j0 < j1; j0 += L) {
            const int nk = int(std::min<int64_t>(L, j1 - j0));
            rows_f32<B>(kc, d, slot, j0, nk, w.kf.data(), ptrs);
            for (int j = nk; j < L; ++j) ptrs[j] = w.zero.data();
            Avx2::scores(w.qf.data() + first_pair * d, pairs, ptrs, nk, d, scale, s.data() + first_pair, j0, w.A.data());
        }
    };
    auto value_keys = [&](KeySlots slot, int64_t j0, int64_t j1, int first_pair, int pairs) {
        for (; j0 < j1; j0 += kChunk) {
            const int n = int(std::min<int64_t>(kChunk, j1 - j0));
            rows_f32<B>(vc, d, slot, j0, n, w.vf.data(), ptrs);
            Avx2::values(ptrs, d, j0, j0 + n, s.data() + first_pair, o.data() + first_pair, pairs);
        }
    };
    // keys lo .. first - 1 of a row outside its window are scored with the block's and then weigh exactly 0: its
    // softmax runs over its own keys, and a +0 accumulator plus 0 x v stays +0 until its first key, so the row's
    // bits equal those it gets alone (where lo is its own first)
    score_keys(direct, lo, shared, 0, np);
    for (int r = 0; r < nrows; ++r) score_keys(rows[r].slots, shared, rows[r].nkeys, r * nh, nh);
    std::vector<float> inv(np);
    for (int r = 0, p = 0; r < nrows; ++r)
        for (int h = 0; h < nh; ++h, ++p) {
            inv[p] = 1.0f / Avx2::softmax(s[p] + rows[r].first, rows[r].nkeys - rows[r].first);
            std::fill(s[p] + lo, s[p] + rows[r].first, 0.f);
        }
    value_keys(direct, lo, shared, 0, np);
    for (int r = 0; r < nrows; ++r) value_keys(rows[r].slots, shared, rows[r].nkeys, r * nh, nh);
    for (int r = 0, p = 0; r < nrows; ++r)
        for (int h = 0; h < nh; ++h, ++p) Avx2::store(o[p], inv[p], d, out + rows[r].row * os0 + h * d);
}
#endif

#ifdef SPECDEC_HAVE_AVX512
bool has_bf16_dot() { return specdec::cpu_has_avx512_bf16(); }
#else
bool has_bf16_dot() { return false; }
#endif

// Rows of one sequence attend together in blocks of up to kRowBlock (the scores of a block: rows x heads x keys
// floats per thread); a task is one block and the query heads of one KV group (or part of them). On AMX tiles a
// block is kTileBlock rows: its groups of rows share one interleaving of the values (attention_amx.cpp).
constexpr int64_t kRowBlock = 8, kTileBlock = 32;

// Whether rows of this dtype and head size take the AMX-BF16 tiles under impl (those whose keys start at key 0).
bool on_tiles(int64_t impl, at::ScalarType dtype, int64_t d) {
    return dtype == at::kBFloat16 && d % 32 == 0 && d <= 256 &&
           (impl == specdec::kOpsAmx || (impl == specdec::kOpsAuto && specdec::cpu_has_amx_bf16()));
}

struct DecodeTask {
    int64_t seq;           // its sequence
    int64_t first, nrows;  // its rows: row_keys[first .. first + nrows)
    int64_t head, nh;      // query heads head .. head + nh - 1, all of one KV group
};

// Query heads per task: a whole KV group (at most 8), split further only while the tasks are fewer than the
// threads.
int64_t heads_per_task(int64_t blocks, int64_t hq, int64_t hkv) {
    const int64_t group = hq / hkv, threads = at::get_num_threads();
    int64_t per = std::min<int64_t>(group, 8);
    while (per > 1 && blocks * hkv * ((group + per - 1) / per) < threads) per = (per + 1) / 2;
    return per;
}

// Every (row block, KV group's heads) of the decode runs, split over threads; each task reads its sequence's cache
// of this layer once for its rows and heads. The AVX2 and scalar paths attend row by row and head by head.
template <typename T, typename B>
void decode_attention(const torch::Tensor& q, torch::Tensor& out, const std::vector<DecodeTask>& tasks,
                      const std::vector<RowKeys>& row_keys, const std::vector<const T*>& kbase,
                      const std::vector<const T*>& vbase, const std::vector<int64_t>& caps, int64_t hq, int64_t hkv,
                      int64_t d, int64_t impl) {
    const T* qp = q.data_ptr<T>();
    T* op = out.data_ptr<T>();
    const int64_t qs0 = q.stride(0), qs1 = q.stride(1), group = hq / hkv;
    const float scale = 1.0f / std::sqrt(float(d));
    // impl 4 (AVX-512 BF16) is attention's own; auto takes it for bf16 caches where the CPU has vdpbf16ps
    TORCH_CHECK(impl != specdec::kOpsAvx512Bf16 || has_bf16_dot(), "ragged_attention: this CPU lacks AVX-512 BF16");
    TORCH_CHECK(impl != specdec::kOpsAmx || specdec::cpu_has_amx_bf16(),
                "ragged_attention: this CPU (or its kernel) does not run AMX-BF16");
    // impl 5 (AMX-BF16 tiles) likewise, ahead of it: every row whose keys start at key 0 (a sliding window's rows
    // past its width keep vdpbf16ps); either way the path is a function of the row, never of its neighbours
    const bool fits = std::is_same_v<B, uint16_t> && d % 32 == 0 && d <= 256;
    const bool tiles = on_tiles(impl, q.scalar_type(), d);   // bf16 and such a d too
    const bool dot = fits && (tiles || impl == specdec::kOpsAvx512Bf16 || (impl == specdec::kOpsAuto && has_bf16_dot()));
    const int path = specdec::ops_path(impl >= specdec::kOpsAvx512Bf16 ? specdec::kOpsAvx512 : impl,
                                       d % 16 == 0 && d <= 256, d % 8 == 0 && d <= 256, "ragged_attention");
    at::parallel_for(0, int64_t(tasks.size()), 1, [&](int64_t t0, int64_t t1) {
        // each thread's buffers, kept between calls: a step calls this once per layer, and allocating them afresh
        // put glibc's malloc in every one-token step's profile (the sizes only grow with the context)
        thread_local std::vector<float> scratch;
        thread_local std::vector<uint16_t> weights;   // the bf16 path's rounded softmax weights
#ifdef SPECDEC_HAVE_AVX512
        thread_local RowsScratch rows_scratch;
#endif
        thread_local specdec::TileScratch tile_scratch;
        thread_local std::vector<specdec::TileRow> tile_rows;
        for (int64_t t = t0; t < t1; ++t) {
            const DecodeTask& task = tasks[t];
            const int64_t g = task.head / group, cap = caps[task.seq];
            const T* kc = kbase[task.seq] + g * cap * d;
            const T* vc = vbase[task.seq] + g * cap * d;
            if (tiles) {
                tile_rows.clear();
                for (int64_t r = task.first; r < task.first + task.nrows; ++r) {
                    const RowKeys& rk = row_keys[r];
                    if (rk.first != 0) continue;
                    tile_rows.push_back({reinterpret_cast<const uint16_t*>(qp + rk.row * qs0 + task.head * qs1),
                                         reinterpret_cast<uint16_t*>(op + rk.row * hq * d + task.head * d), rk.nkeys,
                                         rk.slots.nprefix, rk.slots.path});
                }
                if (!tile_rows.empty())
                    specdec::attend_tiles(tile_rows.data(), int(tile_rows.size()), int(task.nh), qs1, d,
                                          reinterpret_cast<const uint16_t*>(kc), reinterpret_cast<const uint16_t*>(vc),
                                          d, scale, tile_scratch);
            }
#ifdef SPECDEC_HAVE_AVX512
            if (path == specdec::kOpsAvx2) {
                attend_rows<B>(row_keys.data() + task.first, int(task.nrows), int(task.nh),
                               reinterpret_cast<const B*>(qp + task.head * qs1), qs0, qs1,
                               reinterpret_cast<const B*>(kc), reinterpret_cast<const B*>(vc), d, scale,
                               reinterpret_cast<B*>(op + task.head * d), hq * d, rows_scratch);
                continue;
            }
#endif
            for (int64_t r = task.first; r < task.first + task.nrows; ++r) {
                const RowKeys& rk = row_keys[r];
                if (tiles && rk.first == 0) continue;   // attended above
                const int64_t nkeys = rk.nkeys - rk.first;
                const KeySlots slots = rk.window_slots();
                if (int64_t(scratch.size()) < task.nh * nkeys) scratch.resize(task.nh * nkeys + 256);
#ifdef SPECDEC_HAVE_AVX512
                if constexpr (std::is_same_v<B, uint16_t>) {
                    if (dot) {
                        if (int64_t(weights.size()) < task.nh * (nkeys + 32)) weights.resize(task.nh * (nkeys + 32) + 256);
                        attend_heads_bf16(int(task.nh), reinterpret_cast<const B*>(qp + rk.row * qs0 + task.head * qs1),
                                          qs1, reinterpret_cast<const B*>(kc), reinterpret_cast<const B*>(vc), d, nkeys,
                                          slots, scale, scratch.data(), weights.data(),
                                          reinterpret_cast<B*>(op + rk.row * hq * d + task.head * d), d);
                        continue;
                    }
                }
                if (path == specdec::kOpsAvx512) {
                    attend_heads<B>(int(task.nh), reinterpret_cast<const B*>(qp + rk.row * qs0 + task.head * qs1),
                                    qs1, reinterpret_cast<const B*>(kc), reinterpret_cast<const B*>(vc), d, nkeys,
                                    slots, scale, scratch.data(),
                                    reinterpret_cast<B*>(op + rk.row * hq * d + task.head * d), d);
                    continue;
                }
#endif
                for (int64_t h = task.head; h < task.head + task.nh; ++h)
                    attend_scalar<T>(qp + rk.row * qs0 + h * qs1, kc, vc, d, nkeys, slots, scale, scratch.data(),
                                     op + rk.row * hq * d + h * d);
            }
        }
    });
}

// Rows [row, row + t) of x [N, Hkv, D] into cache [Hkv, capacity, D] at positions [start, start + t). Where the
// dtypes match and each head's D values are contiguous on both sides (always, for the models' qkv), one memcpy per
// row and head: the views and TensorIterator copy_ this replaces cost ~10 us a layer, a few percent of a draft step.
void write_rows(torch::Tensor& cache, int64_t start, const torch::Tensor& x, int64_t row, int64_t t) {
    const int64_t hkv = x.size(1), d = x.size(2);
    if (cache.scalar_type() != x.scalar_type() || cache.stride(2) != 1 || x.stride(2) != 1 || cache.size(0) != hkv ||
        cache.size(2) != d) {
        cache.narrow(1, start, t).copy_(x.narrow(0, row, t).transpose(0, 1));
        return;
    }
    const int64_t es = int64_t(x.element_size()), cs0 = cache.stride(0), cs1 = cache.stride(1);
    const int64_t xs0 = x.stride(0), xs1 = x.stride(1);
    char* cp = static_cast<char*>(cache.data_ptr());
    const char* xp = static_cast<const char*>(x.data_ptr());
    for (int64_t j = 0; j < t; ++j)
        for (int64_t h = 0; h < hkv; ++h)
            std::memcpy(cp + (h * cs0 + (start + j) * cs1) * es, xp + ((row + j) * xs0 + h * xs1) * es, size_t(d * es));
}

// q: [N, Hq, D]; k, v: [N, Hkv, D] (this forward's rows, flat over sequences, in sequence order)
// per sequence i: k_caches[i], v_caches[i] its whole cache [L, Hkv, capacity, D] (layer picks the layer),
//   starts[i] the cache position of its first new row, counts[i] its rows
// per run r (rows of one sequence attending over the same key range): run_seq[r] the sequence, run_row[r] its
//   first row in the flat batch, run_rows[r] its rows, run_keys[r] the keys attended, run_masks[r] an additive
//   mask [rows_r, keys_r] (rows_r >= run_rows[r]: zero-padded queries) or None; run_trees[r] (decode runs of a
//   token tree) int64 [run_rows[r], 1 + W]: per row p, the number of leading cache slots it attends (0..p-1), then
//   the slots of its path in depth order (its speculative ancestors, then itself), -1 padded; None for causal rows
torch::Tensor ragged_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const std::vector<torch::Tensor>& k_caches, const std::vector<torch::Tensor>& v_caches,
                               int64_t layer, const std::vector<int64_t>& starts, const std::vector<int64_t>& counts,
                               const std::vector<int64_t>& run_seq, const std::vector<int64_t>& run_row,
                               const std::vector<int64_t>& run_rows, const std::vector<int64_t>& run_keys,
                               const std::vector<c10::optional<torch::Tensor>>& run_masks,
                               const std::vector<bool>& run_decode,
                               const std::vector<c10::optional<torch::Tensor>>& run_trees, int64_t impl,
                               int64_t window) {
    const size_t nseq = starts.size(), nrun = run_seq.size();
    TORCH_CHECK(k_caches.size() == nseq && v_caches.size() == nseq && counts.size() == nseq,
                "ragged_attention: one cache, start and count per sequence");
    TORCH_CHECK(run_row.size() == nrun && run_rows.size() == nrun && run_keys.size() == nrun && run_masks.size() == nrun &&
                run_decode.size() == nrun && run_trees.size() == nrun,
                "ragged_attention: one entry per run in every run list");
    TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "ragged_attention: q, k, v must be [N, heads, D]");
    const int64_t n = q.size(0), hq = q.size(1), d = q.size(2);
    std::vector<torch::Tensor> kcs(nseq), vcs(nseq);
    int64_t row = 0;
    for (size_t i = 0; i < nseq; ++i) {   // this forward's K/V into each sequence's cache
        const int64_t t = counts[i], start = starts[i];
        TORCH_CHECK(row + t <= n, "ragged_attention: counts exceed the rows");
        kcs[i] = k_caches[i].select(0, layer);                                              // [Hkv, capacity, D]
        vcs[i] = v_caches[i].select(0, layer);
        TORCH_CHECK(start + t <= kcs[i].size(1), "ragged_attention: cache too small");
        write_rows(kcs[i], start, k, row, t);
        write_rows(vcs[i], start, v, row, t);
        row += t;
    }
    TORCH_CHECK(row == n, "ragged_attention: counts do not cover the rows");
    auto out = torch::empty({n, hq * d}, q.options());
    std::vector<int64_t> first_row(nseq);
    for (size_t i = 0, acc = 0; i < nseq; acc += counts[i], ++i) first_row[i] = int64_t(acc);
    std::vector<RowKeys> row_keys;                 // the decode runs' rows, run by run
    std::vector<std::array<int64_t, 3>> blocks;    // (sequence, first, rows) of up to block_rows rows of one run
    const int64_t block_rows = on_tiles(impl, q.scalar_type(), d) ? kTileBlock : kRowBlock;
    const int64_t hkv = k.size(1);
    TORCH_CHECK(hkv >= 1 && hq % hkv == 0, "ragged_attention: query heads must be a multiple of KV heads");
    TORCH_CHECK(window >= 0, "ragged_attention: window must be >= 0 (0: none)");
    // a row with nkeys keys (position nkeys - 1) in a window of W attends from key nkeys - W
    auto window_start = [window](int64_t nkeys) { return window > 0 ? std::max<int64_t>(0, nkeys - window) : 0; };
    for (size_t r = 0; r < nrun; ++r) {
        const int64_t i = run_seq[r], r0 = run_row[r], t = run_rows[r], key_len = run_keys[r];
        TORCH_CHECK(i >= 0 && size_t(i) < nseq && r0 >= first_row[i] && t >= 1 && r0 + t <= first_row[i] + counts[i],
                    "ragged_attention: bad run");
        if (run_decode[r]) {          // the kernel above, after the prompt runs
            const auto& tree = run_trees[r];
            if (tree.has_value() && tree->defined()) {
                TORCH_CHECK(tree->scalar_type() == torch::kLong && tree->dim() == 2 && tree->size(0) == t &&
                            tree->size(1) >= 2 && tree->is_contiguous(),
                            "ragged_attention: a tree run needs int64 [rows, 1 + W] key lists");
                const int64_t w = tree->size(1) - 1, cap = kcs[i].size(1);
                const int64_t* lists = tree->data_ptr<int64_t>();
                for (int64_t row = 0; row < t; ++row) {
                    const int64_t prefix = lists[row * (w + 1)];
                    const int64_t* path = lists + row * (w + 1) + 1;
                    int64_t len = 0;
                    while (len < w && path[len] >= 0) {
                        TORCH_CHECK(path[len] >= prefix && path[len] < cap, "ragged_attention: tree slot out of range");
                        ++len;
                    }
                    TORCH_CHECK(prefix >= 0 && prefix + len >= 1 && prefix <= cap, "ragged_attention: bad tree row");
                    row_keys.push_back({r0 + row, prefix + len, KeySlots{prefix, path}, window_start(prefix + len)});
                }
            } else {
                for (int64_t row = r0; row < r0 + t; ++row) {
                    const int64_t pos = starts[i] + row - first_row[i];
                    row_keys.push_back({row, pos + 1, KeySlots{pos + 1, nullptr}, window_start(pos + 1)});
                }
            }
            for (int64_t b = int64_t(row_keys.size()) - t; b < int64_t(row_keys.size()); b += block_rows)
                blocks.push_back({int64_t(i), b, std::min(block_rows, int64_t(row_keys.size()) - b)});
            continue;
        }
        TORCH_CHECK(key_len <= kcs[i].size(1), "ragged_attention: cache too small");
        torch::Tensor qs = q.narrow(0, r0, t).transpose(0, 1);                               // [Hq, T, D]
        const auto& mask = run_masks[r];
        c10::optional<torch::Tensor> m;
        if (mask.has_value() && mask->defined()) {
            m = *mask;
            const int64_t rows = mask->size(0);
            if (rows > t) {   // zero-padded query rows, as the eager code builds them
                auto padded = torch::zeros({hq, rows, d}, q.options());
                padded.narrow(1, 0, t).copy_(qs);
                qs = padded;
            }
        }
        const int64_t pos0 = starts[i] + r0 - first_row[i];                                 // the run's first position
        if (window > 0 && window_start(pos0 + t) > 0) {
            // the window as an additive mask beside the causal one: row p drops keys <= p - W (padded query rows,
            // whose outputs are dropped, keep every key so that none is all -inf)
            const int64_t rows = m.has_value() ? m->size(0) : t;
            auto near = torch::arange(key_len, torch::kLong).unsqueeze(0) >
                        (torch::arange(pos0, pos0 + rows, torch::kLong) - window).unsqueeze(1);
            near.narrow(0, t, rows - t).fill_(true);
            auto wm = torch::zeros({rows, key_len}, q.options()).masked_fill_(near.logical_not(), -INFINITY);
            m = m.has_value() ? *m + wm : wm;
        }
        auto o = at::scaled_dot_product_attention(qs.unsqueeze(0), kcs[i].narrow(1, 0, key_len).unsqueeze(0),
                                                  vcs[i].narrow(1, 0, key_len).unsqueeze(0), m, 0.0, false,
                                                  c10::nullopt, true);                     // [1, Hq, rows, D]
        out.narrow(0, r0, t).view({t, hq, d}).copy_(o.select(0, 0).narrow(1, 0, t).transpose(0, 1));
    }
    std::vector<DecodeTask> tasks;
    const int64_t per = heads_per_task(int64_t(blocks.size()), hq, hkv), group = hq / hkv;
    for (const auto& b : blocks)
        for (int64_t g = 0; g < hkv; ++g)
            for (int64_t h = g * group; h < (g + 1) * group; h += per)
                tasks.push_back({b[0], b[1], b[2], h, std::min(per, (g + 1) * group - h)});
    // at::parallel_for hands each thread one contiguous range of tasks, and a prompt chunk's later rows attend over
    // more keys (on two threads, the second half of a first chunk's rows holds three quarters of its work): taken
    // from both ends in turn (first, last, second, second last, ...), every range holds early and late rows alike
    std::vector<DecodeTask> order;
    order.reserve(tasks.size());
    for (size_t a = 0, b = tasks.size(); a < b;) {
        order.push_back(tasks[a++]);
        if (a < b) order.push_back(tasks[--b]);
    }
    tasks.swap(order);
    if (!tasks.empty()) {
        TORCH_CHECK(q.stride(2) == 1 && q.scalar_type() == kcs[0].scalar_type(), "ragged_attention: q must match the cache");
        std::vector<int64_t> caps(nseq);
        for (size_t i = 0; i < nseq; ++i) {
            TORCH_CHECK(kcs[i].is_contiguous() && vcs[i].is_contiguous(), "ragged_attention: caches must be contiguous");
            caps[i] = kcs[i].size(1);
        }
        specdec::dispatch_float_bf16(q.scalar_type(), "ragged_attention (decode rows)", [&](auto* tag, auto* bits) {
            using T = std::remove_pointer_t<decltype(tag)>;
            using B = std::remove_pointer_t<decltype(bits)>;
            std::vector<const T*> kb(nseq), vb(nseq);
            for (size_t i = 0; i < nseq; ++i) {
                kb[i] = kcs[i].data_ptr<T>();
                vb[i] = vcs[i].data_ptr<T>();
            }
            decode_attention<T, B>(q, out, tasks, row_keys, kb, vb, caps, hq, kcs[0].size(0), d, impl);
        });
    }
    return out;
}

}  // namespace

namespace specdec {

void register_attention(pybind11::module_& m) {
    m.def("ragged_attention", &ragged_attention,
          "per sequence: write K/V into its cache, attend its rows over its keys; outputs gathered [N, Hq*D]",
          pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("k_caches"),
          pybind11::arg("v_caches"), pybind11::arg("layer"), pybind11::arg("starts"), pybind11::arg("counts"),
          pybind11::arg("run_seq"), pybind11::arg("run_row"), pybind11::arg("run_rows"), pybind11::arg("run_keys"),
          pybind11::arg("run_masks"), pybind11::arg("run_decode"), pybind11::arg("run_trees"),
          pybind11::arg("impl") = 0, pybind11::arg("window") = 0);
    m.def("has_amx_bf16", &specdec::cpu_has_amx_bf16,
          "the CPU runs attention on AMX-BF16 tiles (and Linux granted the tile state)");
}

}  // namespace specdec
