// What the AMX kernels share (qlinear_amx.cpp: int8, attention_amx.cpp: bf16): the CPU's tile features and Linux's
// grant of the tile state, and the tile configuration with its load.
#pragma once
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace specdec::amx {

constexpr int kBf16 = 22, kInt8 = 25;   // CPUID.(EAX=7, ECX=0):EDX bits of AMX-BF16 and AMX-INT8

// The CPU has AMX tiles with `feature` (kBf16, kInt8), and Linux granted this process the tile state: it hands it
// out only on request (arch_prctl ARCH_REQ_XCOMP_PERM), before the first tile instruction; asking again is harmless.
inline bool tiles_granted(int feature) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 24)) || !(d & (1u << feature))) return false;   // bit 24: AMX-TILE
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

struct alignas(64) TileConfig {   // palette 1: per tile its rows and bytes per row
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// ldtilecfg through an operand of the whole 64 bytes: the intrinsic's operand covers 8 of them, and GCC then drops
// the stores of the rest as dead (the tiles stay unconfigured: #UD at the first tile load)
inline void load_config(const TileConfig& cfg) { __asm__ volatile("ldtilecfg %0" ::"m"(cfg)); }

}  // namespace specdec::amx
#endif
