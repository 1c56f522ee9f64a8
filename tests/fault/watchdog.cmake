# The collective watchdog ends a hung job (tests/fault/watchdog_abort.cpp):
# within seconds, with a non-zero status and a report that names the lagging
# rank (the last one) and what it is doing.
# Arguments: -DMPIEXEC= -DMPIEXEC_FLAGS= -DEXE= -DNP= -DMODE=late|mismatch
set(flags ${MPIEXEC_FLAGS})
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIEXEC} -np ${NP} ${flags} ${EXE} ${MODE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
message("${out}${err}\n(exit ${rc} after ${elapsed} s)")
math(EXPR last "${NP} - 1")
if(rc EQUAL 0)
  message(FATAL_ERROR "the hung job exited 0")
endif()
if(rc MATCHES "timeout|Process terminated")
  message(FATAL_ERROR "the hung job was not ended by the watchdog (killed by the test's timeout)")
endif()
if(elapsed GREATER 40)
  message(FATAL_ERROR "the watchdog took ${elapsed} s (limit 2 s + 3 s report)")
endif()
if(MODE STREQUAL "late")
  set(want "rank ${last}: NOT ARRIVED, no answer")
else()
  set(want "rank ${last}: NOT ARRIVED, waiting in another call for [0-9.]+ s: all_gather #1 on axis mesh_row")
endif()
if(NOT "${out}${err}" MATCHES "${want}")
  message(FATAL_ERROR "the report does not say '${want}'")
endif()
if(NOT "${out}${err}" MATCHES "all_reduce #1 on axis world \\(8 bytes\\)"
   OR NOT "${out}${err}" MATCHES "lagging ranks: ${last}")
  message(FATAL_ERROR "the report does not name the waiting call and the lagging rank")
endif()
