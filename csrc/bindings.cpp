// Python entry points of specdec._C: one block-quantized linear, and what the CPU supports.
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <torch/extension.h>

#include "ops.h"
#include "qlinear.h"

namespace {

using specdec::QAct;
using specdec::QWeight;

// Rows from which AMX's tile multiplies beat VNNI's: 20 (python -m specdec.bench.kernels --methods ours-vnni,ours-amx;
// docs/benchmarks/amx). Below it, preparing the scaled code planes costs more than the tile multiplies save.
int64_t g_amx_min_rows = 20;

// The kernel qlinear's impl 0 runs for a weight and m rows: AMX where the CPU has it and m reaches g_amx_min_rows,
// else AVX-512 VNNI where the CPU has it, else AVX2 where it runs the format, else the portable one (as impl:
// 1 portable, 2 AVX-512, 3 AVX2, 4 AMX).
int64_t auto_impl(const QWeight& w, int64_t m) {
    // AMX only where a superblock spans 256 k (Q4_K, Q6_K): blocks of one 32-k group (Q8_0, Q5_0, the int8 heads)
    // half-fill a 64-k tile product and pay the float epilogue every 32 k (measured 1.27x slower than VNNI at 256 rows)
    if (m >= g_amx_min_rows && int64_t(w.group) * w.sb >= 256 && w.bits != 3 && specdec::cpu_has_amx()) return 4;
    if (specdec::cpu_has_avx512_vnni()) return 2;
    return specdec::cpu_has_avx2() && specdec::qlinear_avx2_supports(w) ? 3 : 1;
}

inline int64_t aligned64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

// One calling thread's scratch for qlinear's own buffers, kept between calls. A one-token step makes ~100 qlinear
// calls; allocating their four buffers each time through the CPU allocator (posix_memalign: glibc's sorted bins and
// their consolidation) was a few percent of a draft step's samples (perf), and a prompt chunk's fp32 sums (tens of MB) were
// fresh pages, faulted in and zeroed, at every call. Grow-only up to kKeepBytes; a larger request is served and
// released by the call itself. A call's buffers are used within it only (qlinear does not re-enter itself).
class Scratch {
public:
    static constexpr size_t kKeepBytes = size_t(64) << 20;
    void* get(size_t bytes) {
        bytes = std::max<size_t>(bytes, 64);
        if (bytes > cap_) {
            std::free(p_);
            cap_ = (bytes + 4095) / 4096 * 4096;
            p_ = std::aligned_alloc(64, cap_);
            TORCH_CHECK(p_ != nullptr, "qlinear: out of memory for ", cap_, " bytes of scratch");
        }
        return p_;
    }
    void trim() {                    // after a call that grew it past kKeepBytes
        if (cap_ > kKeepBytes) {
            std::free(p_);
            p_ = nullptr;
            cap_ = 0;
        }
    }
    ~Scratch() { std::free(p_); }

private:
    void* p_ = nullptr;
    size_t cap_ = 0;
};
thread_local Scratch t_scratch;

// Returns [m, n] in x's dtype when that is bf16, else fp32.
// impl: 0 = best for this CPU and row count, 1 = portable, 2 = AVX-512 VNNI, 3 = AVX2, 4 = AMX (2-4: an error on a
// CPU without it)
torch::Tensor qlinear(const torch::Tensor& x, const torch::Tensor& qw, const torch::Tensor& sc,
                      const torch::Tensor& mn, const torch::Tensor& dm, const c10::optional<torch::Tensor>& bias,
                      int64_t bits, int64_t group, int64_t sb, int64_t impl) {
    // x: [m, k] (any float dtype); returns [m, n] fp32
    TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "qlinear: x must be a 2-D CPU tensor");
    TORCH_CHECK(((bits == 4 || bits == 6 || bits == 8) && (group == 16 || group == 32) || (bits == 3 && group == 32)) &&
                sb >= 1, "qlinear: bad format");
    TORCH_CHECK(qw.dtype() == torch::kUInt8 && sc.dtype() == torch::kInt8 && mn.dtype() == torch::kInt8 &&
                dm.dtype() == torch::kFloat16, "qlinear: packed tensors have the wrong dtypes");
    TORCH_CHECK(qw.is_contiguous() && sc.is_contiguous() && mn.is_contiguous() && dm.is_contiguous(),
                "qlinear: packed tensors must be contiguous");
    const int64_t m = x.size(0), k = x.size(1), ng = k / group, nb = qw.size(0), n = nb * 16;
    TORCH_CHECK(k % group == 0 && qw.dim() == 3 && qw.size(1) == ng && qw.size(2) == group * 16 * bits / 8,
                "qlinear: x has ", k, " features, the packed weight does not match");
    const int64_t ns = (ng + sb - 1) / sb;
    TORCH_CHECK(sc.numel() == nb * ng * 16 && mn.numel() == nb * ng * 16 && dm.numel() == nb * ns * 32,
                "qlinear: scale tensors do not match the weight");
    TORCH_CHECK(impl != 2 || specdec::cpu_has_avx512_vnni(), "qlinear: this CPU lacks AVX-512 VNNI");
    TORCH_CHECK(impl != 3 || specdec::cpu_has_avx2(), "qlinear: this CPU lacks AVX2, FMA or F16C");
    TORCH_CHECK(impl != 4 || specdec::cpu_has_amx(), "qlinear: this CPU (or its kernel) does not run AMX-INT8");
    TORCH_CHECK(impl != 4 || bits != 3, "qlinear: the AMX kernel has no 3-bit codes (the VNNI one has)");

