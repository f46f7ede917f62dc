// Attention of bf16 rows on AMX-BF16 tile multiplies (Intel Xeon from Sapphire Rapids on): the scores of up to 16
// (row, head) pairs against 16 keys, and the weighted values of those pairs over 32 keys, are one tile product per
// 32 of the head's dimensions or per 16 columns, where the vdpbf16ps walk (attention.cpp) takes one instruction per
// key and head or per key pair and 16 columns. A prompt chunk's attention, ~18% of a 1k-token prompt's time on two
// cores, is where that shows; decode and verification rows take the same path so that their bits are the prompt's.
//
// What a tile product computes, measured on the CPU (docs/benchmarks/amx/README.md): per output element and per
// TDPBF16PS, the products of the even pairs' halves are summed in k order, those of the odd halves likewise (each
// from +0, each step rounded to fp32, denormals flushed), and the accumulator then gains (even + odd). Per element,
// whatever the other rows and columns of the tile hold. So a score here is a fixed function of (q, key): chunks of 32
// dimensions in order, each chunk's two chains, then the sum -- the same whichever keys and rows share the tile. A
// value sum is a fixed function of the row's weights and values in key order, in products of 32 keys from key 0;
// keys past a row's own weigh +0 and add +0 to chains that start at +0, which changes no bit. The softmax is the
// vdpbf16ps walk's, per (row, head) over its own keys. So a row's result depends only on its position and keys --
// the invariant every attention path keeps (tests/test_cpu_ops.py, tests/test_trees.py).
//
// Linux grants the tile state on request (arch_prctl ARCH_REQ_XCOMP_PERM: amx_tiles.h, as for the int8 kernel).
#include "attention_amx.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#include <immintrin.h>

#include "amx_tiles.h"
#include "vec_math.h"

#define SPECDEC_AMXBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

namespace specdec {

bool cpu_has_amx_bf16() {
    static const bool ok = cpu_has_avx512_bf16() && amx::tiles_granted(amx::kBf16);
    return ok;
}

namespace {

using amx::TileConfig;

constexpr int kValueTiles = 6;   // tmm2..tmm7: accumulators of 16 columns each per pass over the keys
constexpr int kKeyAhead = 4;     // key blocks of 16 the score loop asks the memory system for ahead of its tile loads

// tmm0 += tmm1 . tmm(2 + c) is not expressible with a run-time tile number: one case per accumulator
SPECDEC_AMXBF16 inline void value_product(int c) {
    switch (c) {
        case 0: _tile_dpbf16ps(2, 0, 1); break;
        case 1: _tile_dpbf16ps(3, 0, 1); break;
        case 2: _tile_dpbf16ps(4, 0, 1); break;
        case 3: _tile_dpbf16ps(5, 0, 1); break;
        case 4: _tile_dpbf16ps(6, 0, 1); break;
        default: _tile_dpbf16ps(7, 0, 1); break;
    }
}
SPECDEC_AMXBF16 inline void value_store(int c, float* dst) {
    switch (c) {
        case 0: _tile_stored(2, dst, 64); break;
        case 1: _tile_stored(3, dst, 64); break;
        case 2: _tile_stored(4, dst, 64); break;
        case 3: _tile_stored(5, dst, 64); break;
        case 4: _tile_stored(6, dst, 64); break;
        default: _tile_stored(7, dst, 64); break;
    }
}

// Key j's cache slot for a group of rows: slots 0..nprefix - 1 are keys 0..nprefix - 1; a token tree's row (a group
// of its own) has its path after them.
struct Slots {
    int64_t nprefix;
    const int64_t* path;
    inline int64_t operator()(int64_t j) const { return j < nprefix ? j : path[j - nprefix]; }
};

// 16 columns of two keys' value rows (null: a key past the last, zeros) interleaved, key a's first: one 64-byte row
// of a value product's second operand.
SPECDEC_AMXBF16 inline void interleave16(const uint16_t* va, const uint16_t* vb, const __m512i pairs, uint16_t* dst) {
    const __m512i a = va ? _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)va)) : _mm512_setzero_si512();
    const __m512i b = vb ? _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)vb)) : _mm512_setzero_si512();
    _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(a, pairs, b));
}

