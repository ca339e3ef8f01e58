# The layer rules of README's "What is here" that the sources can be checked against:
# - nn/ and programmed/ compose public operations only, and optim/ calls tensor_ops and the
#   public leaf access: none includes a private header of core/ (graph nodes, backend
#   adapters, tensor internals);
# - test-only oracles stay out of the shipped sources (src/): the emulated device and the
#   double-precision flash reference live in tests/support/.
# Run as: cmake -DSOURCE_DIR=<repo> -P check_layers.cmake
set(failures "")

# Appends to `failures` every file under src/<area> with an #include matching `pattern`.
function(forbid_includes area pattern what)
    file(GLOB_RECURSE sources "${SOURCE_DIR}/src/${area}*.cpp" "${SOURCE_DIR}/src/${area}*.hpp")
    foreach(source IN LISTS sources)
        file(STRINGS "${source}" lines REGEX "^#include \"?${pattern}")
        if(lines)
            list(APPEND failures "${source} includes ${what}: ${lines}")
        endif()
    endforeach()
    set(failures "${failures}" PARENT_SCOPE)
endfunction()

forbid_includes("nn/" "core/" "a private core header")
forbid_includes("optim/" "core/" "a private core header")
forbid_includes("programmed/" "core/" "a private core header")
forbid_includes("serving/" "core/" "a private core header")
forbid_includes("" ".*(attention_reference|emulated_device)" "a test-only oracle")
if(failures)
    list(JOIN failures "\n" text)
    message(FATAL_ERROR "layer rules broken:\n${text}")
endif()
message(STATUS "layer rules hold (nn, optim, programmed, serving: no private core header; "
               "no test-only oracle in src/)")
