# The repository documents itself (docs/ARCHITECTURE.md, 'Layers'). This check keeps it so:
# - no tracked file points at the design notes that used to live outside the repository: a
#   path into a sibling "shared" directory, the names of those notes, or a numbered section
#   of them (a section sign and a number, alone or after "spec", "ENGINE" or "WORKFLOWS");
# - every citation of the form ARCHITECTURE.md followed by a comma and a quoted section name
#   names a heading of docs/ARCHITECTURE.md, and no citation is split across two lines (the
#   check reads one line at a time).
# The patterns below are spelled so that this file does not match them itself.
# Run as: cmake -DSOURCE_DIR=<repo> -P check_docs.cmake
cmake_minimum_required(VERSION 3.25)

set(outside_pattern
    "\\.\\./shared|(DESIGN|STYLE)\\.md|BACKENDS_AND_PYTHO[N]|(spec|ENGINE|WORKFLOWS) §|§ ?[0-9]")
set(citation_pattern "ARCHITECTURE\\.md[`)]*, ")
set(split_pattern "ARCHITECTURE\\.md[`)]*, *$|ARCHITECTURE\\.md[`)]*, '[^']*$")
set(document "${SOURCE_DIR}/docs/ARCHITECTURE.md")
set(failures "")

if(NOT EXISTS "${document}")
    message(FATAL_ERROR "docs/ARCHITECTURE.md is missing")
endif()

# The tracked files (git ls-files); outside a git checkout, every file but build outputs.
set(files "")
find_program(GIT_COMMAND git)
if(GIT_COMMAND AND EXISTS "${SOURCE_DIR}/.git")
    execute_process(COMMAND "${GIT_COMMAND}" -c core.quotepath=off ls-files
        WORKING_DIRECTORY "${SOURCE_DIR}"
        OUTPUT_VARIABLE listing RESULT_VARIABLE git_result ERROR_QUIET)
    if(git_result EQUAL 0)
        string(REGEX REPLACE "\n$" "" listing "${listing}")
        string(REPLACE "\n" ";" files "${listing}")
    endif()
endif()
if(NOT files)
    file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/*")
    list(FILTER files EXCLUDE REGEX
        "^(build[^/]*|cmake-build[^/]*|\\.git|\\.cache|\\.venv|venv)/|/__pycache__/")
endif()

# The headings of docs/ARCHITECTURE.md, without their leading #s.
file(STRINGS "${document}" heading_lines REGEX "^#+ " ENCODING UTF-8)
set(headings "")
foreach(line IN LISTS heading_lines)
    string(REGEX REPLACE "^#+ +" "" heading "${line}")
    string(STRIP "${heading}" heading)
    list(APPEND headings "${heading}")
endforeach()

set(citation_count 0)
foreach(relative IN LISTS files)
    set(path "${SOURCE_DIR}/${relative}")
    if(IS_DIRECTORY "${path}" OR NOT EXISTS "${path}")
        continue()
    endif()
    file(STRINGS "${path}" lines REGEX "${outside_pattern}|ARCHITECTURE\\.md" ENCODING UTF-8)
    foreach(line IN LISTS lines)
        if(line MATCHES "${outside_pattern}")
            list(APPEND failures "${relative}: refers outside the repository: ${line}")
        endif()
        if(line MATCHES "${split_pattern}")
            list(APPEND failures "${relative}: a citation split across lines: ${line}")
        endif()
        string(REGEX MATCHALL "${citation_pattern}'[^']+'" citations "${line}")
        foreach(citation IN LISTS citations)
            string(REGEX REPLACE "^.*, '([^']+)'$" "\\1" section "${citation}")
            math(EXPR citation_count "${citation_count} + 1")
            if(NOT section IN_LIST headings)
                list(APPEND failures
                     "${relative}: cites a section docs/ARCHITECTURE.md does not have: '${section}'")
            endif()
        endforeach()
    endforeach()
endforeach()

if(failures)
    list(JOIN failures "\n" text)
    message(FATAL_ERROR "documentation references broken:\n${text}")
endif()
list(LENGTH files file_count)
message(STATUS "documentation references hold (${file_count} files, ${citation_count} "
               "citations of docs/ARCHITECTURE.md, all to existing sections)")