// The values of keys 0 .. nkeys - 1 (slots 0 .. nkeys - 1) as the value products' second operand for every group of
// a task: key pair p's row holds (v[2p][c], v[2p + 1][c]) for each column c; zero from key nkeys to a multiple of 32.
SPECDEC_AMXBF16 void interleave_values(const uint16_t* vc, int64_t d, int64_t nkeys, const __m512i pairs,
                                       uint16_t* vt) {
    const int64_t span = (nkeys + 31) / 32 * 32;
    for (int64_t p = 0; p < span / 2; ++p) {
        const uint16_t* va = 2 * p < nkeys ? vc + 2 * p * d : nullptr;
        const uint16_t* vb = 2 * p + 1 < nkeys ? vc + (2 * p + 1) * d : nullptr;
        for (int64_t c = 0; c < d; c += 16)
            interleave16(va ? va + c : nullptr, vb ? vb + c : nullptr, pairs, vt + (p * d + c) * 2);
    }
}

SPECDEC_AMXBF16 inline __m512i pair_order() {   // element 2i: the first operand's i, 2i + 1: the second's
    alignas(64) uint16_t order[32];
    for (int i = 0; i < 16; ++i) order[2 * i] = uint16_t(i), order[2 * i + 1] = uint16_t(32 + i);
    return _mm512_load_si512(order);
}

