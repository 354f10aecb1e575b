# `dstrain --version` names the commit the source tree is at (the hash is read at build
# time, cmake/DstrainGitHash.cmake, not when the build directory was configured).
# Inputs: DSTRAIN (the binary), SOURCE_DIR, GIT_EXECUTABLE.
set(_want "unknown")
if(GIT_EXECUTABLE AND EXISTS "${SOURCE_DIR}/.git")
  execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --short=12 HEAD
                  WORKING_DIRECTORY "${SOURCE_DIR}" OUTPUT_VARIABLE _want
                  OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "git rev-parse HEAD failed in ${SOURCE_DIR}")
  endif()
endif()
execute_process(COMMAND "${DSTRAIN}" --version OUTPUT_VARIABLE _out RESULT_VARIABLE _rc
                TIMEOUT 20)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "dstrain --version exited with ${_rc}:\n${_out}")
endif()
if(NOT _out MATCHES "\\(git ([0-9a-f]+|unknown)(-dirty)?\\)")
  message(FATAL_ERROR "dstrain --version names no git hash:\n${_out}")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL _want)
  message(FATAL_ERROR "dstrain --version says git ${CMAKE_MATCH_1}, the source tree is at "
                      "${_want} (a stale binary, or the hash was taken at configure time)")
endif()
message(STATUS "dstrain --version: git ${CMAKE_MATCH_1}${CMAKE_MATCH_2}, source at ${_want}")
