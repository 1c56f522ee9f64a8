#include "cpu_blas.hpp"

#include <dlfcn.h>

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
            " (BLIS does not know this CPU: set BLIS_ARCH_TYPE to the number of a "
            "kernel set it has, docs/design.md \"CPU GEMM\")";
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
  static const std::vector<std::string> names = {"openblas", "blis", "mkl"};
  return names;
}

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
    // RTLD_LOCAL: its symbols stay out of the global namespace, so a second
    // BLAS (or the program's own) never binds to them. Never dlclose'd.
    void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + file + ": " + (why != nullptr ? why : "cannot be loaded");
      continue;
    }
    auto lib = std::make_unique<BlasLibrary>();
    lib->name = std::string(name);
    lib->path = file;
    lib->sgemm = symbol<BlasLibrary::Sgemm>(h, "cblas_sgemm");
    lib->dgemm = symbol<BlasLibrary::Dgemm>(h, "cblas_dgemm");
    if (lib->sgemm == nullptr || lib->dgemm == nullptr) {
      tried += "\n  " + file + ": has no cblas_sgemm / cblas_dgemm";
      continue;  // kept open: harmless, and dlclose of a BLAS is not always safe
    }
    if (name == "openblas")
      lib->set_int_threads = dlsym(h, "openblas_set_num_threads");
    else if (name == "mkl")
      lib->set_int_threads = dlsym(h, "MKL_Set_Num_Threads");
    else
      lib->set_long_threads = dlsym(h, "bli_thread_set_num_threads");
    if (Dl_info info{}; dladdr(dlsym(h, "cblas_sgemm"), &info) != 0 && info.dli_fname != nullptr)
      lib->path = info.dli_fname;
    describe(h, *lib);
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
