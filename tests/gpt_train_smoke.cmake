# The gpt_train example end to end on 4 ranks, small and short: train under
# 2D 2x2 with a checkpoint, resume under 1D p=4, check the outputs (export,
# config.json, log lines, checkpoint), and check a bad scheme, a missing data
# file and the backend flags (--backend cuda without a device or CUDA build,
# --comm nccl on the cpu backend) fail cleanly, and that --check-calls
# reaches the model's grid.
# Arguments: -DMPIEXEC= -DMPIEXEC_FLAGS= -DEXE= -DWORK_DIR=
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(flags ${MPIEXEC_FLAGS})  # a CMake list
set(small --layers 1 --hidden 32 --heads 4 --seq 16 --batch 8 --eval-every 3
          --eval-batches 1 --checkpoint-every 2 --warmup 2)

function(run_train expect_fail)
  execute_process(COMMAND ${MPIEXEC} -np 4 ${flags} ${EXE} ${small} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(expect_fail AND rc EQUAL 0)
    message(FATAL_ERROR "gpt_train ${ARGN} succeeded, expected a failure")
  elseif(NOT expect_fail AND NOT rc EQUAL 0)
    message(FATAL_ERROR "gpt_train ${ARGN} failed (${rc})")
  endif()
  set(last_output "${out}${err}" PARENT_SCOPE)
endfunction()

run_train(FALSE --steps 4 --out ${WORK_DIR}/out)
if(NOT last_output MATCHES "validation loss")
  message(FATAL_ERROR "no validation line")
endif()
if(last_output MATCHES "check-calls")
  message(FATAL_ERROR "the per-call agreement (debug mode) is on by default")
endif()
if(NOT last_output MATCHES "tokens, recompute full \\|")
  message(FATAL_ERROR "per-block checkpoints (--recompute full) are not the default")
endif()
# --check-calls reaches the grid the model runs on and --recompute the model
# (its header reads both there)
run_train(FALSE --steps 1 --check-calls --recompute selective --out ${WORK_DIR}/checked)
if(NOT last_output MATCHES "\\(comm mpi, check-calls\\)")
  message(FATAL_ERROR "--check-calls did not reach the model's grid")
endif()
if(NOT last_output MATCHES "tokens, recompute selective \\|")
  message(FATAL_ERROR "--recompute selective did not reach the model")
endif()
run_train(TRUE --steps 1 --recompute some --out ${WORK_DIR}/bad)
if(NOT last_output MATCHES "--recompute: some not in")
  message(FATAL_ERROR "a bad --recompute is not named")
endif()
run_train(FALSE --steps 6 --scheme 1d:p=4 --resume --out ${WORK_DIR}/out)
if(NOT last_output MATCHES "resuming from .*step 4, saved under 2d:q=2")
  message(FATAL_ERROR "the second run did not resume from step 4 of the 2D run")
endif()
foreach(f export/model.safetensors export/config.json log.jsonl checkpoints/latest
          checkpoints/step_00000006)
  if(NOT EXISTS ${WORK_DIR}/out/${f})
    message(FATAL_ERROR "missing output ${f}")
  endif()
endforeach()
file(STRINGS ${WORK_DIR}/out/log.jsonl steps REGEX "\"loss\"")
list(LENGTH steps n)
if(NOT n EQUAL 6)
  message(FATAL_ERROR "log.jsonl has ${n} step lines, expected 6 (4 + 2 resumed)")
endif()
file(READ ${WORK_DIR}/out/export/config.json config)
if(NOT config MATCHES "\"n_layer\": *1" OR NOT config MATCHES "\"model_type\": *\"gpt2\"")
  message(FATAL_ERROR "unexpected config.json: ${config}")
endif()
run_train(TRUE --steps 1 --scheme 2d:q=3 --out ${WORK_DIR}/bad)
if(NOT last_output MATCHES "needs 9 ranks")
  message(FATAL_ERROR "the bad scheme's error does not say what is wrong")
endif()
run_train(TRUE --steps 1 --data ${WORK_DIR}/missing.bin --out ${WORK_DIR}/bad)
if(NOT last_output MATCHES "missing.bin")
  message(FATAL_ERROR "the missing data file is not named")
endif()
# Backend flags. --backend cuda without a usable device (or in a summa built
# without CUDA) must fail on every rank with a message naming the problem;
# with GPUs (several ranks may share one under mpi_staged) it trains.
execute_process(COMMAND ${MPIEXEC} -np 4 ${flags} ${EXE} ${small} --steps 2 --backend cuda
                        --comm mpi_staged --out ${WORK_DIR}/cuda
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
message("${out}${err}")
if(rc EQUAL 0)
  if(NOT "${out}" MATCHES "cuda-cublas")
    message(FATAL_ERROR "--backend cuda succeeded but did not train on the CUDA backend")
  endif()
elseif(NOT "${out}${err}" MATCHES "built without CUDA|no CUDA device")
  message(FATAL_ERROR "--backend cuda failed (${rc}) without saying CUDA is missing")
endif()
run_train(TRUE --steps 1 --comm nccl --out ${WORK_DIR}/bad)
if(NOT last_output MATCHES "--comm nccl.*needs --backend cuda")
  message(FATAL_ERROR "--comm nccl on the cpu backend does not say what is wrong")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
