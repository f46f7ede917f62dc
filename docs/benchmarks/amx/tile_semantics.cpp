// What one AMX-BF16 tile product (TDPBF16PS) computes per output element, against models of it, on random bf16
// operands (exponents near 1, so nothing is flushed). csrc/attention_amx.cpp rests on the model that matches.
//
//   g++ -O1 -ffp-contract=off -o /tmp/tile_semantics docs/benchmarks/amx/tile_semantics.cpp && /tmp/tile_semantics
//
// Prints, per shape (pairs k per product, products chained into one accumulator), how many of the elements each
// model gets wrong. The vdpbf16ps instruction is checked beside it: one rounded step per product, odd half first.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

#define AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

struct alignas(64) Cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
static float bf(uint16_t h) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

AMX static void run(int K, int ops) {
    Cfg c{};
    c.palette = 1;
    c.rows[0] = 16, c.colsb[0] = 64, c.rows[1] = 16, c.colsb[1] = uint16_t(4 * K), c.rows[2] = uint8_t(K), c.colsb[2] = 64;
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
    std::mt19937 rng(1);
    long n = 0, wrong[4] = {};
    for (int trial = 0; trial < 500; ++trial) {
        alignas(64) uint16_t A[4][16][32], B[4][16][32];
        alignas(64) float C0[16][16], C[16][16];
        for (int o = 0; o < ops; ++o)
            for (int i = 0; i < 16; ++i)
                for (int j = 0; j < 32; ++j) {
                    A[o][i][j] = uint16_t((rng() & 0x807F) | ((127 + int(rng() % 16) - 8) << 7));
                    B[o][i][j] = uint16_t((rng() & 0x807F) | ((127 + int(rng() % 16) - 8) << 7));
                }
        for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 16; ++j) C0[i][j] = float(int(rng() % 2001) - 1000) / 7.f;
        _tile_loadd(0, C0, 64);
        for (int o = 0; o < ops; ++o) {
            _tile_loadd(1, A[o], 64);
            _tile_loadd(2, B[o], 64);
            _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, C, 64);
        for (int r = 0; r < 16; ++r) {
            // vdpbf16ps on the same operands: lane = column
            __m512 acc = _mm512_loadu_ps(C0[r]);
            for (int o = 0; o < ops; ++o)
                for (int k = 0; k < K; ++k) {
                    uint32_t p;
                    std::memcpy(&p, &A[o][r][2 * k], 4);
                    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(int(p)), (__m512bh)_mm512_loadu_si512(B[o][k]));
                }
            float dp[16];
            _mm512_storeu_ps(dp, acc);
            for (int col = 0; col < 16; ++col) {
                float m[4];
                // 0: one chain, a rounded step per product, even half first; 1: odd half first (vdpbf16ps's order)
                // 2: per product: the even halves' chain and the odd halves' chain, each from +0, then C += even + odd
                m[0] = m[1] = m[2] = C0[r][col];
                for (int o = 0; o < ops; ++o) {
                    float ev = 0.f, od = 0.f;
                    for (int k = 0; k < K; ++k) {
                        const float pe = bf(A[o][r][2 * k]) * bf(B[o][k][2 * col]);
                        const float po = bf(A[o][r][2 * k + 1]) * bf(B[o][k][2 * col + 1]);
                        m[0] = (m[0] + pe) + po;
                        m[1] = (m[1] + po) + pe;
                        ev = ev + pe, od = od + po;
                    }
                    m[2] = m[2] + (ev + od);
                }
                m[3] = dp[col];
                ++n;
                for (int i = 0; i < 3; ++i) wrong[i] += bits(m[i]) != bits(C[r][col]);
                wrong[3] += bits(m[1]) != bits(dp[col]);
            }
        }
    }
    std::printf("k = %2d pairs x %d products: %ld elements; tile != one chain (even first) %ld, != one chain (odd "
                "first) %ld, != two chains then C += even + odd %ld; vdpbf16ps != one chain (odd first) %ld\n",
                K, ops, n, wrong[0], wrong[1], wrong[2], wrong[3]);
}

AMX int main() {
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
        std::puts("no AMX tile state granted (not an AMX CPU, or an old kernel)");
        return 1;
    }
    run(1, 1), run(2, 1), run(16, 1), run(16, 2), run(4, 3), run(16, 4);
    _tile_release();
}
