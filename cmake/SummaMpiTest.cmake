# MPI launch settings shared by tests, examples and benchmarks.
# OpenMPI refuses to run as root and to place more ranks than cores unless
# told; CI and the Quick start run as root on a 2-core machine.
set(SUMMA_MPIEXEC_PREFLAGS ${MPIEXEC_PREFLAGS})
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _summa_mpiexec_version
                ERROR_QUIET)
if(_summa_mpiexec_version MATCHES "Open MPI|OpenRTE")
  list(APPEND SUMMA_MPIEXEC_PREFLAGS --oversubscribe)
  execute_process(COMMAND id -u OUTPUT_VARIABLE _summa_uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_summa_uid STREQUAL "0")
    list(APPEND SUMMA_MPIEXEC_PREFLAGS --allow-run-as-root)
  endif()
endif()
set(SUMMA_TEST_TIMEOUT 600 CACHE STRING "Seconds before a hung test is killed")

# summa_add_mpi_test(<name> <target> <ranks> [ARGS ...] [LABELS ...] [ENVIRONMENT VAR=value ...])
# ENVIRONMENT sets the test's environment (inherited by every rank), e.g.
# SUMMA_TEST_BACKEND=cuda for the `cuda` variants of a test.
function(summa_add_mpi_test name target ranks)
  cmake_parse_arguments(ARG "" "" "ARGS;LABELS;ENVIRONMENT" ${ARGN})
  add_test(NAME ${name}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks}
                   ${SUMMA_MPIEXEC_PREFLAGS} $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS}
                   ${ARG_ARGS})
  set_tests_properties(${name} PROPERTIES PROCESSORS ${ranks} TIMEOUT ${SUMMA_TEST_TIMEOUT}
                       LABELS "mpi;np${ranks};${ARG_LABELS}")
  if(ARG_ENVIRONMENT)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${ARG_ENVIRONMENT}")
  endif()
endfunction()
