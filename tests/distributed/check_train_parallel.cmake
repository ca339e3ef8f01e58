# riftco-train --data-parallel under `mpirun -n 2` prints the same losses (4 decimals), held-out
# loss and sample as one process on the same batches, and reports identical replicas: with the
# overlapped reduction (the default), the blocking one, and ZeRO-1.
# -DPROGRAM=riftco-train -DMPIEXEC=mpirun
set(arguments --tokenizer byte --steps 60 --batch 8 --context 32 --width 64 --heads 4
    --blocks 2 --feed-forward 128 --learning-rate 3e-3 --warmup 10 --sample-length 30)
set(ENV{OMP_NUM_THREADS} 1)
execute_process(COMMAND ${PROGRAM} ${arguments}
    OUTPUT_VARIABLE single RESULT_VARIABLE single_status TIMEOUT 300)
# The comparable lines: step losses (without timing), held-out loss, the sample.
function(comparable text out)
    string(REGEX MATCHALL "step +[0-9]+  loss [0-9.]+|held-out loss [^\n]*|Alice [^\n]*"
        lines "${text}")
    set(${out} "${lines}" PARENT_SCOPE)
endfunction()
if(NOT single_status EQUAL 0)
    message(FATAL_ERROR "riftco-train exited ${single_status} (one process):\n${single}")
endif()
comparable("${single}" expected)
list(LENGTH expected count)
if(count LESS 5)
    message(FATAL_ERROR "one process printed too little:\n${single}")
endif()
foreach(variant "--reduction;overlapped" "--reduction;blocking" "--zero-1")
    execute_process(COMMAND ${MPIEXEC} -n 2 --oversubscribe ${PROGRAM} ${arguments}
            --data-parallel ${variant}
        OUTPUT_VARIABLE parallel ERROR_VARIABLE parallel_errors RESULT_VARIABLE parallel_status
        TIMEOUT 300)
    if(NOT parallel_status EQUAL 0)
        message(FATAL_ERROR "riftco-train ${variant} exited ${parallel_status} (2 ranks):\n"
            "${parallel}\n${parallel_errors}")
    endif()
    if(NOT parallel MATCHES "replicas identical")
        message(FATAL_ERROR "2 ranks (${variant}) did not report identical replicas:\n${parallel}")
    endif()
    comparable("${parallel}" actual)
    if(NOT expected STREQUAL actual)
        message(FATAL_ERROR "2 ranks (${variant}) differ from one process:\none: ${expected}\n"
            "two: ${actual}")
    endif()
    message(STATUS "2 ranks (${variant}) match one process: ${actual}")
endforeach()
