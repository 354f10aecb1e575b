# Compiler set-up shared by every target: warnings, sanitizers, ccache.

find_program(DSTRAIN_CCACHE ccache)
if(DSTRAIN_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_C_COMPILER_LAUNCHER ${DSTRAIN_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${DSTRAIN_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${DSTRAIN_CCACHE})
endif()

# Applied to our own targets only (dst_target_defaults), never to third-party code.
add_library(dstrain_compile_options INTERFACE)
target_compile_options(dstrain_compile_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor>)
# No fused multiply-adds unless the source asks: a contracted a*b+c rounds once instead of
# twice, so results would change with the instruction set (DSTRAIN_HOST_ARCH) and the
# portable and native builds would no longer agree bit for bit.
target_compile_options(dstrain_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>)
# The host kernels (Kokkos Serial loops: norms, softmax, SwiGLU, AdamW, ...) vectorise to
# the width the instruction set allows: AVX-512 with native on this project's machines,
# SSE2 with the x86-64 default. A native binary runs only on CPUs like the build's.
if(DSTRAIN_HOST_ARCH)
  target_compile_options(dstrain_compile_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-march=${DSTRAIN_HOST_ARCH}>)
  message(STATUS "dstrain: host code built with -march=${DSTRAIN_HOST_ARCH}")
endif()
if(DSTRAIN_WARNINGS_AS_ERRORS)
  target_compile_options(dstrain_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()

if(DSTRAIN_ENABLE_SANITIZERS)
  set(_dst_san -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_dst_san}>")
  add_link_options(${_dst_san})
endif()

function(dst_target_defaults target)
  target_link_libraries(${target} PRIVATE dstrain_compile_options)
endfunction()