    // bf16 and fp32 inputs are read as they are (bf16 -> fp32 is exact); other dtypes convert to fp32
    const torch::Tensor xf = x.scalar_type() == torch::kBFloat16 ? x.contiguous() : x.to(torch::kFloat32).contiguous();
    const bool bf16_in = xf.scalar_type() == torch::kBFloat16;
    const int64_t stride = specdec::asum_stride(k, int(group));
    // bf16 in -> bf16 out, rounded here (shared code, round half to even) so no separate cast op is needed
    auto out_bf16 = bf16_in ? torch::empty({m, n}, torch::kBFloat16) : torch::Tensor();
    torch::Tensor b;
    if (bias.has_value() && bias->defined()) {
        b = bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() ? *bias
                                                                             : bias->to(torch::kFloat32).contiguous();
        TORCH_CHECK(b.numel() == n, "qlinear: bias has ", b.numel(), " entries, expected ", n);
    }
    QWeight w{qw.data_ptr<uint8_t>(), sc.data_ptr<int8_t>(), mn.data_ptr<int8_t>(),
              reinterpret_cast<const uint16_t*>(dm.data_ptr<at::Half>()), n, k, int(bits), int(group), int(sb)};
    const int64_t path = impl == 0 ? auto_impl(w, m) : impl;
    const bool use_amx = path == 4, use_avx = path == 2 || use_amx, use_avx2 = path == 3;
    // the AMX kernel rounds its bf16 rows itself: no fp32 rows at all (a prompt chunk's gate_up would be ~37 MB,
    // fresh pages at every call)
    const bool direct_bf16 = use_amx && bf16_in;
    // fp32 rows are returned only for an fp32 (or other) input; for a bf16 one they are the kernel's scratch
    auto out = bf16_in ? torch::Tensor() : torch::empty({m, n}, torch::kFloat32);
    // The call's own buffers: the activation codes (64 bytes of slack past the last row: the AMX kernel's last tile
    // load of a partial 64-k chunk reads into it, against zero codes), their group sums and scales, and the fp32
    // sums a bf16 output is rounded from
    const int64_t a8_bytes = aligned64(m * k + 64), asum_bytes = aligned64(m * stride * 2), ascale_bytes = aligned64(m * ns * 4);
    const int64_t sums_bytes = bf16_in && !direct_bf16 ? m * n * 4 : 0;
    // the AMX kernel's tiles read the codes in chunks of 64 k (QAct::a_chunks), where a superblock spans whole chunks
    const int64_t nchunks = (k + 63) / 64;
    const bool chunked = use_amx && (sb * group) % 64 == 0;
    const int64_t chunks_bytes = chunked ? aligned64(nchunks * m * 64) : 0;
    char* scratch = static_cast<char*>(t_scratch.get(size_t(a8_bytes + asum_bytes + ascale_bytes + sums_bytes +
                                                            chunks_bytes)));
    {
        pybind11::gil_scoped_release no_gil;
        const void* xp = xf.data_ptr();
        int8_t* ap = reinterpret_cast<int8_t*>(scratch);
        int16_t* sp = reinterpret_cast<int16_t*>(scratch + a8_bytes);
        float* cp = reinterpret_cast<float*>(scratch + a8_bytes + asum_bytes);
        float* sums = bf16_in ? reinterpret_cast<float*>(scratch + a8_bytes + asum_bytes + ascale_bytes) : nullptr;
        at::parallel_for(0, m, 16, [&](int64_t r0, int64_t r1) {
            auto run = [&](auto* x0) {
                using T = std::remove_const_t<std::remove_pointer_t<decltype(x0)>>;
                const T* xr = x0 + r0 * k;
                if (use_avx)
                    specdec::quantize_rows_avx512<T>(xr, r1 - r0, k, int(group), int(sb), ap + r0 * k, sp + r0 * stride,
                                                     cp + r0 * ns);
                else
                    specdec::quantize_rows<T>(xr, r1 - r0, k, int(group), int(sb), ap + r0 * k, sp + r0 * stride, cp + r0 * ns);
            };
            if (bf16_in)
                run(static_cast<const uint16_t*>(xp));
            else
                run(static_cast<const float*>(xp));
        });
        QAct xa{ap, sp, cp, m, stride};
        if (chunked) {
            int8_t* chunks = reinterpret_cast<int8_t*>(scratch + a8_bytes + asum_bytes + ascale_bytes + sums_bytes);
            // a row's last chunk reads on into the next row (the last row's into the slack): the kernel multiplies
            // those bytes by zero codes
            at::parallel_for(0, nchunks, 8, [&](int64_t q0, int64_t q1) {
                for (int64_t q = q0; q < q1; ++q)
                    for (int64_t r = 0; r < m; ++r) std::memcpy(chunks + (q * m + r) * 64, ap + r * k + q * 64, 64);
            });
            xa.a_chunks = chunks;
        }
        const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
        float* op = direct_bf16 ? nullptr : bf16_in ? sums : out.data_ptr<float>();
        uint16_t* obp = direct_bf16 ? reinterpret_cast<uint16_t*>(out_bf16.data_ptr<c10::BFloat16>()) : nullptr;
        // Threads split the output columns; each column's arithmetic is the same whoever computes it.
        at::parallel_for(0, nb, 1, [&](int64_t c0, int64_t c1) {
            if (use_amx)
                specdec::qlinear_amx(w, xa, bp, op, obp, c0, c1);
            else if (use_avx)
                specdec::qlinear_avx512(w, xa, bp, op, c0, c1);
            else if (use_avx2)
                specdec::qlinear_avx2(w, xa, bp, op, c0, c1);
            else
                specdec::qlinear_portable(w, xa, bp, op, c0, c1);
            if (bf16_in && !direct_bf16) {
                c10::BFloat16* ob = out_bf16.data_ptr<c10::BFloat16>();
                for (int64_t r = 0; r < m; ++r)
                    if (use_avx)
                        specdec::to_bf16_avx512(op + r * n + c0 * 16, reinterpret_cast<uint16_t*>(ob + r * n + c0 * 16),
                                                (c1 - c0) * 16);
                    else
                        for (int64_t j = c0 * 16; j < c1 * 16; ++j) ob[r * n + j] = c10::BFloat16(op[r * n + j]);
            }
        });
    }
    t_scratch.trim();
    return bf16_in ? out_bf16 : out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "specdec CPU kernels: block-quantized (int4 / int8 codes) linear layers, fused norm and rotary steps";
    m.def("qlinear", &qlinear, "y[m, n] fp32 = x[m, k] @ dequant(W)^T (+ bias)", pybind11::arg("x"),
          pybind11::arg("qw"), pybind11::arg("sc"), pybind11::arg("mn"), pybind11::arg("dm"), pybind11::arg("bias"),
          pybind11::arg("bits"), pybind11::arg("group"), pybind11::arg("sb"), pybind11::arg("impl") = 0);
    specdec::register_ops(m);
    specdec::register_attention(m);
    specdec::register_bf16_linear(m);
    specdec::register_stack(m);
    specdec::register_cpu_allocator(m);
    m.def("set_prefetch_distance", &specdec::set_prefetch_distance, "bytes of weights prefetched ahead (0 = off)");
    m.def("prefetch_distance", &specdec::prefetch_distance);
    m.def("has_avx512_vnni", &specdec::cpu_has_avx512_vnni, "the CPU runs the AVX-512 VNNI kernel");
    m.def("has_amx", &specdec::cpu_has_amx, "the CPU runs the AMX-INT8 kernel (and Linux granted the tile state)");
    m.def("set_amx_min_rows", [](int64_t rows) { g_amx_min_rows = rows < 1 ? 1 : rows; },
          "rows from which qlinear's impl 0 takes the AMX kernel");
    m.def("amx_min_rows", [] { return g_amx_min_rows; });
    m.def("has_avx2", &specdec::cpu_has_avx2, "the CPU runs the AVX2 kernel (4-, 6- and 8-bit codes)");
    m.def("vector_kernel", [](int64_t bits, int64_t group) {   // qlinear's impl 0 rule, asked of a format
        return auto_impl(QWeight{nullptr, nullptr, nullptr, nullptr, 16, group, int(bits), int(group), 1}, 1) != 1;
    }, "whether qlinear runs codes of this many bits and this group on a vector kernel (not the portable one)",
          pybind11::arg("bits"), pybind11::arg("group") = 32);
}
