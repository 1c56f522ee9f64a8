# The CPU backend's GEMM library (docs/design.md, "CPU GEMM"). libsumma loads
# a CBLAS at run time (dlopen, src/backend/cpu_blas.cpp), so nothing here is
# linked: this finds each library so the loader tries that file first and the
# tests can run every backend test against each (SUMMA_CPU_GEMM_LIBRARIES),
# and picks the default of CpuOptions::gemm (SUMMA_CPU_GEMM_DEFAULT in
# summa/build_info.hpp; $SUMMA_CPU_GEMM overrides it at run time).
#
#   -DSUMMA_CPU_GEMM=auto      the first found of blis, openblas, mkl; else eigen
#                              (BLIS first: the fastest on the CPUs measured,
#                              bench/README.md "CPU GEMM libraries")
#   -DSUMMA_CPU_GEMM=openblas  (or blis, mkl: required; eigen: no BLAS)
set(SUMMA_CPU_GEMM "auto" CACHE STRING
    "CPU GEMM default: auto (first found of blis, openblas, mkl), blis, openblas, mkl or eigen")
set_property(CACHE SUMMA_CPU_GEMM PROPERTY STRINGS auto openblas blis mkl eigen)

# Debian: libopenblas-dev (libopenblas.so.0 through the alternatives), MKL's libmkl_rt.
find_library(SUMMA_OPENBLAS_LIBRARY NAMES openblas DOC "OpenBLAS for the CPU GEMM")
# BLIS: the pthread build first (Debian: libblis-pthread-dev). The OpenMP
# build (Debian's default libblis.so) allocates in libgomp on every call, so a
# training step would not be allocation-free.
find_library(SUMMA_BLIS_CPU_LIBRARY NAMES blis
             HINTS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/blis-pthread
                   /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/blis-serial
             DOC "BLIS for the CPU GEMM (the pthread or serial build)")
find_library(SUMMA_MKL_LIBRARY NAMES mkl_rt DOC "MKL (single dynamic library) for the CPU GEMM")
set(_summa_blas_openblas ${SUMMA_OPENBLAS_LIBRARY})
set(_summa_blas_blis ${SUMMA_BLIS_CPU_LIBRARY})
set(_summa_blas_mkl ${SUMMA_MKL_LIBRARY})

set(SUMMA_CPU_GEMM_LIBRARIES eigen)
foreach(lib blis openblas mkl)
  if(_summa_blas_${lib})
    list(APPEND SUMMA_CPU_GEMM_LIBRARIES ${lib})
  endif()
endforeach()

if(SUMMA_CPU_GEMM STREQUAL "auto")
  list(LENGTH SUMMA_CPU_GEMM_LIBRARIES _n)
  if(_n GREATER 1)
    list(GET SUMMA_CPU_GEMM_LIBRARIES 1 SUMMA_CPU_GEMM_DEFAULT)
  else()
    set(SUMMA_CPU_GEMM_DEFAULT eigen)
  endif()
elseif(SUMMA_CPU_GEMM MATCHES "^(openblas|blis|mkl)$")
  if(NOT _summa_blas_${SUMMA_CPU_GEMM})
    message(FATAL_ERROR "SUMMA_CPU_GEMM=${SUMMA_CPU_GEMM}, but it was not found (Debian: "
                        "libopenblas-dev or libblis-dev; MKL: libmkl_rt on the library path)")
  endif()
  set(SUMMA_CPU_GEMM_DEFAULT ${SUMMA_CPU_GEMM})
elseif(SUMMA_CPU_GEMM STREQUAL "eigen")
  set(SUMMA_CPU_GEMM_DEFAULT eigen)
else()
  message(FATAL_ERROR "SUMMA_CPU_GEMM='${SUMMA_CPU_GEMM}' is not one of auto, openblas, blis, mkl, eigen")
endif()
message(STATUS "summa: CPU GEMM libraries found: ${SUMMA_CPU_GEMM_LIBRARIES}; default ${SUMMA_CPU_GEMM_DEFAULT}")

set_property(SOURCE src/backend/cpu_blas.cpp APPEND PROPERTY COMPILE_DEFINITIONS
             SUMMA_OPENBLAS_LIBRARY="${_summa_blas_openblas}"
             SUMMA_BLIS_LIBRARY="${_summa_blas_blis}" SUMMA_MKL_LIBRARY="${_summa_blas_mkl}")
