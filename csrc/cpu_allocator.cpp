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
// first import unless SPECDEC_CPU_ALLOCATOR=system). Tensors allocated before keep their own deleter; a raw block
// allocated before (oneDNN's) may come back through this allocator's raw deleter, which hands it to the default one.
//
// Included into torch_ops.cpp (one parse of torch's headers).
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <array>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

class ReusingCpuAllocator final : public c10::Allocator {
public:
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
        void* p = nullptr;
        std::lock_guard<std::mutex> lock(mutex_);
        if (cls != kUncached && !free_[size_t(cls)].empty()) {
            p = free_[size_t(cls)].back();
            free_[size_t(cls)].pop_back();
            kept_ -= class_bytes(cls);
        } else {
            p = c10::alloc_cpu(cls != kUncached ? class_bytes(cls) : n);   // nullptr for n = 0
        }
        if (p != nullptr) live_[p] = cls;
        return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
    }

    // Every block this allocator handed out is in live_. A pointer that is not was allocated before it was installed
    // and is freed through this one's raw_deleter (oneDNN's ideep buffers take the current CPU allocator's raw
    // deleter when they are freed): it goes back to the default allocator's.
    static void release(void* p) {
        if (p != nullptr) instance().put(p);
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
        live_.reserve(4096);
    }

    void put(void* p) {
        bool ours = false;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            const auto it = live_.find(p);
            if (it != live_.end()) {
                ours = true;
                const int64_t cls = it->second;
                live_.erase(it);
                if (cls != kUncached && kept_ + class_bytes(cls) <= kMaxKept) {
                    free_[size_t(cls)].push_back(p);
                    kept_ += class_bytes(cls);
                    return;
                }
            }
        }
        if (ours)
            c10::free_cpu(p);
        else
            c10::GetDefaultCPUAllocator()->raw_deleter()(p);   // allocated by the default allocator
    }

    std::mutex mutex_;
    std::unordered_map<void*, int64_t> live_;               // blocks handed out and not yet freed: their class
    std::array<std::vector<void*>, kClasses> free_;
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
