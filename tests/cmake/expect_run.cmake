# Runs COMMAND (a ;-list), then checks: exit code (EXPECT_RC: a number or "nonzero"),
# wall time (< MAX_SECONDS, enforced with a hard timeout), and that the combined output
# matches every MATCH regex and no NOT_MATCH regex. Prints the output on failure.
# SCRATCH: directories the command writes (runs, checkpoints); removed when the test
# passes, kept for inspection when it fails or DSTRAIN_KEEP_TEST_OUTPUT=1. Several tests'
# runs hold gigabytes (the whole suite left about 25 GB before they were removed).
string(TIMESTAMP _t0 "%s")
execute_process(COMMAND ${COMMAND}
  WORKING_DIRECTORY ${WORKDIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
  TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP _t1 "%s")
math(EXPR elapsed "${_t1} - ${_t0}")
set(all "${out}${err}")
# Exit 77 is a skip (tests/tools/require without the oracle environment off CI, a missing
# privilege): said in the output, which the test's SKIP_REGULAR_EXPRESSION turns into
# ctest's "Skipped" (cmake -P itself can only exit 0 or 1).
if(rc STREQUAL "77" AND NOT EXPECT_RC STREQUAL "77")
  message("${all}dstrain-test-skipped (exit 77)")
  return()
endif()
set(problems "")
if(rc MATCHES "timeout" OR rc MATCHES "Process terminated")
  string(APPEND problems "command did not end within ${MAX_SECONDS} s (${rc})\n")
elseif(EXPECT_RC STREQUAL "nonzero")
  if(rc EQUAL 0)
    string(APPEND problems "expected a non-zero exit code, got 0\n")
  endif()
elseif(NOT rc EQUAL EXPECT_RC)
  string(APPEND problems "expected exit code ${EXPECT_RC}, got '${rc}'\n")
endif()
foreach(re IN LISTS MATCH)
  if(NOT all MATCHES "${re}")
    string(APPEND problems "output does not match '${re}'\n")
  endif()
endforeach()
foreach(re IN LISTS NOT_MATCH)
  if(all MATCHES "${re}")
    string(APPEND problems "output unexpectedly matches '${re}'\n")
  endif()
endforeach()
message("command: ${COMMAND}\nexit code: ${rc}, ${elapsed} s\n--- output ---\n${all}--- end ---")
if(problems)
  foreach(dir IN LISTS SCRATCH)
    if(EXISTS "${dir}")
      message("kept for inspection: ${dir}")
    endif()
  endforeach()
  message(FATAL_ERROR "${problems}")
endif()
if(NOT "$ENV{DSTRAIN_KEEP_TEST_OUTPUT}" STREQUAL "1")
  foreach(dir IN LISTS SCRATCH)
    file(REMOVE_RECURSE "${dir}")
  endforeach()
endif()
