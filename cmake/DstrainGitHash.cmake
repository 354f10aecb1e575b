# Run at build time (cmake -P), not at configure time, so the hash compiled into dstrain is
# the commit the binary was built from, not the one its build directory was configured at.
# Inputs: SOURCE_DIR, OUTPUT, GIT_EXECUTABLE. Writes OUTPUT (one #define) only when the text
# changes, so an unchanged tree recompiles nothing.
set(_hash "unknown")
if(GIT_EXECUTABLE AND EXISTS "${SOURCE_DIR}/.git")
  execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --short=12 HEAD
                  WORKING_DIRECTORY "${SOURCE_DIR}"
                  OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc EQUAL 0 AND _out)
    set(_hash "${_out}")
    execute_process(COMMAND "${GIT_EXECUTABLE}" status --porcelain --untracked-files=no
                    WORKING_DIRECTORY "${SOURCE_DIR}"
                    OUTPUT_VARIABLE _dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_dirty)
      string(APPEND _hash "-dirty")
    endif()
  endif()
endif()
set(_text "#define DSTRAIN_GIT_HASH \"${_hash}\"\n")
set(_old "")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" _old)
endif()
if(NOT _old STREQUAL _text)
  file(WRITE "${OUTPUT}" "${_text}")
endif()
