#include "cpu_blas.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "summa/core/error.hpp"

// Where CMake found each library at configure time (empty: not found); the
// loader tries that file first, then the library's usual sonames.
#ifndef SUMMA_OPENBLAS_LIBRARY
#define SUMMA_OPENBLAS_LIBRARY ""
#endif
#ifndef SUMMA_BLIS_LIBRARY
#define SUMMA_BLIS_LIBRARY ""
#endif
#ifndef SUMMA_MKL_LIBRARY
#define SUMMA_MKL_LIBRARY ""
#endif

namespace summa::cpu_detail {

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr int kDeepBind = 0;
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif

struct Candidate {
  std::string_view name;
  const char* configured;
  std::vector<const char*> sonames;
  const char* threads_env;
};

const std::vector<Candidate>& candidates() {
  static const std::vector<Candidate> c = {
      {"openblas",
       SUMMA_OPENBLAS_LIBRARY,
       {"libopenblas.so.0", "libopenblas.so"},
       "OPENBLAS_NUM_THREADS"},
      {"blis", SUMMA_BLIS_LIBRARY, {"libblis.so.4", "libblis.so"}, "BLIS_NUM_THREADS"},
      {"mkl",
       SUMMA_MKL_LIBRARY,
       {"libmkl_rt.so.2", "libmkl_rt.so.1", "libmkl_rt.so"},
       "MKL_NUM_THREADS"},
  };
  return c;
}

template <class Fn>
Fn symbol(void* handle, const char* name) {
  void* p = dlsym(handle, name);
  Fn fn = nullptr;
  static_assert(sizeof(fn) == sizeof(p));
  std::memcpy(&fn, &p, sizeof p);
  return fn;
}

// What the library says about itself and the kernels it picked.
void describe(void* h, BlasLibrary& lib) {
  if (lib.name == "openblas") {
    if (auto config = symbol<char* (*)()>(h, "openblas_get_config")) lib.detail = config();
    if (auto core = symbol<char* (*)()>(h, "openblas_get_corename"))
      lib.detail += std::string(lib.detail.empty() ? "" : ", ") + "kernels " + core();
  } else if (lib.name == "blis") {
    if (auto version = symbol<const char* (*)()>(h, "bli_info_get_version_str"))
      lib.detail = std::string("BLIS ") + version();
    auto query = symbol<int (*)()>(h, "bli_arch_query_id");
    auto arch = symbol<const char* (*)(int)>(h, "bli_arch_string");
    if (query != nullptr && arch != nullptr) {
      const std::string a = arch(query());
      lib.detail += std::string(lib.detail.empty() ? "" : ", ") + "kernels " + a;
      lib.generic_kernels = a == "generic";
      if (lib.generic_kernels)
        lib.detail +=
            " (BLIS's reference code: it has no kernels for this CPU, or BLIS_ARCH_TYPE "
            "chose these; docs/design.md \"CPU GEMM\")";
    }
  } else if (lib.name == "mkl") {
    if (auto version = symbol<void (*)(char*, int)>(h, "MKL_Get_Version_String")) {
      char buf[256] = {};
      version(buf, static_cast<int>(sizeof buf) - 1);
      lib.detail = buf;
    }
  }
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<BlasLibrary>, std::less<>> loaded;
};

Registry& registry() {
  static Registry r;  // never destroyed before the libraries' users: see load_blas
  return r;
}

}  // namespace

void BlasLibrary::set_threads(int threads) const {
  if (set_int_threads != nullptr) {
    void (*fn)(int) = nullptr;
    std::memcpy(&fn, &set_int_threads, sizeof fn);
    fn(threads);
  } else if (set_long_threads != nullptr) {
    void (*fn)(std::int64_t) = nullptr;
    std::memcpy(&fn, &set_long_threads, sizeof fn);
    fn(threads);
  }
}

const std::vector<std::string>& blas_names() {
  static const std::vector<std::string> names = {"blis", "openblas", "mkl"};
  return names;
}

