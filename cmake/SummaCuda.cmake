# Detects the CUDA toolkit, cuBLAS and NCCL. Nothing is built with them yet
# (the CUDA backend plugs into the Backend/Communicator seam later); the result
# is reported in summa/build_info.hpp. SUMMA_CUDA=OFF skips, ON requires them.
set(SUMMA_CUDA_DETECTED 0)
set(SUMMA_CUDA_DESCRIPTION "off")
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
  elseif(SUMMA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SUMMA_CUDA=ON but CUDA toolkit/cuBLAS/NCCL not found "
                        "(toolkit: ${CUDAToolkit_FOUND}, nccl: ${SUMMA_NCCL_LIBRARY})")
  else()
    set(SUMMA_CUDA_DESCRIPTION "not found")
  endif()
endif()
