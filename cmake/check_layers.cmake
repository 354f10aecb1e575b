# cmake -DSOURCE_DIR=<lib dir> -P check_layers.cmake
#
# Checks the includes between the layers of lib/ against the layers' link lines, the one
# source of truth for who may include whom. A layer is a folder of SOURCE_DIR with a
# CMakeLists.txt. A file under lib/<layer>/ may include "<other>/..." only when <other> is
# its own layer or a layer that <layer> links directly:
#   - every target_link_libraries call in any CMakeLists.txt under SOURCE_DIR counts,
#     PUBLIC, PRIVATE and INTERFACE alike, and whether or not it sits under an option
#     (if(DSTRAIN_HAVE_CUDA)): a link made only in some builds still allows the include;
#   - a call belongs to <layer> when its target is defined (add_library) under
#     lib/<layer>/, or is named dst_<layer>, dst_<layer>_<anything> or dstrain::<layer>;
#     a linked item names layer <other> by the same rule;
#   - direct links only, not what a PUBLIC dependency passes on: a layer that includes
#     another layer's header names that layer on its own link line, so the link lines
#     read as the dependency graph.
# Only quoted includes whose first path component is a layer are checked; <...> includes,
# includes without a folder, other folders, and paths that exist next to the including
# file (the compiler finds those first) are ignored. An include line counts even under
# #if or inside a /* */ comment: it is a dependency in the text.
#
# Prints each violation as
#   lib/<file>:<line>: <layer> includes "<header>" but dst_<layer> does not link dst_<other>
# and fails; otherwise prints "layers: N files, M includes, all allowed" (M: the layer
# includes checked, own layer included).
cmake_minimum_required(VERSION 3.22)

if(NOT SOURCE_DIR OR NOT IS_DIRECTORY "${SOURCE_DIR}")
  message(FATAL_ERROR "check_layers: SOURCE_DIR='${SOURCE_DIR}' is not a directory "
                      "(pass -DSOURCE_DIR=<the lib folder>)")
endif()
get_filename_component(SOURCE_DIR "${SOURCE_DIR}" ABSOLUTE)

