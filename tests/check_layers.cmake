# The layer rules of README's "What is here" that the sources can be checked against:
# - nn/ composes public operations only: it includes no private header of core/ (autograd
#   nodes, backend adapters, tensor internals);
# - optim/ calls tensor_ops and the public leaf access, never a backend or a graph node: it
#   includes no private header of core/ either;
# - test-only oracles stay out of the shipped sources (src/): the emulated device and the
#   double-precision flash reference live in tests/support/.
# Run as: cmake -DSOURCE_DIR=<repo> -P check_layers.cmake
set(failures "")
file(GLOB_RECURSE nn_sources "${SOURCE_DIR}/src/nn/*.cpp" "${SOURCE_DIR}/src/nn/*.hpp")
foreach(source IN LISTS nn_sources)
    file(STRINGS "${source}" lines REGEX "^#include \"core/")
    if(lines)
        list(APPEND failures "${source} includes a private core header: ${lines}")
    endif()
endforeach()
file(GLOB_RECURSE optim_sources "${SOURCE_DIR}/src/optim/*.cpp" "${SOURCE_DIR}/src/optim/*.hpp")
foreach(source IN LISTS optim_sources)
    file(STRINGS "${source}" lines REGEX "^#include \"core/")
    if(lines)
        list(APPEND failures "${source} includes a private core header: ${lines}")
    endif()
endforeach()
file(GLOB_RECURSE shipped "${SOURCE_DIR}/src/*.cpp" "${SOURCE_DIR}/src/*.hpp")
foreach(source IN LISTS shipped)
    file(STRINGS "${source}" lines REGEX "^#include .*(attention_reference|emulated_device)")
    if(lines)
        list(APPEND failures "${source} refers to a test-only oracle: ${lines}")
    endif()
endforeach()
if(failures)
    list(JOIN failures "\n" text)
    message(FATAL_ERROR "layer rules broken:\n${text}")
endif()
message(STATUS "layer rules hold (nn, optim: no private core header; "
               "no test-only oracle in src/)")
