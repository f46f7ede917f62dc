// Attention of bf16 rows on AMX-BF16 tiles (attention_amx.cpp), called by ragged_attention for every row whose keys
// start at key 0 (all rows but a sliding window's past its width).
#pragma once
#include <cstdint>
#include <vector>

namespace specdec {

// The CPU multiplies bf16 tiles (AMX-BF16) and Linux granted the tile state; asked once.
bool cpu_has_amx_bf16();

// One query row: its heads' queries and outputs, and its keys 0 .. nkeys - 1: key j in cache slot j for j < nprefix,
// else path[j - nprefix] (a token tree's row: its ancestors, then itself).
struct TileRow {
    const uint16_t* q;
    uint16_t* out;
    int64_t nkeys, nprefix;
    const int64_t* path;
};

struct TileScratch {   // one thread's, grown as needed
    std::vector<float> s;
    std::vector<uint16_t> w, qt, kbuf, vbuf, vt;
};

// rows[0 .. nrows) of one sequence, query heads 0 .. nh - 1 of one KV group (head h of a row at q + h * q_stride,
// its output at out + h * out_stride), over caches kc / vc [slots, d] of that group. d: a multiple of 32, <= 256.
void attend_tiles(const TileRow* rows, int nrows, int nh, int64_t q_stride, int64_t out_stride, const uint16_t* kc,
                  const uint16_t* vc, int64_t d, float scale, TileScratch& w);

}  // namespace specdec
