# Installs the already-built tree into a scratch prefix, then configures, builds and runs a
# separate project that finds it with find_package(riftco_transformer).
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run_step description)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
    if(NOT result EQUAL 0)
        message(FATAL_ERROR "${description} failed (${result}):\n${output}")
    endif()
    message(STATUS "${description}: ok")
    set(last_output "${output}" PARENT_SCOPE)
endfunction()

set(config_args)
if(BUILD_TYPE)
    set(config_args --config ${BUILD_TYPE})
endif()
run_step("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}" ${config_args})
run_step("configure downstream" ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/package/downstream"
    -B "${WORK_DIR}/build" -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_C_COMPILER=${C_COMPILER}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
run_step("build downstream" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run_step("run downstream" "${WORK_DIR}/build/downstream")
if(NOT last_output MATCHES "58 64 139 154")
    message(FATAL_ERROR "downstream program printed an unexpected result:\n${last_output}")
endif()
run_step("run downstream C ABI client" "${WORK_DIR}/build/downstream_c")
if(NOT last_output MATCHES "58 64 139 154")
    message(FATAL_ERROR "downstream C program printed an unexpected result:\n${last_output}")
endif()
