# gpt_generate end to end on 4 ranks: a tiny model trained by gpt_train
# (checkpoint and Hugging Face export), then the same prompts under
# 2d:q=2, 1d:p=4 and 3d:1x2x2, from the checkpoint and from the export, with
# the key/value cache and recomputing (--no-cache), 4 runs per sampling mode
# that cover each: every run must print the same JSON (greedy and sampled).
# A prompt plus --max-new-tokens past the model's positions (refused naming
# the largest that fits; the default fits), a missing checkpoint and a FIFO
# as --prompt-file or as a shard fail cleanly, naming the problem.
# Arguments: -DMPIEXEC= -DMPIEXEC_FLAGS= -DTRAIN= -DGENERATE= -DWORK_DIR=
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(flags ${MPIEXEC_FLAGS})  # a CMake list
execute_process(COMMAND ${MPIEXEC} -np 4 ${flags} ${TRAIN} --layers 2 --hidden 32 --heads 4
                        --seq 24 --batch 8 --steps 6 --eval-every 0 --checkpoint-every 6
                        --out ${WORK_DIR}/model --overwrite
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gpt_train failed (${rc}): ${out}${err}")
endif()

function(generate expect_fail)
  execute_process(COMMAND ${MPIEXEC} -np 4 ${flags} ${GENERATE} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(expect_fail AND rc EQUAL 0)
    message(FATAL_ERROR "gpt_generate ${ARGN} succeeded, expected a failure:\n${out}")
  elseif(NOT expect_fail AND NOT rc EQUAL 0)
    message(FATAL_ERROR "gpt_generate ${ARGN} failed (${rc}): ${out}${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
  set(last_error "${err}" PARENT_SCOPE)
endfunction()

set(prompts --prompt "The cat" --prompt "A" --prompt "Once upon a time" --max-new-tokens 7 --json)
set(ckpt "--checkpoint;${WORK_DIR}/model/checkpoints")
set(hf "--hf;${WORK_DIR}/model/export")
# every source, scheme and cache mode, and each source both cached and
# recomputed, in 4 runs per sampling mode (not all 12 combinations: the
# schemes' generation is compared with the serial reference in generate_np9)
set(runs "ckpt 2d:q=2 cache" "ckpt 1d:p=4 recompute" "hf 3d:1x2x2 cache" "hf 2d:q=2 recompute")
foreach(mode "--greedy" "--temperature;0.9;--top-k;20;--seed;5" "--top-p;0.8;--seed;9")
  set(first "")
  foreach(run IN LISTS runs)
    separate_arguments(run)
    list(GET run 0 source)
    list(GET run 1 scheme)
    list(GET run 2 cache)
    if(cache STREQUAL "recompute")
      set(cache "--no-cache")
    else()
      set(cache "")
    endif()
    generate(FALSE ${${source}} --scheme ${scheme} ${prompts} ${mode} ${cache})
    string(REGEX MATCHALL "{[^\n]*}" objects "${last_output}")
    list(LENGTH objects n)
    if(NOT n EQUAL 3)
      message(FATAL_ERROR "expected 3 JSON lines, got ${n}:\n${last_output}")
    endif()
    if(first STREQUAL "")
      set(first "${objects}")
      message("${mode}: ${objects}")
    elseif(NOT objects STREQUAL first)
      message(FATAL_ERROR "${source} ${scheme} ${mode} ${cache} differs:\n${objects}\nvs\n${first}")
    endif()
  endforeach()
endforeach()
if(NOT first MATCHES "\"tokens\":\\[[0-9]+(,[0-9]+)*\\]")
  message(FATAL_ERROR "no tokens in ${first}")
endif()
# 24 positions: a 20-byte prompt and 7 new tokens do not fit: refused before
# the model is built, naming the prompt and the largest --max-new-tokens (4)
generate(TRUE --checkpoint ${WORK_DIR}/model/checkpoints --prompt "A" --prompt "twenty bytes, really"
         --max-new-tokens 7)
if(NOT last_error MATCHES "--max-new-tokens 7: prompt 1 has 20 tokens.*n_positions=24, so at most 4 new tokens fit")
  message(FATAL_ERROR "the long prompt's error does not name it: ${last_error}")
endif()
string(REGEX MATCHALL "error:" errors "${last_error}")
list(LENGTH errors n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "the error is not printed once: ${last_error}")
endif()
# without --max-new-tokens the same prompts generate as many as fit (4), and
# --max-new-tokens 4 gives the same ids
generate(FALSE --checkpoint ${WORK_DIR}/model/checkpoints --prompt "twenty bytes, really"
         --greedy --json)
if(NOT last_output MATCHES "\"tokens\":\[[0-9]+,[0-9]+,[0-9]+,[0-9]+\]")
  message(FATAL_ERROR "the default --max-new-tokens does not fill the 4 positions left: ${last_output}")
endif()
set(fitted "${last_output}")
generate(FALSE --checkpoint ${WORK_DIR}/model/checkpoints --prompt "twenty bytes, really"
         --greedy --json --max-new-tokens 4)
if(NOT last_output STREQUAL fitted)
  message(FATAL_ERROR "--max-new-tokens 4 differs from the default:\n${last_output}\nvs\n${fitted}")
endif()
# a prompt of all 24 positions leaves no room for one new token
generate(TRUE --checkpoint ${WORK_DIR}/model/checkpoints --prompt "twenty-four bytes, right")
if(NOT last_error MATCHES "prompt 0 has 24 tokens.*at most 23 tokens")
  message(FATAL_ERROR "the prompt without room is not named: ${last_error}")
endif()
generate(TRUE --checkpoint ${WORK_DIR}/missing --prompt "a")
if(NOT last_error MATCHES "missing")
  message(FATAL_ERROR "the missing checkpoint is not named: ${last_error}")
endif()
# A FIFO as --prompt-file, or in place of a checkpoint shard: refused on
# every rank, named, before a read can block (was: no output until killed).
execute_process(COMMAND mkfifo ${WORK_DIR}/prompts.fifo RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mkfifo failed")
endif()
generate(TRUE --checkpoint ${WORK_DIR}/model/checkpoints --prompt-file ${WORK_DIR}/prompts.fifo)
if(NOT last_error MATCHES "--prompt-file: '[^']*prompts.fifo' is a FIFO \\(named pipe\\)")
  message(FATAL_ERROR "the FIFO prompt file is not named: ${last_error}")
endif()
# A huge prompt file (a corpus or an image by mistake): refused by its size
# before it is read into memory, named.
execute_process(COMMAND truncate -s 200M ${WORK_DIR}/prompts_huge.txt RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "truncate failed")
endif()
generate(TRUE --checkpoint ${WORK_DIR}/model/checkpoints --prompt-file ${WORK_DIR}/prompts_huge.txt)
if(NOT last_error MATCHES "--prompt-file [^ ]*prompts_huge.txt: 209715200 bytes, more than 64 MiB")
  message(FATAL_ERROR "the huge prompt file is not refused by its size: ${last_error}")
endif()
file(REMOVE ${WORK_DIR}/prompts_huge.txt)
file(GLOB shards ${WORK_DIR}/model/checkpoints/step_*/shard_*.bin)
list(GET shards 0 shard)
file(REMOVE ${shard})
execute_process(COMMAND mkfifo ${shard})
generate(TRUE --checkpoint ${WORK_DIR}/model/checkpoints --prompt "a")
if(NOT last_error MATCHES "is a FIFO \\(named pipe\\), not a regular file")
  message(FATAL_ERROR "the FIFO shard is not named: ${last_error}")
endif()