// One group: nr rows x nh heads = P <= 16 (row, head) pairs, pair n = r * nh + h.
// vt: the values of keys 0 .. vt_keys - 1 with key pairs interleaved per column (interleave_values), or null.
SPECDEC_AMXBF16 void attend_group(const TileRow* rows, int nr, int nh, int64_t q_stride, int64_t out_stride,
                                  const uint16_t* kc, const uint16_t* vc, int64_t d, float scale, Slots slot,
                                  const uint16_t* vt, int64_t vt_keys, TileScratch& w) {
    const int P = nr * nh, dops = int(d / 32);
    int64_t maxkeys = 0;
    for (int r = 0; r < nr; ++r) maxkeys = std::max(maxkeys, rows[r].nkeys);
    const int64_t span = (maxkeys + 31) / 32 * 32;   // keys in whole value products; past maxkeys weigh 0, are 0
    if (int64_t(w.s.size()) < P * span) w.s.resize(size_t(P * span));
    if (int64_t(w.w.size()) < P * span) w.w.resize(size_t(P * span));
    w.qt.resize(size_t(dops) * 16 * P * 2);
    w.kbuf.resize(size_t(16 * d));
    w.vbuf.resize(size_t(kValueTiles) * 16 * 32);
    alignas(64) float cbuf[16 * 16];

    // The queries as the second operand of S^T = K Q^T: for 32 dimensions, tile row k holds dimension pair k of
    // every pair's query (the keys, the first operand, load straight from the cache rows).
    uint32_t* qt = reinterpret_cast<uint32_t*>(w.qt.data());
    for (int n = 0; n < P; ++n) {
        const uint16_t* q = rows[n / nh].q + (n % nh) * q_stride;
        for (int k = 0; k < dops * 16; ++k) std::memcpy(qt + k * P + n, q + 2 * k, 4);
    }

    TileConfig cfg{};
    cfg.palette = 1;
    cfg.rows[0] = 16, cfg.colsb[0] = uint16_t(4 * P);   // scores: 16 keys x P pairs
    cfg.rows[1] = 16, cfg.colsb[1] = 64;                 // 16 keys x 32 dimensions
    cfg.rows[2] = 16, cfg.colsb[2] = uint16_t(4 * P);   // 16 dimension pairs x P pairs
    amx::load_config(cfg);
    float* s = w.s.data();
    const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    const __m512 vscale = _mm512_set1_ps(scale);
    const int64_t direct = std::min(slot.nprefix, maxkeys);   // keys 0..direct - 1 lie in slots 0..direct - 1
    for (int64_t j0 = 0; j0 < maxkeys; j0 += 16) {
        const uint16_t* keys = kc + j0 * d;
        if (j0 + 16 > direct) {   // a partial block, or a tree row's path: gathered, zero past the last key
            for (int i = 0; i < 16; ++i) {
                if (j0 + i < maxkeys)
                    std::memcpy(w.kbuf.data() + i * d, kc + slot(j0 + i) * d, size_t(d) * 2);
                else
                    std::memset(w.kbuf.data() + i * d, 0, size_t(d) * 2);
            }
            keys = w.kbuf.data();
        }
        if (j0 + 16 * (kKeyAhead + 1) <= direct) {   // the keys kKeyAhead blocks on, while this block's products run
            const char* ahead = reinterpret_cast<const char*>(kc + (j0 + 16 * kKeyAhead) * d);
            for (int64_t b = 0; b < 16 * d * 2; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
        }
        _tile_zero(0);
        for (int o = 0; o < dops; ++o) {
            _tile_loadd(1, keys + 32 * o, d * 2);
            _tile_loadd(2, qt + o * 16 * P, 4 * P);
            _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, cbuf, 64);
        // column n of the 16 x P scores is pair n's row of 16 keys
        const int nk = int(std::min<int64_t>(16, maxkeys - j0));
        const __mmask16 keep = __mmask16((1u << nk) - 1);
        for (int n = 0; n < P; ++n)
            _mm512_mask_storeu_ps(s + n * span + j0, keep,
                                  _mm512_mul_ps(_mm512_i32gather_ps(column, cbuf + n, 4), vscale));
    }

    // the softmax per pair over its own keys, its weights rounded to bf16 (0 past them), as the vdpbf16ps walk
    float inv[16];
    for (int n = 0; n < P; ++n) {
        const int64_t nkeys = rows[n / nh].nkeys;
        float* sn = s + n * span;
        uint16_t* wn = w.w.data() + n * span;
        softmax_avx512(sn, nkeys);
        inv[n] = 1.0f / bf16_weights(sn, nkeys, wn);
        const int64_t written = (nkeys + 15) / 16 * 16;
        std::memset(wn + written, 0, size_t(span - written) * 2);
    }

    // O = W V over 32 keys a product: the weights as the first operand (P rows), values of key pairs interleaved per
    // column as the second (tile row k: keys j0 + 2k, j0 + 2k + 1 of 16 columns)
    cfg = TileConfig{};
    cfg.palette = 1;
    cfg.rows[0] = uint8_t(P), cfg.colsb[0] = 64;
    cfg.rows[1] = 16, cfg.colsb[1] = 64;
    for (int t = 2; t < 2 + kValueTiles; ++t) cfg.rows[t] = uint8_t(P), cfg.colsb[t] = 64;
    amx::load_config(cfg);
    const __m512i pairs = pair_order();
    const int ncol = int(d / 16);
    for (int c0 = 0; c0 < ncol; c0 += kValueTiles) {
        const int nc = std::min(kValueTiles, ncol - c0);
        for (int c = 0; c < nc; ++c) switch (c) {
                case 0: _tile_zero(2); break;
                case 1: _tile_zero(3); break;
                case 2: _tile_zero(4); break;
                case 3: _tile_zero(5); break;
                case 4: _tile_zero(6); break;
                default: _tile_zero(7); break;
            }
        for (int64_t j0 = 0; j0 < span; j0 += 32) {
            _tile_loadd(0, w.w.data() + j0, span * 2);
            if (vt && j0 < vt_keys) {   // keys past this group's weigh 0 whatever their (finite) values
                for (int c = 0; c < nc; ++c) {
                    _tile_loadd(1, vt + (j0 / 2 * d + 16 * (c0 + c)) * 2, d * 4);
                    value_product(c);
                }
                continue;
            }
            for (int k = 0; k < 16; ++k) {
                const int64_t ja = j0 + 2 * k, jb = ja + 1;
                const uint16_t* va = ja < maxkeys ? vc + slot(ja) * d + 16 * c0 : nullptr;
                const uint16_t* vb = jb < maxkeys ? vc + slot(jb) * d + 16 * c0 : nullptr;
                for (int c = 0; c < nc; ++c)
                    interleave16(va ? va + 16 * c : nullptr, vb ? vb + 16 * c : nullptr, pairs,
                                 w.vbuf.data() + (c * 16 + k) * 32);
            }
            for (int c = 0; c < nc; ++c) {
                _tile_loadd(1, w.vbuf.data() + c * 16 * 32, 64);
                value_product(c);
            }
        }
        for (int c = 0; c < nc; ++c) {
            value_store(c, cbuf);
            for (int n = 0; n < P; ++n) {
                uint16_t* dst = rows[n / nh].out + (n % nh) * out_stride + 16 * (c0 + c);
                vstore(dst, _mm512_mul_ps(_mm512_load_ps(cbuf + 16 * n), _mm512_set1_ps(inv[n])));
            }
        }
    }
}

}  // namespace