namespace {

// dlopen `file` and read its CBLAS and helper symbols; nullptr (and why, in
// `tried`) when it cannot be loaded or is not a CBLAS.
std::unique_ptr<BlasLibrary> open_library(std::string_view name, const std::string& file,
                                          std::string& tried) {
  // RTLD_LOCAL: its symbols stay out of the global namespace, so a second
  // BLAS (or the program's own) never binds to them; RTLD_DEEPBIND: its own
  // calls bind to its own functions, not to a BLAS of the same names the
  // program linked (summa_gemm's ScaLAPACK BLIS would otherwise run this
  // copy's internals with that copy's kernels). Not under AddressSanitizer,
  // which refuses RTLD_DEEPBIND. Kept open for the process's lifetime.
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL | kDeepBind);
  if (h == nullptr) {
    const char* why = dlerror();
    tried += "\n  " + file + ": " + (why != nullptr ? why : "cannot be loaded");
    return nullptr;
  }
  auto lib = std::make_unique<BlasLibrary>();
  lib->name = std::string(name);
  lib->path = file;
  lib->handle = h;
  lib->sgemm = symbol<BlasLibrary::Sgemm>(h, "cblas_sgemm");
  lib->dgemm = symbol<BlasLibrary::Dgemm>(h, "cblas_dgemm");
  if (lib->sgemm == nullptr || lib->dgemm == nullptr) {
    tried += "\n  " + file + ": has no cblas_sgemm / cblas_dgemm";
    return nullptr;  // kept open: harmless
  }
  if (name == "openblas") {
    lib->set_int_threads = dlsym(h, "openblas_set_num_threads");
  } else if (name == "mkl") {
    lib->set_int_threads = dlsym(h, "MKL_Set_Num_Threads");
  } else {
    lib->set_long_threads = dlsym(h, "bli_thread_set_num_threads");
    // BLIS chooses its kernels when it initialises (its first call would):
    // initialise now, so that the query below reports that choice.
    if (auto init = symbol<void (*)()>(h, "bli_init")) init();
  }
  if (Dl_info info{}; dladdr(dlsym(h, "cblas_sgemm"), &info) != 0 && info.dli_fname != nullptr)
    lib->path = info.dli_fname;
  describe(h, *lib);
  return lib;
}

// When the BLIS in `file` would run its reference code on this CPU: the
// number of its kernel set for this CPU's instructions (skx with AVX-512,
// zen3 on AMD and haswell elsewhere with AVX2 and FMA); else -1.
int blis_kernels_if_unknown(const std::string& file) {
  void* h = dlmopen(LM_ID_NEWLM, file.c_str(), RTLD_NOW | RTLD_LOCAL);  // a namespace of its own
  if (h == nullptr) return -1;
  struct Close {
    void* h;
    ~Close() { dlclose(h); }
  } close{h};
  auto init = symbol<void (*)()>(h, "bli_init");
  auto query = symbol<int (*)()>(h, "bli_arch_query_id");
  auto arch = symbol<const char* (*)(int)>(h, "bli_arch_string");
  if (init == nullptr || query == nullptr || arch == nullptr) return -1;
  init();
  if (std::string_view(arch(query())) != "generic") return -1;
  __builtin_cpu_init();
  std::vector<std::string_view> wanted;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    wanted.push_back("skx");
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    wanted.push_back(__builtin_cpu_is("amd") ? "zen3" : "haswell");
  for (std::string_view w : wanted)
    for (int id = 0; id < 64; ++id) {
      const char* n = arch(id);
      if (n == nullptr || std::string_view(n) == "generic") break;
      if (w == n) return id;
    }
  return -1;
}

}  // namespace

const BlasLibrary& load_blas(std::string_view name, int threads) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  if (auto it = r.loaded.find(name); it != r.loaded.end()) return *it->second;
  const Candidate* c = nullptr;
  for (const Candidate& x : candidates())
    if (x.name == name) c = &x;
  if (c == nullptr)
    throw Error("CPU GEMM library '" + std::string(name) +
                "' is not one of eigen, openblas, blis, mkl");
  // A library that starts a thread pool when loaded sizes it from its
  // environment variable: ask for what this rank will use unless the user
  // set it.
  if (std::getenv(c->threads_env) == nullptr)
    setenv(c->threads_env, std::to_string(threads).c_str(), 0);
  std::vector<std::string> files;
  if (c->configured[0] != '\0') files.emplace_back(c->configured);
  for (const char* s : c->sonames) files.emplace_back(s);
  std::string tried;
  for (const std::string& file : files) {
    // BLIS picks its kernels once, when it initialises, from the CPU's family
    // and model; on a CPU newer than the BLIS it runs its reference code,
    // several times slower than its x86 kernels. A copy loaded in a namespace
    // of its own (dlmopen) says which it would pick; when that is the
    // reference code, BLIS_ARCH_TYPE names the kernel set this CPU's
    // instructions run before the copy summa uses is loaded.
    bool chose_kernels = false;
    if (name == "blis" && std::getenv("BLIS_ARCH_TYPE") == nullptr)
      if (const int id = blis_kernels_if_unknown(file); id >= 0) {
        setenv("BLIS_ARCH_TYPE", std::to_string(id).c_str(), 1);
        chose_kernels = true;
      }
    std::unique_ptr<BlasLibrary> lib = open_library(name, file, tried);
    if (lib == nullptr) continue;
    if (chose_kernels)
      lib->detail +=
          " (chosen by summa: BLIS does not know this CPU and would run its reference code; "
          "BLIS_ARCH_TYPE overrides, docs/design.md \"CPU GEMM\")";
    return *r.loaded.emplace(std::string(name), std::move(lib)).first->second;
  }
  throw Error("CPU GEMM library '" + std::string(name) + "' could not be loaded; tried:" + tried +
              "\n(install it, e.g. Debian's lib" + std::string(name == "mkl" ? "mkl-rt" : name) +
              (name == "mkl" ? "" : "-dev") +
              ", or choose another with SUMMA_CPU_GEMM / --cpu-gemm)");
}

bool blas_loads(std::string_view name) {
  try {
    load_blas(name, 1);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace summa::cpu_detail
