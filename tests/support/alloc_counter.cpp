// Interposes the glibc allocator to count heap allocations for the
// "no allocation inside the loop" tests. Disabled under AddressSanitizer.
#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <new>
#include <string_view>

#include "test_util.hpp"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<std::uint64_t> g_count{0};
std::atomic<std::uint64_t> g_mpi_count{0};
std::atomic<std::uint64_t> g_blas_count{0};
std::atomic<void*> g_first_caller{nullptr};
thread_local bool t_inside = false;

// Allocations made inside the MPI library (libnbc schedules, temporary
// reduction buffers) are MPI's business; they are counted apart.
bool from_mpi(void* caller) {
  Dl_info info{};
  if (dladdr(caller, &info) == 0 || info.dli_fname == nullptr) return false;
  const std::string_view f(info.dli_fname);
  for (std::string_view lib : {"libmpi", "libopen-pal", "libopen-rte", "openmpi/", "libpmix",
                               "libhwloc", "libevent", "libucp", "libucs"})
    if (f.find(lib) != std::string_view::npos) return true;
  return false;
}

// BLIS builds without its small-block pools (Debian's) malloc the control
// tree of every GEMM call (two small blocks; its pack buffers come from its
// own pool, allocated once): the library's business too, counted apart
// (docs/design.md, "CPU GEMM"). OpenBLAS and Eigen allocate nothing per call.
bool from_blas(void* caller) {
  Dl_info info{};
  if (dladdr(caller, &info) == 0 || info.dli_fname == nullptr) return false;
  return std::string_view(info.dli_fname).find("libblis") != std::string_view::npos;
}

[[maybe_unused]] void note_allocation(void* caller) {
  if (!g_counting.load(std::memory_order_relaxed) || t_inside) return;
  t_inside = true;
  if (from_mpi(caller)) {
    g_mpi_count.fetch_add(1, std::memory_order_relaxed);
  } else if (from_blas(caller)) {
    g_blas_count.fetch_add(1, std::memory_order_relaxed);
  } else if (g_count.fetch_add(1, std::memory_order_relaxed) == 0) {
    g_first_caller.store(caller, std::memory_order_relaxed);
  }
  t_inside = false;
}
// A macro so that the return address is that of the allocation's caller.
#define SUMMA_NOTE_ALLOCATION() note_allocation(__builtin_return_address(0))
}  // namespace

namespace summa::test {
CountAllocations::CountAllocations() {
  g_count = 0;
  g_mpi_count = 0;
  g_blas_count = 0;
  g_first_caller = nullptr;
  g_counting = true;
}
CountAllocations::~CountAllocations() {
  g_counting = false;
}
std::uint64_t CountAllocations::count() const {
  return g_count.load();
}
std::uint64_t CountAllocations::mpi_count() const {
  return g_mpi_count.load();
}
std::uint64_t CountAllocations::blas_count() const {
  return g_blas_count.load();
}
std::string CountAllocations::first_caller() const {
  void* address = g_first_caller.load();
  if (address == nullptr) return "none";
  Dl_info info{};
  if (dladdr(address, &info) == 0) return "unknown";
  std::string where = info.dli_fname ? info.dli_fname : "?";
  if (info.dli_sname) where += std::string(" ") + info.dli_sname;
  return where;
}
}  // namespace summa::test

#if defined(__SANITIZE_ADDRESS__)
bool summa::test::allocation_counting_available() {
  return false;
}
#else
bool summa::test::allocation_counting_available() {
  return true;
}

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);

void* malloc(std::size_t n) {
  SUMMA_NOTE_ALLOCATION();
  return __libc_malloc(n);
}
void* calloc(std::size_t a, std::size_t b) {
  SUMMA_NOTE_ALLOCATION();
  return __libc_calloc(a, b);
}
void* realloc(void* p, std::size_t n) {
  SUMMA_NOTE_ALLOCATION();
  return __libc_realloc(p, n);
}
void* aligned_alloc(std::size_t align, std::size_t n) {
  SUMMA_NOTE_ALLOCATION();
  return __libc_memalign(align, n);
}
void* memalign(std::size_t align, std::size_t n) {
  SUMMA_NOTE_ALLOCATION();
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, std::size_t align, std::size_t n) {
  SUMMA_NOTE_ALLOCATION();
  void* p = __libc_memalign(align, n);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
}

void* operator new(std::size_t n) {
  SUMMA_NOTE_ALLOCATION();
  if (void* p = __libc_malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  return operator new(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
#endif
