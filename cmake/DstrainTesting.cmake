# One way to register tests.
#
#   dst_add_unit_test(NAME SOURCES ... [LIBS ...])
#       GoogleTest executable with tests/unit/test_main.cpp (FE_INVALID trapped);
#       each TEST becomes a CTest test, labelled "unit".
#   dst_add_mpi_test(NAME SOURCES ... [LIBS ...] [RANKS 1 2 4] [TIMEOUT s])
#       GoogleTest executable with tests/mpi/mpi_test_main.cpp, registered once per rank
#       count as NAME.npN and launched through mpiexec (oversubscribed; root allowed),
#       labelled "mpi".
#   dst_mpiexec_command(OUT N)
#       the launcher prefix for N ranks, for tests that run a program under mpiexec.
include(GoogleTest)

# Open MPI refuses to run as root without these (CI runs as root) and refuses more ranks
# than cores without --oversubscribe (the tests use 4 ranks on 2 cores).
set(DSTRAIN_TEST_ENVIRONMENT
  OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_rmaps_base_oversubscribe=1
  # Containers often lack a usable shared-memory CMA; fall back quietly.
  OMPI_MCA_btl_vader_single_copy_mechanism=none
  # No TCP between ranks on one machine is needed; keep mpirun off the network.
  OMPI_MCA_btl=self,vader
  # Tests run side by side (ctest -j) and several ranks share 2 cores: one BLAS thread
  # per process, or OpenBLAS's own threads oversubscribe the machine.
  OPENBLAS_NUM_THREADS=1
  # CI may set CI=true; pass it through explicitly (tools/require uses it).
  "CI=$ENV{CI}")

function(dst_mpiexec_command out nranks)
  set(_cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${nranks} --oversubscribe ${MPIEXEC_PREFLAGS})
  set(${out} ${_cmd} PARENT_SCOPE)
endfunction()

# The unit and MPI test programs compile at -O1 in optimised builds: their own code is
# assertions and small references around the libraries' code, which keeps the build type's
# -O3. -O1 takes about 0.6 of -O3's compile time, and CI compiles about 100 of them on 2 cores.
# (Floating point does not depend on the level: no fast-math, no contraction.)
function(dst_test_optimisation target)
  if(CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo)$")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O1>)
  endif()
endfunction()

function(dst_add_unit_test name)
  cmake_parse_arguments(A "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${A_SOURCES} ${PROJECT_SOURCE_DIR}/tests/unit/test_main.cpp)
  target_link_libraries(${name} PRIVATE ${A_LIBS} dstrain::blas GTest::gtest)  # test_main: host kernels
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/unit)  # fp_trap.hpp
  dst_target_defaults(${name})
  dst_test_optimisation(${name})
  set_property(GLOBAL APPEND PROPERTY DSTRAIN_UNIT_TEST_TARGETS ${name})
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    TEST_PREFIX "${name}."
    PROPERTIES LABELS unit ENVIRONMENT "${DSTRAIN_TEST_ENVIRONMENT}" TIMEOUT 120)
endfunction()

function(dst_add_mpi_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;LIBS;RANKS" ${ARGN})
  if(NOT A_RANKS)
    set(A_RANKS 1 2 4)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 180)
  endif()
  add_executable(${name} ${A_SOURCES} ${PROJECT_SOURCE_DIR}/tests/mpi/mpi_test_main.cpp)
  target_link_libraries(${name} PRIVATE ${A_LIBS} dstrain::blas GTest::gtest MPI::MPI_CXX)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/mpi)  # mpi_world.hpp
  dst_target_defaults(${name})
  dst_test_optimisation(${name})
  foreach(n IN LISTS A_RANKS)
    dst_mpiexec_command(_launch ${n})
    add_test(NAME ${name}.np${n} COMMAND ${_launch} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${name}.np${n} PROPERTIES
      LABELS mpi PROCESSORS ${n} TIMEOUT ${A_TIMEOUT}
      ENVIRONMENT "${DSTRAIN_TEST_ENVIRONMENT}")
  endforeach()
endfunction()

# A test that runs a command and checks how it ends (tests/cmake/expect_run.cmake):
#   dst_add_run_test(NAME COMMAND ... [EXPECT_RC rc|nonzero] [MAX_SECONDS s]
#                    [MATCH regex ...] [NOT_MATCH regex ...] [LABELS ...]
#                    [SCRATCH dir ...])
# SCRATCH names the directories the command writes: removed when the test passes, kept
# when it fails (or always with DSTRAIN_KEEP_TEST_OUTPUT=1).
function(dst_add_run_test name)
  cmake_parse_arguments(A "" "EXPECT_RC;MAX_SECONDS;TIMEOUT"
    "COMMAND;MATCH;NOT_MATCH;LABELS;SCRATCH" ${ARGN})
  if(NOT DEFINED A_EXPECT_RC)
    set(A_EXPECT_RC 0)
  endif()
  if(NOT A_MAX_SECONDS)
    set(A_MAX_SECONDS 120)
  endif()
  if(NOT A_TIMEOUT)
    math(EXPR A_TIMEOUT "${A_MAX_SECONDS} + 60")
  endif()
  if(NOT A_LABELS)
    set(A_LABELS e2e)
  endif()
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND}
    # Each list stays one argument here and arrives as a list in the script.
    "-DCOMMAND=${A_COMMAND}" "-DEXPECT_RC=${A_EXPECT_RC}" "-DMAX_SECONDS=${A_MAX_SECONDS}"
    "-DMATCH=${A_MATCH}" "-DNOT_MATCH=${A_NOT_MATCH}" "-DWORKDIR=${CMAKE_CURRENT_BINARY_DIR}"
    "-DSCRATCH=${A_SCRATCH}"
    -P ${PROJECT_SOURCE_DIR}/tests/cmake/expect_run.cmake)
  set_tests_properties(${name} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
    ENVIRONMENT "${DSTRAIN_TEST_ENVIRONMENT}" SKIP_REGULAR_EXPRESSION "dstrain-test-skipped")
endfunction()

# A test whose reference runs in the oracle Python environment (scripts/setup-oracles,
# found through DSTRAIN_PYTHON):
#   dst_add_oracle_test(NAME SCRIPT script.py [ARGS ...] [MAX_SECONDS s] [LABELS ...]
#                       [MATCH regex ...] [SCRATCH dir ...])
# Without the environment the test skips on a developer's machine and fails under
# CI=true (tests/tools/require): CI never passes on evidence it did not gather.
function(dst_add_oracle_test name)
  cmake_parse_arguments(A "" "SCRIPT;MAX_SECONDS" "ARGS;MATCH;LABELS;SCRATCH" ${ARGN})
  set(_py ${DSTRAIN_PYTHON})
  if(NOT _py)
    set(_py dstrain-oracle-python-not-configured)
  endif()
  if(NOT A_MAX_SECONDS)
    set(A_MAX_SECONDS 120)
  endif()
  if(NOT A_LABELS)
    set(A_LABELS oracle)
  endif()
  dst_add_run_test(${name}
    COMMAND ${PROJECT_SOURCE_DIR}/tests/tools/require ${_py} -- ${_py} ${A_SCRIPT} ${A_ARGS}
    MAX_SECONDS ${A_MAX_SECONDS} LABELS ${A_LABELS} MATCH ${A_MATCH} SCRATCH ${A_SCRATCH})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
endfunction()
