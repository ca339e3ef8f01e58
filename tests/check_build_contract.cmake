# Every tests/python module whose expectations depend on the build's configuration (it asks
# for backend availability, the build's facts, MPI's presence or names a build option) must
# be in LISTED (RIFTCO_TRANSFORMER_BUILD_CONTRACT_PYTHON_TESTS in tests/CMakeLists.txt), so
# the cuda, tpu-release and mpi workflows run it against their own library.
#   cmake -DSOURCE_DIR=<repository> "-DLISTED=a.py;b.py" -P tests/check_build_contract.cmake
cmake_minimum_required(VERSION 3.25)
file(GLOB modules RELATIVE ${SOURCE_DIR}/tests/python ${SOURCE_DIR}/tests/python/test_*.py)
set(markers "backend_available(" "build_facts(" "compiled_in(" "RIFTCO_TRANSFORMER_ENABLE_")
set(missing "")
foreach(module IN LISTS modules)
    file(READ ${SOURCE_DIR}/tests/python/${module} text)
    foreach(marker IN LISTS markers)
        string(FIND "${text}" "${marker}" at)
        if(NOT at EQUAL -1 AND NOT module IN_LIST LISTED)
            list(APPEND missing "${module} (it uses ${marker})")
            break()
        endif()
    endforeach()
endforeach()
foreach(module IN LISTS LISTED)
    if(NOT EXISTS ${SOURCE_DIR}/tests/python/${module})
        list(APPEND missing "${module} is listed but does not exist")
    endif()
endforeach()
if(missing)
    list(JOIN missing "\n  " text)
    message(FATAL_ERROR "build-dependent test modules missing from "
        "RIFTCO_TRANSFORMER_BUILD_CONTRACT_PYTHON_TESTS:\n  ${text}")
endif()
list(LENGTH LISTED count)
message(STATUS "${count} build-dependent test modules, all listed")
