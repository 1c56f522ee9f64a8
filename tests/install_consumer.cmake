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
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()
set(flags)
if(SANITIZE)  # a sanitized libsumma needs a sanitized executable
  set(flags "-DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZE}" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
endif()
step(${CMAKE_COMMAND} -S ${SUMMA_EXAMPLES_DIR} -B ${WORK_DIR}/build
     -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
     ${flags})
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
step(${MPIEXEC} -np 4 ${MPIEXEC_FLAGS} ${WORK_DIR}/build/summa_demo 96 16)
