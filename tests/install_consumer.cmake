# ctest -R install_consumer: cmake --install into a fresh prefix, configure
# examples/ alone against it (find_package(summa CONFIG REQUIRED)), build, and
# run the demo under mpiexec on a 2x2 mesh.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
step(${CMAKE_COMMAND} --install ${SUMMA_BINARY_DIR} --prefix ${prefix})
if(NOT EXISTS ${prefix}/lib/cmake/summa/summaConfig.cmake AND
   NOT EXISTS ${prefix}/lib64/cmake/summa/summaConfig.cmake)
  message(FATAL_ERROR "installed tree has no summaConfig.cmake")
endif()
# The consumer builds at -O0 (what is tested is the package, not the code's
# speed), sanitized like libsumma when it is.
set(flags -DCMAKE_BUILD_TYPE= -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX})
if(SANITIZE)  # a sanitized libsumma needs a sanitized executable
  list(APPEND flags "-DCMAKE_CXX_FLAGS=-O0 -fsanitize=${SANITIZE}"
       "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
else()
  list(APPEND flags "-DCMAKE_CXX_FLAGS=-O0")
endif()

# The shared libraries a program loads (ldd: the whole closure).
function(loaded_libraries exe out)
  execute_process(COMMAND ldd ${exe} RESULT_VARIABLE rc OUTPUT_VARIABLE libs ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ldd ${exe} failed (${rc}): ${err}")
  endif()
  set(${out} "${libs}" PARENT_SCOPE)
endfunction()

# 1. Every example builds against the package (they link summa::summa only),
#    the demo runs, and no program loads a CUDA library at start.
step(${CMAKE_COMMAND} -S ${SUMMA_EXAMPLES_DIR} -B ${WORK_DIR}/build ${flags})
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build --parallel 2)
step(${MPIEXEC} -np 4 ${MPIEXEC_FLAGS} ${WORK_DIR}/build/summa_demo 96 16)
foreach(exe summa_demo gpt_memory gpt_train gpt_generate custom_model)
  loaded_libraries(${WORK_DIR}/build/${exe} libs)
  if(libs MATCHES "libcudart|libcublas|libnccl|libsumma_cuda")
    message(FATAL_ERROR "${exe} loads CUDA libraries at start (the CUDA component is loaded "
                        "on first use only):\n${libs}")
  endif()
endforeach()

# 2. Where the package has the cuda component: gpt_train --backend cuda
#    loads it from the installed libdir on first use and reaches the CUDA
#    backend (on a machine without a GPU it fails saying so, not that the
#    component is missing).
if(NOT EXISTS ${prefix}/lib/cmake/summa/summaCudaTargets.cmake AND
   NOT EXISTS ${prefix}/lib64/cmake/summa/summaCudaTargets.cmake)
  message(STATUS "this summa has no cuda component: --backend cuda is not tried")
  return()
endif()
find_program(NVIDIA_SMI nvidia-smi)
if(SANITIZE AND NVIDIA_SMI)  # CUDA does not run under ASan (cmake/SummaCuda.cmake)
  return()
endif()
execute_process(COMMAND ${MPIEXEC} -np 1 ${MPIEXEC_FLAGS} ${WORK_DIR}/build/gpt_train
                        --backend cuda --steps 1 --layers 1 --hidden 32 --heads 2 --seq 16
                        --batch 2 --out ${WORK_DIR}/cuda_run --progress none
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
if(NOT rc EQUAL 0 AND NOT "${out}${err}" MATCHES "no CUDA device")
  message(FATAL_ERROR "gpt_train --backend cuda (the installed component) failed (${rc}):\n${out}${err}")
endif()
