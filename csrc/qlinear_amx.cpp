// The AMX kernel (Intel Xeon from Sapphire Rapids on): the integer dot products of a group run as one tile multiply,
// of up to 16 activation rows (signed int8) against 16 columns x 64 k of codes, instead of one VNNI instruction per
// row and 4 k. The codes' packed layout (qlinear.h) is already the tile's: chunk j of a group's tile holds 16 columns
// x 4 consecutive k, which is row j of the tile multiply's second operand. Each group's codes are multiplied by
// their group scale once per superblock and column block (two byte planes, see scaled_planes), then used for every
// row: a superblock's integer sum S is two tile products, with no per-group step in between.
//
// S = sum_g sc_g * <q, a>_g and Mn are exact (wrapping int32, as in the VNNI kernel); the float epilogue per
// superblock is the VNNI kernel's, instruction for instruction. So a row's output is bit-identical to the VNNI and
// portable kernels' (tests/test_quantization.py), whichever kernel a call takes and however many rows share it.
//
// Linux hands out the tile registers' state only on request (arch_prctl ARCH_REQ_XCOMP_PERM): cpu_has_amx() asks
// once, and says no where the CPU lacks AMX-INT8 or the kernel refuses.
#include <algorithm>
#include <vector>

#include "qlinear.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#include <immintrin.h>

#include "amx_tiles.h"
#include "qlinear_codes.h"

#define SPECDEC_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))

namespace specdec {

bool cpu_has_amx() {
    static const bool ok = cpu_has_avx512_vnni() && amx::tiles_granted(amx::kInt8);
    return ok;
}

namespace {

// tmm0, tmm5: rows0 and rows1 activation rows x 64 k (int8); tmm1, tmm2: 64 k of 16 columns' scaled codes, low and
// high bytes (16 tile rows of 16 columns x 4 k); tmm3, tmm4: tmm0's products with them, rows0 x 16 int32; tmm6, tmm7:
// tmm5's (a tile of 0 rows is left unconfigured and unused)
SPECDEC_AMX void configure(int rows0, int rows1) {
    amx::TileConfig cfg{};
    cfg.palette = 1;
    cfg.rows[1] = cfg.rows[2] = 16, cfg.colsb[1] = cfg.colsb[2] = 64;
    cfg.rows[0] = cfg.rows[3] = cfg.rows[4] = uint8_t(rows0);
    cfg.colsb[0] = cfg.colsb[3] = cfg.colsb[4] = 64;
    if (rows1) {
        cfg.rows[5] = cfg.rows[6] = cfg.rows[7] = uint8_t(rows1);
        cfg.colsb[5] = cfg.colsb[6] = cfg.colsb[7] = 64;
    }
    amx::load_config(cfg);
}

// One group's codes times their group scale, q' = sc * q (|q'| <= 128 * 255: an int16), written as two byte planes
// in the tile's layout, lo = q' & 255 (unsigned) and hi = q' >> 8 (signed), so q' = 256 hi + lo and
// S = sum_g sc_g <q, a>_g = 256 <hi, a> + <lo, a> over the whole superblock: two tile products, no per-group step.
template <int BITS, int GROUP>
SPECDEC_AMX void scaled_planes(const uint8_t* tile, const int8_t* sc, uint8_t* lo, uint8_t* hi) {
    constexpr int NREG = GROUP / 4;
    __m512i W[NREG];
    load_codes<BITS, GROUP>(tile, W);
    // column c owns bytes 4c..4c+3 of a chunk: its scale in both int16 halves of 32-bit lane c
    const __m512i sc32 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)sc));
    const __m512i vsc2 = _mm512_or_si512(_mm512_and_si512(sc32, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(sc32, 16));
    const __m512i low8 = _mm512_set1_epi16(0x00FF);
    constexpr __mmask64 odd = 0xAAAAAAAAAAAAAAAAull;   // the high byte of each int16 lane
    for (int j = 0; j < NREG; ++j) {
        const __m512i pe = _mm512_mullo_epi16(_mm512_and_si512(W[j], low8), vsc2);   // even bytes' q'
        const __m512i po = _mm512_mullo_epi16(_mm512_srli_epi16(W[j], 8), vsc2);     // odd bytes' q'
        _mm512_store_si512(lo + 64 * j, _mm512_mask_blend_epi8(odd, pe, _mm512_slli_epi16(po, 8)));
        _mm512_store_si512(hi + 64 * j, _mm512_mask_blend_epi8(odd, _mm512_srli_epi16(pe, 8), po));
    }
}

