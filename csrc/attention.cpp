// The per-sequence part of attention for a ragged batch on CPU, as one call per layer: write each sequence's
// new K/V rows into its cache, run scaled-dot-product attention of each run of query rows over its sequence's
// cached keys (ATen's kernel, with the run's mask and query padding exactly as the eager code passes them),
// and gather the outputs into one [N, Hq * D] tensor. The arithmetic is ATen's; what this saves
// is the ~15 Python-level ops per sequence and layer around it (milliseconds per step at 8 sequences).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops.h"
#include "vec_math.h"

namespace {

// Decode and verification rows (a sequence's generated tokens) attend with the kernel below instead of ATen's:
// one query row and head at a time over exactly its keys 0..pos, in a fixed order, fp32 throughout. A row's
// result therefore depends on its position only -- never on how many rows share the call or how the keys are
// padded -- and a one-token step costs microseconds instead of ATen's ~100 us of per-call set-up per layer.
// Prompt rows keep ATen's flash attention (faster for hundreds of rows), in key-block runs.

// Which cache slot a row's j-th key is in: keys 0..nprefix-1 are slots 0..nprefix-1; a token-tree row's further
// keys are its path's slots (its ancestors in the tree, then itself), in depth order. A chain row has no path
// (nprefix = nkeys), so a tree row and the chain row at the same depth attend over the same keys in the same
// order and get bit-identical results.
struct KeySlots {
    int64_t nprefix;
    const int64_t* path;   // nkeys - nprefix slots, or null
    inline int64_t operator()(int64_t j) const { return j < nprefix ? j : path[j - nprefix]; }
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
using specdec::vexp;
using specdec::vload;
using specdec::vstore;

// s[0..nkeys) <- exp(s - max s), in place; returns their sum (the softmax's denominator).
SPECDEC_AVX512F inline float softmax_avx512(float* s, int64_t nkeys) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= nkeys; j += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + j));
    const __mmask16 tail = __mmask16((1u << (nkeys - j)) - 1);
    vmax = _mm512_mask_max_ps(vmax, tail, vmax, _mm512_maskz_loadu_ps(tail, s + j));
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 vsum = _mm512_setzero_ps();
    for (j = 0; j + 16 <= nkeys; j += 16) {
        const __m512 e = vexp(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
        _mm512_storeu_ps(s + j, e);
        vsum = _mm512_add_ps(vsum, e);
    }
    if (tail) {
        const __m512 e = _mm512_maskz_mov_ps(tail, vexp(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + j), m)));
        _mm512_mask_storeu_ps(s + j, tail, e);
        vsum = _mm512_add_ps(vsum, e);
    }
    return _mm512_reduce_add_ps(vsum);
}

template <typename B>   // B: float or uint16_t (bf16 bits); d a multiple of 16, at most 256
SPECDEC_AVX512F void attend_avx512(const B* q, const B* kc, const B* vc, int64_t d, int64_t nkeys, KeySlots slot,
                                   float scale, float* s, B* out) {
    const int nv = int(d / 16);
    __m512 qv[16];
    for (int i = 0; i < nv; ++i) qv[i] = vload(q + 16 * i);
    for (int64_t j = 0; j < nkeys; ++j) {
        const B* kj = kc + slot(j) * d;
        __m512 acc = _mm512_mul_ps(qv[0], vload(kj));
        for (int i = 1; i < nv; ++i) acc = _mm512_fmadd_ps(qv[i], vload(kj + 16 * i), acc);
        s[j] = _mm512_reduce_add_ps(acc) * scale;
    }
    const __m512 inv = _mm512_set1_ps(1.0f / softmax_avx512(s, nkeys));
    __m512 o[16];
    for (int i = 0; i < nv; ++i) o[i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < nkeys; ++j) {
        const __m512 e = _mm512_set1_ps(s[j]);
        const B* vj = vc + slot(j) * d;
        for (int i = 0; i < nv; ++i) o[i] = _mm512_fmadd_ps(e, vload(vj + 16 * i), o[i]);
    }
    for (int i = 0; i < nv; ++i) vstore(out + 16 * i, _mm512_mul_ps(o[i], inv));
}

