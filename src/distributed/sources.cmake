list(APPEND RIFTCO_TRANSFORMER_SOURCES src/distributed/process_group.cpp
    src/distributed/zero_redundancy_adam.cpp)
set_source_files_properties(src/distributed/process_group.cpp PROPERTIES COMPILE_DEFINITIONS
    "RIFTCO_TRANSFORMER_HAVE_MPI=$<BOOL:${RIFTCO_TRANSFORMER_ENABLE_MPI}>")
if(RIFTCO_TRANSFORMER_ENABLE_MPI)
    # Only this file sees MPI's headers: as system headers (their own warnings are not ours),
    # and without the deprecated C++ bindings.
    list(APPEND RIFTCO_TRANSFORMER_SOURCES src/distributed/mpi_process_group.cpp)
    set(_mpi_options ${MPI_C_COMPILE_OPTIONS})
    foreach(directory IN LISTS MPI_C_INCLUDE_DIRS)
        list(APPEND _mpi_options -isystem ${directory})
    endforeach()
    set_source_files_properties(src/distributed/mpi_process_group.cpp PROPERTIES
        COMPILE_OPTIONS "${_mpi_options}"
        COMPILE_DEFINITIONS "OMPI_SKIP_MPICXX=1;MPICH_SKIP_MPICXX=1")
endif()