typedef int32_t __attribute__((may_alias, aligned(1))) i32u;

constexpr int COLUMN_BLOCKS = 8;   // column blocks a superblock's activations (M x group*sb bytes) serve from L2

// One superblock's share of rows [r0, r0 + rows) x column block cb, from its two products (the tiles stored):
// S = 256 hi + lo, then Mn and the float epilogue, the VNNI kernel's arithmetic instruction for instruction.
// NPAIR > 0: the superblock has exactly 2 * NPAIR groups, and their pairs of mins stay in registers for every row
// (two Mn chains, added: integer sums are exact in any order); NPAIR == 0: any count (a short last superblock).
template <int NPAIR>
SPECDEC_AMX void epilogue(const QAct& x, const int32_t (*Clo)[16], const int32_t (*Chi)[16], const __m512i* mn_pairs,
                          const __m512i mn_last, int64_t g0, int64_t g1, int64_t ns, int64_t s, const __m512 d,
                          const __m512 dmin, float* ocol, int64_t r0, int rows) {   // ocol: [M, 16]
    const int64_t ngp = x.asum_stride;
    __m512i pairs[NPAIR > 0 ? NPAIR : 1];
    for (int i = 0; i < NPAIR; ++i) pairs[i] = mn_pairs[i];
    for (int r = 0; r < rows; ++r) {
        const int64_t row = r0 + r;
        const __m512i S = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(Chi[r]), 8), _mm512_load_si512(Clo[r]));
        const int16_t* asum = x.asum + row * ngp + g0;
        __m512i Mn;
        if constexpr (NPAIR > 0) {
            __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
            for (int i = 0; i < NPAIR; i += 2) {
                m0 = _mm512_dpwssd_epi32(m0, pairs[i], _mm512_set1_epi32(*reinterpret_cast<const i32u*>(asum + 2 * i)));
                if (i + 1 < NPAIR)
                    m1 = _mm512_dpwssd_epi32(m1, pairs[i + 1],
                                             _mm512_set1_epi32(*reinterpret_cast<const i32u*>(asum + 2 * i + 2)));
            }
            Mn = _mm512_add_epi32(m0, m1);
        } else {
            Mn = _mm512_setzero_si512();
            int64_t g = g0;
            for (int i = 0; g + 1 < g1; g += 2, ++i)
                Mn = _mm512_dpwssd_epi32(Mn, mn_pairs[i], _mm512_set1_epi32(*reinterpret_cast<const i32u*>(asum + (g - g0))));
            if (g < g1) Mn = _mm512_add_epi32(Mn, _mm512_mullo_epi32(mn_last, _mm512_set1_epi32(asum[g - g0])));
        }
        const __m512 t = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(Mn), _mm512_mul_ps(_mm512_cvtepi32_ps(S), d));
        float* o = ocol + row * 16;
        _mm512_store_ps(o, _mm512_fmadd_ps(_mm512_set1_ps(x.ascale[row * ns + s]), t, _mm512_load_ps(o)));
    }
}