// The query heads of one KV group (G of them) attend together: each key and value row is read once for all G
// instead of once per head, which is what a verification row costs at long context (the cache of a layer no
// longer fits the inner caches, and one row per head read it 6x for Qwen2.5's 12/2 heads). Per head the
// arithmetic is attend_avx512's, op for op and in the same order (the score chain over d, its horizontal sum,
// the softmax, the value sums key by key per column), so a head's result has the same bits either way.
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

template <typename B, int G>   // q: G heads, head h at q + h * q_stride; out likewise; s: G * nkeys floats
SPECDEC_AVX512F void attend_heads_avx512(const B* q, int64_t q_stride, const B* kc, const B* vc, int64_t d,
                                         int64_t nkeys, KeySlots slot, float scale, float* s, B* out,
                                         int64_t out_stride) {
    const int nv = int(d / 16);
    alignas(64) float qf[G][256];
    for (int g = 0; g < G; ++g)
        for (int i = 0; i < nv; ++i) _mm512_store_ps(qf[g] + 16 * i, vload(q + g * q_stride + 16 * i));
    for (int64_t j = 0; j < nkeys; ++j) {
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

namespace v2 = specdec::avx2;

// The same over 8 lanes (AVX2 + FMA). Each key's score is one product chain over d in order, then a fixed
// horizontal sum, whether it is computed among four keys or alone; the output is accumulated over keys in order,
// C registers (8 C values of d) at a time.
template <typename B>
SPECDEC_AVX2F inline float score_avx2(const float* qf, const B* kj, int nv) {
    __m256 acc = _mm256_mul_ps(_mm256_load_ps(qf), v2::vload(kj));
    for (int i = 1; i < nv; ++i) acc = _mm256_fmadd_ps(_mm256_load_ps(qf + 8 * i), v2::vload(kj + 8 * i), acc);
    return v2::hsum(acc);
}

template <typename B, int C>   // out[8c0 .. 8(c0 + C)) = sum_j s[j] v_j / total
SPECDEC_AVX2F void weighted_values_avx2(const B* vc, int64_t d, int64_t nkeys, KeySlots slot, const float* s,
                                        __m256 inv, int c0, B* out) {
    __m256 o[C];
    for (int i = 0; i < C; ++i) o[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < nkeys; ++j) {
        const __m256 e = _mm256_set1_ps(s[j]);
        const B* vj = vc + slot(j) * d + 8 * c0;
#pragma GCC unroll 8
        for (int i = 0; i < C; ++i) o[i] = _mm256_fmadd_ps(e, v2::vload(vj + 8 * i), o[i]);
    }
    for (int i = 0; i < C; ++i) v2::vstore(out + 8 * (c0 + i), _mm256_mul_ps(o[i], inv));
}

template <typename B>   // B: float or uint16_t (bf16 bits); d a multiple of 8, at most 256
SPECDEC_AVX2F void attend_avx2(const B* q, const B* kc, const B* vc, int64_t d, int64_t nkeys, KeySlots slot,
                               float scale, float* s, B* out) {
    const int nv = int(d / 8);
    alignas(32) float qf[256];
    for (int i = 0; i < nv; ++i) _mm256_store_ps(qf + 8 * i, v2::vload(q + 8 * i));
    int64_t j = 0;
    for (; j + 4 <= nkeys; j += 4) {   // four independent chains in flight
        const B *k0 = kc + slot(j) * d, *k1 = kc + slot(j + 1) * d, *k2 = kc + slot(j + 2) * d, *k3 = kc + slot(j + 3) * d;
        __m256 a0 = _mm256_mul_ps(_mm256_load_ps(qf), v2::vload(k0)), a1 = _mm256_mul_ps(_mm256_load_ps(qf), v2::vload(k1));
        __m256 a2 = _mm256_mul_ps(_mm256_load_ps(qf), v2::vload(k2)), a3 = _mm256_mul_ps(_mm256_load_ps(qf), v2::vload(k3));
        for (int i = 1; i < nv; ++i) {
            const __m256 qi = _mm256_load_ps(qf + 8 * i);
            a0 = _mm256_fmadd_ps(qi, v2::vload(k0 + 8 * i), a0);
            a1 = _mm256_fmadd_ps(qi, v2::vload(k1 + 8 * i), a1);
            a2 = _mm256_fmadd_ps(qi, v2::vload(k2 + 8 * i), a2);
            a3 = _mm256_fmadd_ps(qi, v2::vload(k3 + 8 * i), a3);
        }
        s[j] = v2::hsum(a0) * scale, s[j + 1] = v2::hsum(a1) * scale, s[j + 2] = v2::hsum(a2) * scale, s[j + 3] = v2::hsum(a3) * scale;
    }
    for (; j < nkeys; ++j) s[j] = score_avx2(qf, kc + slot(j) * d, nv) * scale;
    float m = -INFINITY;
    for (j = 0; j < nkeys; ++j) m = std::max(m, s[j]);
    const __m256 vm = _mm256_set1_ps(m);
    __m256 vsum = _mm256_setzero_ps();
    for (j = 0; j + 8 <= nkeys; j += 8) {
        const __m256 e = v2::vexp(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    if (j < nkeys) {   // the tail through a buffer padded with -inf (e^-inf = 0)
        alignas(32) float t[8];
        for (int i = 0; i < 8; ++i) t[i] = j + i < nkeys ? s[j + i] : -INFINITY;
        const __m256 e = v2::vexp(_mm256_sub_ps(_mm256_load_ps(t), vm));
        _mm256_store_ps(t, e);
        for (int i = 0; j + i < nkeys; ++i) s[j + i] = t[i];
        vsum = _mm256_add_ps(vsum, e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / v2::hsum(vsum));
    for (int c0 = 0; c0 < nv; c0 += 8) {
        switch (std::min(8, nv - c0)) {
            case 8: weighted_values_avx2<B, 8>(vc, d, nkeys, slot, s, inv, c0, out); break;
            case 7: weighted_values_avx2<B, 7>(vc, d, nkeys, slot, s, inv, c0, out); break;
            case 6: weighted_values_avx2<B, 6>(vc, d, nkeys, slot, s, inv, c0, out); break;
            case 5: weighted_values_avx2<B, 5>(vc, d, nkeys, slot, s, inv, c0, out); break;
            case 4: weighted_values_avx2<B, 4>(vc, d, nkeys, slot, s, inv, c0, out); break;
            case 3: weighted_values_avx2<B, 3>(vc, d, nkeys, slot, s, inv, c0, out); break;
            case 2: weighted_values_avx2<B, 2>(vc, d, nkeys, slot, s, inv, c0, out); break;
            default: weighted_values_avx2<B, 1>(vc, d, nkeys, slot, s, inv, c0, out); break;
        }
    }
}
#endif

struct DecodeTask {
    int64_t seq, row, pos, head;   // flat-batch row, its last key's index (its position), its first query head
    int64_t nh;                    // query heads head .. head + nh - 1, all of one KV group
    KeySlots slots;                // where its keys are
};

// Query heads per task: a whole KV group (at most 8, the grouped kernel's widest), split further only while the
// tasks are fewer than the threads.
int64_t heads_per_task(int64_t decode_rows, int64_t hq, int64_t hkv) {
    const int64_t group = hq / hkv, threads = at::get_num_threads();
    int64_t per = std::min<int64_t>(group, 8);
    while (per > 1 && decode_rows * hkv * ((group + per - 1) / per) < threads) per = (per + 1) / 2;
    return per;
}

void push_tasks(std::vector<DecodeTask>& tasks, int64_t seq, int64_t row, int64_t pos, KeySlots slots, int64_t hq,
                int64_t hkv, int64_t per) {
    const int64_t group = hq / hkv;
    for (int64_t g = 0; g < hkv; ++g)
        for (int64_t h = g * group; h < (g + 1) * group; h += per)
            tasks.push_back({seq, row, pos, h, std::min(per, (g + 1) * group - h), slots});
}

// Every (row, KV group's heads) of the decode runs, split over threads; each task reads its sequence's cache of
// this layer once for its heads.
template <typename T, typename B>
void decode_attention(const torch::Tensor& q, torch::Tensor& out, const std::vector<DecodeTask>& tasks,
                      const std::vector<const T*>& kbase, const std::vector<const T*>& vbase,
                      const std::vector<int64_t>& caps, int64_t hq, int64_t hkv, int64_t d, int64_t impl) {
    const T* qp = q.data_ptr<T>();
    T* op = out.data_ptr<T>();
    const int64_t qs0 = q.stride(0), qs1 = q.stride(1), group = hq / hkv;
    const float scale = 1.0f / std::sqrt(float(d));
    const int path = specdec::ops_path(impl, d % 16 == 0 && d <= 256, d % 8 == 0 && d <= 256, "ragged_attention");
    at::parallel_for(0, int64_t(tasks.size()), 1, [&](int64_t t0, int64_t t1) {
        std::vector<float> scratch;
        for (int64_t t = t0; t < t1; ++t) {
            const DecodeTask& task = tasks[t];
            const int64_t g = task.head / group, cap = caps[task.seq], nkeys = task.pos + 1;
            if (int64_t(scratch.size()) < task.nh * nkeys) scratch.resize(task.nh * nkeys + 256);
            const T* kc = kbase[task.seq] + g * cap * d;
            const T* vc = vbase[task.seq] + g * cap * d;
#ifdef SPECDEC_HAVE_AVX512
            if (path == specdec::kOpsAvx512) {
                attend_heads<B>(int(task.nh), reinterpret_cast<const B*>(qp + task.row * qs0 + task.head * qs1), qs1,
                                reinterpret_cast<const B*>(kc), reinterpret_cast<const B*>(vc), d, nkeys, task.slots,
                                scale, scratch.data(), reinterpret_cast<B*>(op + task.row * hq * d + task.head * d), d);
                continue;
            }
#endif
            for (int64_t h = task.head; h < task.head + task.nh; ++h) {
                const T* qh = qp + task.row * qs0 + h * qs1;
                T* o = op + task.row * hq * d + h * d;
#ifdef SPECDEC_HAVE_AVX512
                if (path == specdec::kOpsAvx2) {
                    attend_avx2<B>(reinterpret_cast<const B*>(qh), reinterpret_cast<const B*>(kc),
                                   reinterpret_cast<const B*>(vc), d, nkeys, task.slots, scale, scratch.data(),
                                   reinterpret_cast<B*>(o));
                    continue;
                }
#endif
                attend_scalar<T>(qh, kc, vc, d, nkeys, task.slots, scale, scratch.data(), o);
            }
        }
    });
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
                               const std::vector<c10::optional<torch::Tensor>>& run_trees, int64_t impl) {
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
        kcs[i].narrow(1, start, t).copy_(k.narrow(0, row, t).transpose(0, 1));
        vcs[i].narrow(1, start, t).copy_(v.narrow(0, row, t).transpose(0, 1));
        row += t;
    }
    TORCH_CHECK(row == n, "ragged_attention: counts do not cover the rows");
    auto out = torch::empty({n, hq * d}, q.options());
    std::vector<int64_t> first_row(nseq);
    for (size_t i = 0, acc = 0; i < nseq; acc += counts[i], ++i) first_row[i] = int64_t(acc);
    std::vector<DecodeTask> tasks;
    const int64_t hkv = k.size(1);
    TORCH_CHECK(hkv >= 1 && hq % hkv == 0, "ragged_attention: query heads must be a multiple of KV heads");
    int64_t decode_rows = 0;
    for (size_t r = 0; r < nrun; ++r) decode_rows += run_decode[r] ? run_rows[r] : 0;
    const int64_t per = heads_per_task(decode_rows, hq, hkv);
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
                    push_tasks(tasks, i, r0 + row, prefix + len - 1, KeySlots{prefix, path}, hq, hkv, per);
                }
                continue;
            }
            for (int64_t row = r0; row < r0 + t; ++row) {
                const int64_t pos = starts[i] + row - first_row[i];
                push_tasks(tasks, i, row, pos, KeySlots{pos + 1, nullptr}, hq, hkv, per);
            }
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
        auto o = at::scaled_dot_product_attention(qs.unsqueeze(0), kcs[i].narrow(1, 0, key_len).unsqueeze(0),
                                                  vcs[i].narrow(1, 0, key_len).unsqueeze(0), m, 0.0, false,
                                                  c10::nullopt, true);                     // [1, Hq, rows, D]
        out.narrow(0, r0, t).view({t, hq, d}).copy_(o.select(0, 0).narrow(1, 0, t).transpose(0, 1));
    }
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
            decode_attention<T, B>(q, out, tasks, kb, vb, caps, hq, kcs[0].size(0), d, impl);
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
          pybind11::arg("impl") = 0);
}

}  // namespace specdec
