# CUDA toolkit, cuBLAS and NCCL: detection, and the switch that builds the
# CUDA component, libsumma_cuda (summa::cuda: src/backend/cuda/, CudaBackend,
# its kernels, the NCCL and staged communicators). Included from the
# top-level CMakeLists.txt (enable_language must run at directory scope there).
#
#   SUMMA_CUDA               AUTO (default): build the CUDA backend when the
#                            toolkit, cuBLAS and NCCL are found, CPU only
#                            otherwise; ON: require them; OFF: CPU only.
#   SUMMA_CUDA_ARCHITECTURES GPU architectures to compile for (CMAKE_CUDA_ARCHITECTURES
#                            syntax), default "80;90" (A100, H100); CUDA 13 builds
#                            sm_75 and newer only.
#
# A sanitizer build (SUMMA_SANITIZE non-empty) compiles the component (host
# C++ sanitized, nvcc's code not) but registers no `cuda` test: ASan's shadow
# memory clashes with the CUDA driver's mappings (run GPU tests from a
# Release build, scripts/gpu_verify.sh). The component is a shared library
# that registers itself when loaded, so a static build (BUILD_SHARED_LIBS
# OFF) has none (SUMMA_CUDA=ON with it is an error).
#
# Results: SUMMA_CUDA_DETECTED (0/1: toolkit, cuBLAS and NCCL found),
# SUMMA_HAVE_CUDA (0/1: the CUDA backend is built), SUMMA_CUDA_DESCRIPTION,
# SUMMA_CUDA_TOOLKIT_ROOT; both flags land in summa/build_info.hpp.
set(SUMMA_CUDA_ARCHITECTURES "80;90" CACHE STRING
    "GPU architectures the CUDA backend is compiled for (CMAKE_CUDA_ARCHITECTURES syntax)")
set(SUMMA_CUDA_DETECTED 0)
set(SUMMA_HAVE_CUDA 0)
set(SUMMA_CUDA_DESCRIPTION "off")
set(SUMMA_CUDA_TOOLKIT_ROOT "")
if(NOT SUMMA_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_library(SUMMA_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  find_path(SUMMA_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
            /usr/local/cuda/include)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cublas AND SUMMA_NCCL_LIBRARY AND SUMMA_NCCL_INCLUDE_DIR)
    set(SUMMA_CUDA_DETECTED 1)
    set(SUMMA_CUDA_DESCRIPTION "detected ${CUDAToolkit_VERSION} (cuBLAS, NCCL)")
    get_filename_component(SUMMA_CUDA_TOOLKIT_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  elseif(SUMMA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SUMMA_CUDA=ON but CUDA toolkit/cuBLAS/NCCL not found "
                        "(toolkit: ${CUDAToolkit_FOUND}, nccl: ${SUMMA_NCCL_LIBRARY})")
  else()
    set(SUMMA_CUDA_DESCRIPTION "not found")
  endif()
endif()

if(SUMMA_CUDA_DETECTED AND NOT BUILD_SHARED_LIBS)
  if(SUMMA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SUMMA_CUDA=ON needs BUILD_SHARED_LIBS=ON: the CUDA component is a "
                        "shared library that registers itself with libsumma when loaded")
  endif()
  set(SUMMA_CUDA_DESCRIPTION "${SUMMA_CUDA_DESCRIPTION}; component not built (static build)")
elseif(SUMMA_CUDA_DETECTED)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    if(CUDAToolkit_NVCC_EXECUTABLE)
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    elseif(EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
  endif()
  # nvcc compiles host code with the C++ compiler of the rest of the project.
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX})
    set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES ${SUMMA_CUDA_ARCHITECTURES})
  endif()
  if(CMAKE_CXX_COMPILER_LAUNCHER AND NOT DEFINED CMAKE_CUDA_COMPILER_LAUNCHER)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${CMAKE_CXX_COMPILER_LAUNCHER})
  endif()
  enable_language(CUDA)
  # CMake 3.25 knows no C++20 dialect for nvcc (which has had it since CUDA 12).
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
  set(SUMMA_HAVE_CUDA 1)
  set(SUMMA_CUDA_DESCRIPTION
      "${CUDAToolkit_VERSION} (cuBLAS, NCCL), backend built for ${CMAKE_CUDA_ARCHITECTURES}")
endif()

# summa_add_cuda_sources(<target> <sources...>): compiles the .cu files into
# an object library linked into <target> (warnings as errors on the host side
# and in nvcc's own diagnostics; the usage requirements of libsumma) and links
# the CUDA runtime and cuBLAS privately: no public header needs CUDA.
function(summa_add_cuda_sources target)
  set(objects ${target}_cuda_objects)
  add_library(${objects} OBJECT ${ARGN})
  set_target_properties(${objects} PROPERTIES
    CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF
    POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(${objects} PRIVATE summa CUDA::cudart CUDA::cublas MPI::MPI_CXX)
  # 554: MatrixView<const T>'s conversion to MatrixView<const T> "will not
  # be called" -- true and harmless (it exists for MatrixView<T>).
  target_compile_options(${objects} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings --diag-suppress=554
                               -Xcompiler=-Wall,-Wextra,-Werror>)
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:${objects}>)
  target_link_libraries(${target} PRIVATE CUDA::cudart CUDA::cublas)
endfunction()
