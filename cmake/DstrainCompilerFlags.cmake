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