# --- the layers: folders of SOURCE_DIR with a CMakeLists.txt ---
file(GLOB _children LIST_DIRECTORIES true RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/*")
list(SORT _children)
set(layers "")
foreach(_c IN LISTS _children)
  if(IS_DIRECTORY "${SOURCE_DIR}/${_c}" AND EXISTS "${SOURCE_DIR}/${_c}/CMakeLists.txt")
    list(APPEND layers "${_c}")
  endif()
endforeach()
if(NOT layers)
  message(FATAL_ERROR "check_layers: no layer folders (with a CMakeLists.txt) in ${SOURCE_DIR}")
endif()

# The layer a target or link item names by its spelling (dst_<layer>, dst_<layer>_<x>,
# dstrain::<layer>), the longest matching layer name winning; "" if none.
function(_layer_by_name out item)
  set(_best "")
  if(item MATCHES "^dst_(.+)$" OR item MATCHES "^dstrain::(.+)$")
    set(_rest "${CMAKE_MATCH_1}")
    foreach(_l IN LISTS layers)
      if(_rest STREQUAL _l OR _rest MATCHES "^${_l}_")
        string(LENGTH "${_l}" _n)
        string(LENGTH "${_best}" _m)
        if(_n GREATER _m)
          set(_best "${_l}")
        endif()
      endif()
    endforeach()
  endif()
  set(${out} "${_best}" PARENT_SCOPE)
endfunction()

# The CMakeLists.txt files, comments removed, and with ; [ ] turned to spaces so that the
# calls matched below stay one list element each.
file(GLOB_RECURSE _cmakelists "${SOURCE_DIR}/CMakeLists.txt")
list(SORT _cmakelists)
set(_calls_files "")
foreach(_f IN LISTS _cmakelists)
  file(READ "${_f}" _text)
  # Bracket comments #[[ ... ]] first, then line comments.
  while(TRUE)
    string(FIND "${_text}" "#[[" _open)
    if(_open EQUAL -1)
      break()
    endif()
    string(SUBSTRING "${_text}" ${_open} -1 _tail)
    string(FIND "${_tail}" "]]" _close)
    string(SUBSTRING "${_text}" 0 ${_open} _head)
    if(_close EQUAL -1)
      set(_text "${_head}")
    else()
      math(EXPR _after "${_close} + 2")
      string(SUBSTRING "${_tail}" ${_after} -1 _tail)
      set(_text "${_head}${_tail}")
    endif()
  endwhile()
  string(REGEX REPLACE "#[^\n]*" "" _text "${_text}")
  string(REGEX REPLACE "[][;]" " " _text "${_text}")

  file(RELATIVE_PATH _rel "${SOURCE_DIR}" "${_f}")
  set(_dir_layer "")
  if(_rel MATCHES "^([^/]+)/")
    set(_dir_layer "${CMAKE_MATCH_1}")
  endif()
  # Targets defined here belong to the layer folder they are defined in.
  string(REGEX MATCHALL "add_library[ \t\r\n]*\\([ \t\r\n]*[A-Za-z0-9_:.+-]+" _adds "${_text}")
  foreach(_a IN LISTS _adds)
    string(REGEX REPLACE "^add_library[ \t\r\n]*\\([ \t\r\n]*" "" _name "${_a}")
    if(_dir_layer AND NOT DEFINED _owner_${_name})
      set(_owner_${_name} "${_dir_layer}")
    endif()
  endforeach()
  string(REGEX MATCHALL "target_link_libraries[ \t\r\n]*\\([^)]*\\)" _tll "${_text}")
  set(_calls_${_rel} "${_tll}")
  list(APPEND _calls_files "${_rel}")
endforeach()

function(_layer_of out item)
  if(DEFINED _owner_${item})
    set(${out} "${_owner_${item}}" PARENT_SCOPE)
  else()
    _layer_by_name(_l "${item}")
    set(${out} "${_l}" PARENT_SCOPE)
  endif()
endfunction()

# allowed_<layer>: the layers its targets link directly.
foreach(_l IN LISTS layers)
  set(allowed_${_l} "")
endforeach()
foreach(_rel IN LISTS _calls_files)
  foreach(_call IN LISTS _calls_${_rel})
    string(REGEX REPLACE "^target_link_libraries[ \t\r\n]*\\(" "" _args "${_call}")
    # Words of the call; a generator expression ($<$<BOOL:X>:dst_y>) leaves ":dst_y".
    string(REGEX MATCHALL "[A-Za-z0-9_:.+-]+" _words "${_args}")
    list(POP_FRONT _words _target)
    _layer_of(_from "${_target}")
    if(NOT _from)
      continue()
    endif()
    foreach(_w IN LISTS _words)
      string(REGEX REPLACE "^:+" "" _w "${_w}")
      _layer_of(_to "${_w}")
      if(_to AND NOT _to STREQUAL _from)
        list(APPEND allowed_${_from} "${_to}")
      endif()
    endforeach()
  endforeach()
endforeach()
foreach(_l IN LISTS layers)
  list(REMOVE_DUPLICATES allowed_${_l})
endforeach()

# --- the includes ---
set(_nfiles 0)
set(_nincludes 0)
set(_violations 0)
foreach(_l IN LISTS layers)
  file(GLOB_RECURSE _sources
    "${SOURCE_DIR}/${_l}/*.hpp" "${SOURCE_DIR}/${_l}/*.cpp"
    "${SOURCE_DIR}/${_l}/*.cu" "${SOURCE_DIR}/${_l}/*.cuh")
  list(SORT _sources)
  foreach(_f IN LISTS _sources)
    math(EXPR _nfiles "${_nfiles} + 1")
    get_filename_component(_fdir "${_f}" DIRECTORY)
    file(RELATIVE_PATH _rel "${SOURCE_DIR}" "${_f}")
    file(STRINGS "${_f}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+\"")
    set(_read FALSE)
    set(_searched 0)  # offset in "\n<content>" after the last violation found
    foreach(_line IN LISTS _lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*$" "\\1" _header "${_line}")
      if(NOT _header MATCHES "^([^/]+)/")
        continue()
      endif()
      set(_other "${CMAKE_MATCH_1}")
      if(NOT _other IN_LIST layers OR EXISTS "${_fdir}/${_header}")
        continue()
      endif()
      math(EXPR _nincludes "${_nincludes} + 1")
      if(_other STREQUAL _l OR _other IN_LIST allowed_${_l})
        continue()
      endif()
      # A violation: its line number, searching on from the previous one so that a
      # repeated include line gets its own number.
      if(NOT _read)
        file(READ "${_f}" _content)
        set(_content "\n${_content}")
        set(_read TRUE)
      endif()
      string(SUBSTRING "${_content}" ${_searched} -1 _rest)
      string(FIND "${_rest}" "\n${_line}" _at)
      set(_lineno "?")
      if(NOT _at EQUAL -1)
        math(EXPR _searched "${_searched} + ${_at} + 1")
        string(SUBSTRING "${_content}" 0 ${_searched} _before)
        string(REGEX REPLACE "[^\n]" "" _newlines "${_before}")
        string(LENGTH "${_newlines}" _lineno)
      endif()
      message("lib/${_rel}:${_lineno}: ${_l} includes \"${_header}\" but dst_${_l} does not link dst_${_other}")
      math(EXPR _violations "${_violations} + 1")
    endforeach()
  endforeach()
endforeach()

if(_nfiles EQUAL 0)
  message(FATAL_ERROR "check_layers: no .hpp/.cpp/.cu/.cuh files under the layers of ${SOURCE_DIR}")
endif()
if(_violations GREATER 0)
  message(FATAL_ERROR "layers: ${_violations} of ${_nincludes} includes in ${_nfiles} files "
    "reach a layer their own does not link (add the link in the layer's CMakeLists.txt if "
    "the dependency is meant, otherwise move the code down)")
endif()
message("layers: ${_nfiles} files, ${_nincludes} includes, all allowed")
