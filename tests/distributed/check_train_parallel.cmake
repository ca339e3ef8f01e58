# riftco-train --data-parallel under `mpirun -n 2` prints the same losses (4 decimals), held-out
# loss and sample as one process on the same batches, and reports identical replicas.
# -DPROGRAM=riftco-train -DMPIEXEC=mpirun
set(arguments --tokenizer byte --steps 60 --batch 8 --context 32 --width 64 --heads 4
    --blocks 2 --feed-forward 128 --learning-rate 3e-3 --warmup 10 --sample-length 30)
set(ENV{OMP_NUM_THREADS} 1)
execute_process(COMMAND ${PROGRAM} ${arguments}
    OUTPUT_VARIABLE single RESULT_VARIABLE single_status TIMEOUT 300)
execute_process(COMMAND ${MPIEXEC} -n 2 --oversubscribe ${PROGRAM} ${arguments} --data-parallel
    OUTPUT_VARIABLE parallel ERROR_VARIABLE parallel_errors RESULT_VARIABLE parallel_status
    TIMEOUT 300)
if(NOT single_status EQUAL 0 OR NOT parallel_status EQUAL 0)
    message(FATAL_ERROR "riftco-train exited ${single_status} (one process) and "
        "${parallel_status} (2 ranks):\n${parallel}\n${parallel_errors}")
endif()
if(NOT parallel MATCHES "replicas identical")
    message(FATAL_ERROR "2 ranks did not report identical replicas:\n${parallel}")
endif()
# The comparable lines: step losses (without timing), held-out loss, the sample.
function(comparable text out)
    string(REGEX MATCHALL "step +[0-9]+  loss [0-9.]+|held-out loss [^\n]*|Alice [^\n]*"
        lines "${text}")
    set(${out} "${lines}" PARENT_SCOPE)
endfunction()
comparable("${single}" expected)
comparable("${parallel}" actual)
list(LENGTH expected count)
if(count LESS 5 OR NOT expected STREQUAL actual)
    message(FATAL_ERROR "2 ranks differ from one process:\none: ${expected}\ntwo: ${actual}")
endif()
message(STATUS "2 ranks match one process: ${actual}")
