# SPDX-License-Identifier: Apache-2.0
# cmake -P: installs ferry (FERRY_BINARY_DIR) into WORK_DIR/prefix, lists the installed tree and fails if
# any installed file is, or contains, test instrumentation:
#   * a path naming testing / probe / pattern / checksum / device_clock;
#   * in a text file (headers, CMake files): the testing tree or its helpers (ferry/testing, ferry::testing,
#     backend/probe, probe kernels, pattern_word/pattern_byte, checksum, device_clock, globaltimer);
#   * in a public header (not under a detail/ directory, where the hooks the testing accessors reach may
#     live): the D2H/H2D test hooks (debug_fault, debug_copy_delay, snapshot(, state_snapshot);
#   The one mention allowed: the friend declaration of the testing accessors (`ferry::testing::d2h_access`,
#   `h2d_access`, `sink_access`, declared in the public class and defined only under tests/support), and its
#   namespace.
#   * in a library: symbols or sources of the testing tree (ferry::testing, probe, checksum, pattern_word,
#     globaltimer, tests/support, kernels/testing).
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${FERRY_BINARY_DIR}" --prefix "${WORK_DIR}/prefix"
                OUTPUT_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
set(path_re "testing|probe|pattern|checksum|device_clock")
set(text_re "ferry/testing|ferry::testing|backend/probe|probe_(publish|consume|late_fill)|probe::|pattern_word|pattern_byte|checksum|device_clock|globaltimer")
set(public_re "debug_fault|debug_copy_delay|snapshot\\(|state_snapshot")
set(binary_re "ferry7testing|ferry::testing|5probe|probe_publish|checksum|pattern_word|globaltimer|tests/support|kernels/testing")
file(GLOB_RECURSE files RELATIVE "${WORK_DIR}/prefix" "${WORK_DIR}/prefix/*")
list(SORT files)
set(failures "")
foreach(f IN LISTS files)
  message(STATUS "installed: ${f}")
  string(TOLOWER "${f}" lower)
  if(lower MATCHES "${path_re}")
    list(APPEND failures "${f}: the path names test instrumentation (${CMAKE_MATCH_0})")
  endif()
  if(f MATCHES "\\.(a|so|so\\..*|lib|dll)$")
    file(STRINGS "${WORK_DIR}/prefix/${f}" hits REGEX "${binary_re}" LIMIT_COUNT 3)
  else()
    file(STRINGS "${WORK_DIR}/prefix/${f}" hits REGEX "${text_re}" LIMIT_COUNT 3)
    if(f MATCHES "^include/" AND NOT f MATCHES "/detail/")
      file(STRINGS "${WORK_DIR}/prefix/${f}" public_hits REGEX "${public_re}" LIMIT_COUNT 3)
      list(APPEND hits ${public_hits})
    endif()
  endif()
  foreach(h IN LISTS hits)
    string(STRIP "${h}" h)
    if(h STREQUAL "" OR h MATCHES "(d2h|h2d|sink)_access" OR h MATCHES "^(namespace ferry::testing {|}  // namespace ferry::testing)$")
      continue()
    endif()
    string(SUBSTRING "${h}" 0 160 h)
    list(APPEND failures "${f}: contains test instrumentation: ${h}")
  endforeach()
endforeach()
list(LENGTH files n)
if(n EQUAL 0)
  message(FATAL_ERROR "nothing was installed")
endif()
if(failures)
  string(REPLACE ";" "\n  " msg "${failures}")
  message(FATAL_ERROR "the install tree ships test instrumentation:\n  ${msg}")
endif()
message(STATUS "install tree: ${n} files, no test instrumentation")