SPECDEC_AMXBF16 void attend_tiles(const TileRow* rows, int nrows, int nh, int64_t q_stride, int64_t out_stride,
                                  const uint16_t* kc, const uint16_t* vc, int64_t d, float scale, TileScratch& w) {
    // chain rows (keys in slots 0..nkeys - 1) in groups of up to 16 (row, head) pairs; a tree row by itself
    const int most = std::max(1, 16 / nh);
    auto is_tree = [](const TileRow& r) { return r.path != nullptr && r.nprefix < r.nkeys; };
    int64_t chain_keys = 0;   // the chain rows' values, interleaved once for all their groups
    int chains = 0;
    for (int r = 0; r < nrows; ++r)
        if (!is_tree(rows[r])) chain_keys = std::max(chain_keys, rows[r].nkeys), ++chains;
    const uint16_t* vt = nullptr;
    if (chains > most) {   // more than one group shares them
        w.vt.resize(size_t((chain_keys + 31) / 32 * 32 * d));
        interleave_values(vc, d, chain_keys, pair_order(), w.vt.data());
        vt = w.vt.data();
    }
    for (int r = 0; r < nrows;) {
        const bool tree = is_tree(rows[r]);
        int n = 1;
        if (!tree)
            while (n < most && r + n < nrows && !is_tree(rows[r + n])) ++n;
        const Slots slot = tree ? Slots{rows[r].nprefix, rows[r].path} : Slots{INT64_MAX, nullptr};
        if (nh <= 16) {
            attend_group(rows + r, n, nh, q_stride, out_stride, kc, vc, d, scale, slot, tree ? nullptr : vt,
                         chain_keys, w);
        } else {   // more heads per KV group than a tile's 16 columns: 16 at a time
            for (int h = 0; h < nh; h += 16)
                for (int i = 0; i < n; ++i) {
                    TileRow part = rows[r + i];
                    part.q += h * q_stride, part.out += h * out_stride;
                    attend_group(&part, 1, std::min(16, nh - h), q_stride, out_stride, kc, vc, d, scale, slot,
                                 tree ? nullptr : vt, chain_keys, w);
                }
        }
        r += n;
    }
    _tile_release();
}

}  // namespace specdec

#else

namespace specdec {
bool cpu_has_amx_bf16() { return false; }
void attend_tiles(const TileRow*, int, int, int64_t, int64_t, const uint16_t*, const uint16_t*, int64_t, float,
                  TileScratch&) {}   // never called: cpu_has_amx_bf16() is false here
}  // namespace specdec

#endif
