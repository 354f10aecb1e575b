# Version information compiled into the library: project version and git hash.
find_package(Git QUIET)
set(DSTRAIN_GIT_HASH "unknown")
if(GIT_FOUND AND EXISTS "${CMAKE_SOURCE_DIR}/.git")
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
                  WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                  OUTPUT_VARIABLE _hash OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc EQUAL 0 AND _hash)
    set(DSTRAIN_GIT_HASH "${_hash}")
    execute_process(COMMAND ${GIT_EXECUTABLE} status --porcelain --untracked-files=no
                    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                    OUTPUT_VARIABLE _dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_dirty)
      string(APPEND DSTRAIN_GIT_HASH "-dirty")
    endif()
  endif()
endif()
set(DSTRAIN_YAML_CPP_VERSION "${yaml-cpp_VERSION}")
