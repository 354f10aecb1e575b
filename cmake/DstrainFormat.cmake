# `format` rewrites our tracked C++ sources with the committed .clang-format;
# `format-check` fails if any file would change (also run by CTest as format_check).
find_program(DSTRAIN_CLANG_FORMAT NAMES clang-format clang-format-14 clang-format-15 clang-format-16)
if(DSTRAIN_CLANG_FORMAT)
  add_custom_target(format
    COMMAND ${CMAKE_SOURCE_DIR}/scripts/format --fix
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} COMMENT "clang-format (rewrite)")
  add_custom_target(format-check
    COMMAND ${CMAKE_SOURCE_DIR}/scripts/format --check
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} COMMENT "clang-format (check)")
endif()