template <int BITS, int GROUP>
SPECDEC_AMX void kernel(const QWeight& w, const QAct& x, const float* bias, float* out, uint16_t* out_bf16, int64_t cb0,
                        int64_t cb1) {
    constexpr int ROWS_PER_GROUP = GROUP / 4;              // tile rows (4 k each) one group fills
    const int64_t ng = w.ngroups(), ns = w.nsuper(), tb = w.tile_bytes(), K = w.k, M = x.m;
    // a superblock's planes in chunks of 64 k (16 tile rows of 64 bytes); a partial last chunk is zero-padded, and
    // the activation columns it then reads past the superblock (x.a carries 64 bytes of slack) multiply zeros
    const int64_t chunks_max = (int64_t(w.sb) * GROUP + 63) / 64;
    // lo and hi planes, then Mn's pairs of group mins (one 64-byte vector per two groups), on 64-byte boundaries
    std::vector<uint8_t> raw(size_t(2 * chunks_max * 1024 + (w.sb / 2 + 1) * 64 + 64));
    uint8_t* lo = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw.data()) + 63) & ~uintptr_t(63));
    uint8_t* hi = lo + chunks_max * 1024;
    __m512i* mn_pairs = reinterpret_cast<__m512i*>(hi + chunks_max * 1024);
    alignas(64) int32_t C[4][16][16];                      // (rows 0-15, 16-31) x (lo, hi) products
    int configured = -1;
    // A run's sums build up in `acc`, column block by column block ([COLUMN_BLOCKS][M][16], contiguous), and are
    // copied to `out` once: built up in `out` itself, every superblock would touch M rows n floats apart (a page
    // each, past the TLB's reach for a long prompt chunk).
    std::vector<float> acc_raw(size_t(COLUMN_BLOCKS * M * 16 + 16));
    float* acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(acc_raw.data()) + 63) & ~uintptr_t(63));
    // Column blocks in runs of COLUMN_BLOCKS, superblocks inside a run: the rows' activations of one superblock are
    // read from L2 by every column block of the run (in column-block order they would stream from memory each time).
    for (int64_t run = cb0; run < cb1; run += COLUMN_BLOCKS) {
        const int64_t run_end = std::min(cb1, run + COLUMN_BLOCKS);
        std::fill(acc, acc + (run_end - run) * M * 16, 0.f);
        for (int64_t s = 0; s < ns; ++s) {
            const int64_t g0 = s * w.sb, g1 = std::min(ng, g0 + w.sb);
            const int64_t span = (g1 - g0) * GROUP, chunks = (span + 63) / 64;
            for (int64_t cb = run; cb < run_end; ++cb) {
                float* ocol = acc + (cb - run) * M * 16;
                for (int64_t g = g0; g < g1; ++g) {
                    const int64_t at = (g - g0) * ROWS_PER_GROUP * 64;
                    scaled_planes<BITS, GROUP>(w.qw + (cb * ng + g) * tb, w.sc + (cb * ng + g) * 16, lo + at, hi + at);
                }
                if (span % 64) {
                    std::fill(lo + span * 16, lo + chunks * 1024, uint8_t(0));
                    std::fill(hi + span * 16, hi + chunks * 1024, uint8_t(0));
                }
                int64_t g = g0;
                for (int i = 0; g + 1 < g1; g += 2, ++i) mn_pairs[i] = mins_pair(w.mn + (cb * ng + g) * 16);
                const __m512i mn_last = g < g1 ? _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w.mn + (cb * ng + g) * 16)))
                                               : _mm512_setzero_si512();
                const uint16_t* dm = w.dm + (cb * ns + s) * 32;
                const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)dm));
                const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dm + 16)));
                // a tile of rows [r0, r0 + 16) x 64 k from chunk c of this superblock: from the chunked copy where
                // there is one (rows 64 bytes apart, 1 KB in one run), else from the rows, K bytes apart
                const int8_t* a = x.a_chunks ? x.a_chunks + (g0 * GROUP / 64) * M * 64 : x.a + g0 * GROUP;
                const int64_t a_stride = x.a_chunks ? 64 : K, chunk_stride = x.a_chunks ? M * 64 : 64;
                auto a_tile = [&](int64_t r, int64_t c) { return a + r * a_stride + c * chunk_stride; };
                for (int64_t r0 = 0; r0 < M; r0 += 32) {   // 32 rows per load of the codes: two row tiles
                    const int rows0 = int(std::min<int64_t>(16, M - r0)), rows1 = int(std::min<int64_t>(16, std::max<int64_t>(0, M - r0 - 16)));
                    if (rows0 * 32 + rows1 != configured) configure(rows0, rows1), configured = rows0 * 32 + rows1;
                    _tile_zero(3);
                    _tile_zero(4);
                    if (rows1) {
                        _tile_zero(6);
                        _tile_zero(7);
                    }
                    // The low plane's products first, then the high plane's: a tile register is reloaded only after
                    // the products that read it, so in this order the next chunk's low plane and rows load while
                    // this chunk's high-plane products run, and the tile unit does not wait on every load
                    for (int64_t c = 0; c < chunks; ++c) {
                        _tile_loadd(1, lo + c * 1024, 64);
                        _tile_loadd(0, a_tile(r0, c), a_stride);
                        _tile_dpbsud(3, 0, 1);
                        if (rows1) {
                            _tile_loadd(5, a_tile(r0 + 16, c), a_stride);
                            _tile_dpbsud(6, 5, 1);
                        }
                        _tile_loadd(2, hi + c * 1024, 64);
                        _tile_dpbssd(4, 0, 2);
                        if (rows1) _tile_dpbssd(7, 5, 2);
                    }
                    _tile_stored(3, C[0], 64);
                    _tile_stored(4, C[1], 64);
                    if (rows1) {
                        _tile_stored(6, C[2], 64);
                        _tile_stored(7, C[3], 64);
                    }
                    auto finish = [&](const int32_t (*Clo)[16], const int32_t (*Chi)[16], int64_t first, int rows) {
                        if (g1 - g0 == 8)
                            epilogue<4>(x, Clo, Chi, mn_pairs, mn_last, g0, g1, ns, s, d, dmin, ocol, first, rows);
                        else if (g1 - g0 == 16)
                            epilogue<8>(x, Clo, Chi, mn_pairs, mn_last, g0, g1, ns, s, d, dmin, ocol, first, rows);
                        else
                            epilogue<0>(x, Clo, Chi, mn_pairs, mn_last, g0, g1, ns, s, d, dmin, ocol, first, rows);
                    };
                    finish(C[0], C[1], r0, rows0);
                    if (rows1) finish(C[2], C[3], r0 + 16, rows1);
                }
            }
        }
        for (int64_t r = 0; r < M; ++r)
            for (int64_t cb = run; cb < run_end; ++cb) {
                __m512 v = _mm512_load_ps(acc + ((cb - run) * M + r) * 16);
                if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + cb * 16));
                if (out_bf16)   // the caller's bf16 rows, rounded here as to_bf16_avx512 rounds (no fp32 copy made)
                    _mm256_storeu_si256((__m256i*)(out_bf16 + r * w.n + cb * 16), bf16_round16(v));
                else
                    _mm512_storeu_ps(out + r * w.n + cb * 16, v);
            }
    }
    if (configured >= 0) _tile_release();
}

