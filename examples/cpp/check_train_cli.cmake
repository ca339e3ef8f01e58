# riftco-train's command line: --help lists every flag with its default and exits 0 without
# training; an unknown flag or a flag without its value exits non-zero naming it.
# Usage: cmake -DPROGRAM=<riftco-train> -P check_train_cli.cmake

function(run_program output_variable result_variable)
    execute_process(COMMAND ${PROGRAM} ${ARGN}
        OUTPUT_VARIABLE output ERROR_VARIABLE error RESULT_VARIABLE result TIMEOUT 60)
    set(${output_variable} "${output}${error}" PARENT_SCOPE)
    set(${result_variable} "${result}" PARENT_SCOPE)
endfunction()

# Every flag with its documented default (the defaults the README and examples rely on).
set(expected_flags
    "--steps N   (default: 300)"
    "--batch B   (default: 16)"
    "--context T   (default: 64)"
    "--width D   (default: 128)"
    "--heads H   (default: 4)"
    "--blocks N   (default: 2)"
    "--feed-forward F   (default: 512)"
    "--tokenizer bpe|byte   (default: bpe)"
    "--vocabulary V   (default: 512)"
    "--learning-rate LR   (default: 0.003)"
    "--warmup S   (default: 30)"
    "--attention materialized|flash   (default: flash)"
    "--backend cpu|metal|cuda|tpu|pjrt   (default: cpu)"
    "--activation-checkpointing disabled|block   (default: disabled)"
    "--seed S   (default: 1234)"
    "--sample-length L   (default: 200)"
    "--temperature T   (default: 0.8)"
    "--corpus-dir DIR   (default: "
    "--require-improvement NATS   (default: 0)"
    "--data-parallel   (default: off)"
    "--reduction overlapped|blocking   (default: overlapped)"
    "--zero-1   (default: off)"
    "--collective-timeout SECONDS   (default: 120)"
    "-h, --help")

foreach(help_flag --help -h)
    run_program(output result ${help_flag})
    if(NOT result EQUAL 0)
        message(FATAL_ERROR "riftco-train ${help_flag} exited with ${result}:\n${output}")
    endif()
    foreach(expected IN LISTS expected_flags)
        string(FIND "${output}" "${expected}" position)
        if(position EQUAL -1)
            message(FATAL_ERROR "riftco-train ${help_flag} does not show '${expected}':\n${output}")
        endif()
    endforeach()
    # --help must not start training (which prints "corpus: ..." first).
    string(FIND "${output}" "corpus:" position)
    if(NOT position EQUAL -1)
        message(FATAL_ERROR "riftco-train ${help_flag} started a run:\n${output}")
    endif()
endforeach()

# Rejected command lines ("arguments|text the error must contain").
set(rejections
    "--bogus|unknown flag '--bogus' (see --help)"
    "--bogus 3|unknown flag '--bogus' (see --help)"
    "stray|unknown flag 'stray' (see --help)"
    "--steps|--steps needs a value (N)"
    "--steps many|--steps needs a positive integer (got 'many')"
    "--attention dense|--attention must be materialized or flash (got 'dense')"
    "--collective-timeout 0|--collective-timeout needs a positive number (got '0')"
    "--reduction eager|--reduction must be overlapped or blocking (got 'eager')"
    "--zero-1 --steps 1|--zero-1 needs --data-parallel"
    "--backend gpu|--backend must be cpu, metal, cuda, tpu or pjrt (got 'gpu')"
    "--backend metal --steps 1|execution backend 'metal' is unavailable")
if(NOT DISTRIBUTED)  # a build without MPI says so instead of training alone
    list(APPEND rejections "--data-parallel --steps 1|distributed support is not compiled in")
endif()
foreach(rejection IN LISTS rejections)
    string(FIND "${rejection}" "|" bar)
    string(SUBSTRING "${rejection}" 0 ${bar} command_line)
    math(EXPR text_start "${bar} + 1")
    string(SUBSTRING "${rejection}" ${text_start} -1 expected)
    separate_arguments(arguments UNIX_COMMAND "${command_line}")
    run_program(output result ${arguments})
    if(NOT result MATCHES "^[1-9][0-9]*$")
        message(FATAL_ERROR "riftco-train ${command_line} exited with '${result}', expected a "
            "non-zero exit status:\n${output}")
    endif()
    string(FIND "${output}" "${expected}" position)
    if(position EQUAL -1)
        message(FATAL_ERROR "riftco-train ${command_line} does not say '${expected}':\n${output}")
    endif()
endforeach()
list(LENGTH rejections rejection_count)
message(STATUS "riftco-train --help lists every flag; ${rejection_count} bad command lines rejected")
