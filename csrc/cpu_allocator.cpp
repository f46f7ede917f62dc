// A CPU allocator that keeps freed blocks for the next request of the same size class.
//
// A one-token step allocates a few hundred small tensors (each layer's norms, linear outputs, attention rows), and
// every one went through posix_memalign: glibc's sorted bins, splitting and consolidation. perf put ~3% of a draft
// step's samples in _int_malloc and its kin, all of it on the thread that the other one waits for between parallel
// regions; with jemalloc preloaded the same step ran ~6% faster. A step asks for the same sizes as the step before,
// so a free list per size class serves nearly every request after the first step. This is the idea of the caching
// allocators PyTorch uses on its accelerators (and of the tcmalloc / jemalloc that vLLM's and IPEX's CPU guides
// preload), kept small: size classes of four steps per power of two, blocks up to kMaxBlock, at most kMaxKept bytes
// kept; anything else goes to c10's own alloc_cpu / free_cpu, as the default allocator's do.
//
// Installed by specdec._C.use_reusing_cpu_allocator() (models/quantization/kernels.py calls it on the extension's
// first import unless SPECDEC_CPU_ALLOCATOR=system). Tensors allocated before keep their own deleter.
//
// Included into torch_ops.cpp (one parse of torch's headers).
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <array>
#include <mutex>
#include <vector>

namespace {

class ReusingCpuAllocator final : public c10::Allocator {
public:
    static constexpr size_t kHeader = 64;                  // the block's class, ahead of the 64-byte aligned data
    static constexpr size_t kMinBlock = 256;
    static constexpr size_t kMaxBlock = size_t(32) << 20;  // a larger request is the system's to serve
    static constexpr size_t kMaxKept = size_t(128) << 20;  // freed bytes kept for reuse, at most
    static constexpr int kClasses = 80;
    static constexpr int64_t kUncached = -1;

    static ReusingCpuAllocator& instance() {
        static auto* self = new ReusingCpuAllocator();     // never destroyed: tensors may be freed at exit
        return *self;
    }

    // Size class of a request: 256 bytes and below share class 0; above, (2^e, 2^(e+1)] is cut into four steps.
    static int64_t size_class(size_t n) {
        if (n <= kMinBlock) return 0;
        const int e = 63 - __builtin_clzll(n - 1);         // 2^e < n <= 2^(e+1)
        const size_t step = size_t(1) << (e - 2);
        const int64_t idx = int64_t((n - (size_t(1) << e) + step - 1) / step);   // 1..4
        return int64_t(e - 8) * 4 + idx;
    }
    static size_t class_bytes(int64_t cls) {
        if (cls == 0) return kMinBlock;
        const int e = int((cls - 1) / 4) + 8;
        const int64_t idx = (cls - 1) % 4 + 1;
        return (size_t(1) << e) + size_t(idx) * (size_t(1) << (e - 2));
    }

    c10::DataPtr allocate(size_t n) override {
        const int64_t cls = n <= kMaxBlock ? size_class(n) : kUncached;
        char* base = nullptr;
        if (cls != kUncached) {
            std::lock_guard<std::mutex> lock(mutex_);
            auto& list = free_[size_t(cls)];
            if (!list.empty()) {
                base = list.back();
                list.pop_back();
                kept_ -= class_bytes(cls);
            }
        }
        if (base == nullptr) {
            base = static_cast<char*>(c10::alloc_cpu(kHeader + (cls != kUncached ? class_bytes(cls) : n)));
            *reinterpret_cast<int64_t*>(base) = cls;
        }
        void* data = base + kHeader;
        return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
    }

    static void release(void* data) {
        if (data != nullptr) instance().put(static_cast<char*>(data) - kHeader);
    }

    c10::DeleterFnPtr raw_deleter() const override { return &release; }
    void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

    size_t kept() {
        std::lock_guard<std::mutex> lock(mutex_);
        return kept_;
    }

private:
    ReusingCpuAllocator() {
        static_assert(kMaxBlock <= (size_t(1) << 26), "kClasses covers blocks up to 64 MB");
    }

    void put(char* base) {
        const int64_t cls = *reinterpret_cast<const int64_t*>(base);
        if (cls != kUncached) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (kept_ + class_bytes(cls) <= kMaxKept) {
                free_[size_t(cls)].push_back(base);
                kept_ += class_bytes(cls);
                return;
            }
        }
        c10::free_cpu(base);
    }

    std::mutex mutex_;
    std::array<std::vector<char*>, kClasses> free_;
    size_t kept_ = 0;
};

}  // namespace

namespace specdec {

void register_cpu_allocator(pybind11::module_& m) {
    m.def("use_reusing_cpu_allocator", [] {
        c10::SetCPUAllocator(&ReusingCpuAllocator::instance(), /*priority=*/1);
        return c10::GetCPUAllocator() == &ReusingCpuAllocator::instance();
    }, "make the CPU allocator the one that keeps freed blocks for reuse (csrc/cpu_allocator.cpp); True if it is now");
    m.def("cpu_allocator_kept_bytes", [] { return ReusingCpuAllocator::instance().kept(); },
          "bytes of freed blocks the reusing CPU allocator holds for reuse");
    m.def("cpu_allocator_size_class", [](int64_t n) {
        TORCH_CHECK(n >= 0, "a size is >= 0");
        const size_t bytes = size_t(n);
        if (bytes > ReusingCpuAllocator::kMaxBlock) return std::make_tuple(int64_t(-1), n);
        const int64_t cls = ReusingCpuAllocator::size_class(bytes);
        return std::make_tuple(cls, int64_t(ReusingCpuAllocator::class_bytes(cls)));
    }, "(class, block bytes) a request of n bytes is served from; (-1, n) past the largest class");
}

}  // namespace specdec
