# --seq and --heads reach the attention of custom_model --block (the
# example's own PASS_REGULAR_EXPRESSION checks only what it echoes):
# - --seq: the same data and seed at --seq 4 and --seq 8 give different
#   step-0 losses (sequences of 8 rows attend over other rows than
#   sequences of 4; a dropped --seq would make them equal);
# - --heads: 3 heads divide the width 48 (the program's own check passes)
#   but not the 2D mesh side, and only the attention itself refuses that,
#   naming heads=3 (at the first steps the scores are near zero, so the
#   head count barely moves the loss: a loss comparison would not see it).
# Arguments: -DMPIEXEC= -DMPIEXEC_FLAGS= -DEXE=
set(flags ${MPIEXEC_FLAGS})  # a CMake list
function(run_block out_var rc_var)
  execute_process(COMMAND ${MPIEXEC} -np 4 ${flags} ${EXE} --scheme 2d:q=2 --block --steps 2
                          ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${ARGN}: ${out}${err}")
  set(${out_var} "${out}${err}" PARENT_SCOPE)
  set(${rc_var} ${rc} PARENT_SCOPE)
endfunction()
function(step0_loss out_var)
  run_block(out rc ${ARGN})
  # 1: the loss did not fall in 2 steps, which this test does not ask
  if(NOT rc EQUAL 0 AND NOT rc EQUAL 1)
    message(FATAL_ERROR "custom_model ${ARGN} failed (${rc})")
  endif()
  if(NOT out MATCHES "step +0  loss ([0-9.]+)")
    message(FATAL_ERROR "custom_model ${ARGN}: no step-0 loss")
  endif()
  set(${out_var} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()
step0_loss(seq4 --seq 4 --heads 12)
step0_loss(seq8 --seq 8 --heads 12)
message("step-0 losses: --seq 4 ${seq4}, --seq 8 ${seq8}")
if(seq4 STREQUAL seq8)
  message(FATAL_ERROR "--seq 8 gave the loss of --seq 4: --seq did not reach the attention")
endif()
run_block(out rc --seq 4 --heads 3)
if(rc EQUAL 0 OR NOT out MATCHES "Attention \\(2D\\) 'h.0.attn': heads=3 must be divisible by q=2")
  message(FATAL_ERROR "--heads 3 did not reach the attention (no refusal naming heads=3)")
endif()
# --seed beyond 2^64 - 1 is refused (was: 20 digits accepted and clamped)
run_block(out rc --seed 99999999999999999999)
if(rc EQUAL 0 OR NOT out MATCHES "'99999999999999999999' is not an integer in \\[0, 18446744073709551615\\]")
  message(FATAL_ERROR "--seed 99999999999999999999 was not refused")
endif()
# A sharded data axis is refused by name: the example keeps its optimizer
# whole (zero=1 shards summa::Trainer's), rather than ignoring ':zero=1'.
execute_process(COMMAND ${MPIEXEC} -np 4 ${flags} ${EXE} --scheme data=2:zero=1,1d:p=2 --steps 2
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("--scheme data=2:zero=1,1d:p=2: ${out}${err}")
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "keeps its optimizer whole")
  message(FATAL_ERROR "custom_model --scheme data=2:zero=1,1d:p=2 was not refused")
endif()