// A format without a tile kernel (none today): the VNNI kernel, then the bf16 rounding where the caller wants it
void fallback(const QWeight& w, const QAct& x, const float* bias, float* out, uint16_t* out_bf16, int64_t cb0,
              int64_t cb1) {
    std::vector<float> scratch;
    if (!out) scratch.resize(size_t(x.m * w.n)), out = scratch.data();
    qlinear_avx512(w, x, bias, out, cb0, cb1);
    if (out_bf16)
        for (int64_t r = 0; r < x.m; ++r)
            to_bf16_avx512(out + r * w.n + cb0 * 16, out_bf16 + r * w.n + cb0 * 16, (cb1 - cb0) * 16);
}

}  // namespace

void qlinear_amx(const QWeight& w, const QAct& x, const float* bias, float* out, uint16_t* out_bf16, int64_t cb0,
                 int64_t cb1) {
    // every format qlinear accepts has a tile kernel: the fallback is never taken
    SPECDEC_DISPATCH_FORMAT(w, kernel, fallback, w, x, bias, out, out_bf16, cb0, cb1);
}

}  // namespace specdec

#else  // not x86-64 Linux with GCC/Clang: no AMX

namespace specdec {
bool cpu_has_amx() { return false; }
void qlinear_amx(const QWeight& w, const QAct& x, const float* bias, float* out, uint16_t*, int64_t cb0, int64_t cb1) {
    qlinear_avx512(w, x, bias, out, cb0, cb1);   // never called: cpu_has_amx() is false here
}
}  // namespace specdec

#endif
