// Activation quantization (shared by every kernel) and the portable kernel: plain C++ doing exactly the
// arithmetic of the AVX-512 kernel, in the same order, so the two give bit-identical outputs.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <c10/util/Half.h>

#include "qlinear.h"

namespace specdec {

float half_to_float(uint16_t h) { return c10::detail::fp16_ieee_to_fp32_value(h); }

template <typename T>
void quantize_rows(const T* x, int64_t m, int64_t k, int group, int sb, int8_t* a8, int16_t* asum, float* ascale) {
    const int64_t ng = k / group, ns = (ng + sb - 1) / sb, span = int64_t(group) * sb, stride = asum_stride(k, group);
    for (int64_t r = 0; r < m; ++r) {
        const T* xr = x + r * k;
        int8_t* ar = a8 + r * k;
        for (int64_t s = 0; s < ns; ++s) {
            const int64_t k0 = s * span, k1 = std::min(k, k0 + span);
            float amax = 0.f;
            for (int64_t i = k0; i < k1; ++i) amax = std::max(amax, std::fabs(to_float(xr[i])));
            const float inv = amax > 0.f ? 127.f / amax : 0.f;
            ascale[r * ns + s] = amax / 127.f;
            for (int64_t i = k0; i < k1; ++i) {
                const float v = std::nearbyint(to_float(xr[i]) * inv);   // round half to even
                ar[i] = int8_t(std::max(-127.f, std::min(127.f, v)));
            }
        }
        for (int64_t g = 0; g < stride; ++g) {
            int32_t t = 0;
            for (int64_t i = g * group; g < ng && i < (g + 1) * group; ++i) t += ar[i];
            asum[r * stride + g] = int16_t(t);
        }
    }
}
template void quantize_rows<float>(const float*, int64_t, int64_t, int, int, int8_t*, int16_t*, float*);
template void quantize_rows<uint16_t>(const uint16_t*, int64_t, int64_t, int, int, int8_t*, int16_t*, float*);

namespace {

// Code of column c, offset kk within its group's tile (see the layout in qlinear.h).
inline int32_t code(const uint8_t* tile, int bits, int group, int c, int kk) {
    if (bits == 8) return tile[(kk / 4) * 64 + c * 4 + kk % 4];
    if (bits == 3) {   // groups of 32: a 2-bit plane (two chunks), then a 1-bit plane (one)
        const int32_t low = (tile[(kk / 16) * 64 + c * 4 + kk % 4] >> (2 * ((kk % 16) / 4))) & 3;
        return low | (((tile[group * 4 + c * 4 + kk % 4] >> (kk / 4)) & 1) << 2);
    }
    const uint8_t b = tile[(kk / 8) * 64 + c * 4 + kk % 4];
    const int32_t low = (kk % 8) < 4 ? (b & 0x0F) : (b >> 4);
    if (bits == 4) return low;
    const uint8_t h = tile[group * 8 + (kk / 16) * 64 + c * 4 + kk % 4];
    return low | (((h >> (2 * ((kk % 16) / 4))) & 3) << 4);
}

}  // namespace

void qlinear_portable(const QWeight& w, const QAct& x, const float* bias, float* out, int64_t cb0, int64_t cb1) {
    const int64_t ng = w.ngroups(), ns = w.nsuper(), tb = w.tile_bytes();
    for (int64_t cb = cb0; cb < cb1; ++cb) {
        for (int64_t r = 0; r < x.m; ++r) {
            const int8_t* ar = x.a + r * w.k;
            for (int c = 0; c < 16; ++c) {
                float acc = 0.f;
                for (int64_t s = 0; s < ns; ++s) {
                    int32_t S = 0, Mn = 0;
                    for (int64_t g = s * w.sb; g < std::min(ng, (s + 1) * w.sb); ++g) {
                        const uint8_t* tile = w.qw + (cb * ng + g) * tb;
                        int32_t isum = 0;
                        for (int kk = 0; kk < w.group; ++kk) isum += code(tile, w.bits, w.group, c, kk) * ar[g * w.group + kk];
                        S += int32_t(w.sc[(cb * ng + g) * 16 + c]) * isum;
                        Mn += int32_t(w.mn[(cb * ng + g) * 16 + c]) * x.asum[r * x.asum_stride + g];
                    }
                    const uint16_t* dm = w.dm + (cb * ns + s) * 32;
                    const float d = half_to_float(dm[c]), dmin = half_to_float(dm[16 + c]);
                    const float t = std::fma(-dmin, float(Mn), float(S) * d);
                    acc = std::fma(x.ascale[r * ns + s], t, acc);
                }
                out[r * w.n + cb * 16 + c] = bias ? acc + bias[cb * 16 + c] : acc;
            }
        }
    }
}

}  // namespace specdec
