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

# ---- the environment of every test, so that a plain `ctest` runs them right:
# the sanitizer settings of a checked build (SUMMA_SANITIZE) and Open MPI's
# kill delay.
# - LeakSanitizer: leaks inside the MPI stack are suppressed (tests/lsan.supp);
#   use_tls=0 because GCC 12's LSan reads a bogus dynamic-TLS range under
#   glibc 2.36 in some MPI processes and its tracer then segfaults at exit
#   after every case passed. A pointer held only in thread-local storage would
#   be reported as a leak; no leak can be missed. The MPI plugins stay mapped
#   until the report (src/core/sanitizer_support.cpp), so the fast unwinder
#   suffices for the suppressions to name them.
# - protect_shadow_gap=0: the CUDA runtime maps memory where ASan would
#   protect (no `cuda` test runs here, but a CUDA-component program may probe
#   for a device).
# - quarantine_size_mb=16 (ASan's default 256): freed memory is held back
#   from reuse, to catch a use after free, in 16 MiB per process. With up to
#   9 ranks per test the default's fresh pages (page faults, and LSan's scan
#   at exit) cost the multi-rank tests 8-12 % of their time (measured
#   2026-12-07 on the 2-core AMD EPYC f25m17: comm_np9, custom_model_np8,
#   generate_np9 and traffic_np9 took 151 s against 173 s, and 198 s
#   against 224 s in the other order; comm_np9, generate_np9 and
#   traffic_np9 in the order 16/256/256/16 MiB 272 s against 296 s); a use
#   soon after the free, the usual one, is still caught.
# - every sanitizer report is fatal.
# - Open MPI ends a job whose rank exited non-zero by SIGTERM, then SIGKILL
#   odls_base_sigkill_timeout seconds later (default 1): 1-2 s of idle wait
#   for every launch that fails on purpose (the fault suites' ~300 error
#   cases, the refusal tests). Every rank of summa's programs ends on its own
#   with the agreed error, so the tests set 0 (other MPIs ignore the
#   variable); a user's mpirun keeps Open MPI's default.
# - Not ess_singleton_isolated (a singleton start without Open MPI's helper
#   daemon, 0.25 s instead of 0.4 s): every isolated singleton takes the
#   same session directory, so two at once (ctest -j) remove each other's
#   (seen: "A call to mkdir was unable to create ... jf.0/1").
# summa_apply_test_env(): on every test of the calling directory (called last
# in tests/ and bench/).
function(summa_apply_test_env)
  set(_test_env "OMPI_MCA_odls_base_sigkill_timeout=0")
  if(SUMMA_SANITIZE)
    list(APPEND _test_env
      "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_odr_violation=0:protect_shadow_gap=0:allocator_may_return_null=1:quarantine_size_mb=16"
      "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0:use_tls=0"
      "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
  endif()
  get_property(_tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS _tests)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT ${_test_env})
  endforeach()
endfunction()
