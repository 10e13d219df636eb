# SPDX-License-Identifier: Apache-2.0
# Drives one spin verification run:  spin -a [-DMUTANT] model.pml ; cc -O2 -DSAFETY -DCOLLAPSE pan.c ; ./pan -m<depth>
# pan exits 0 even when it finds errors, so the result is taken from its "errors: N" line.
#
#   cmake -DSPIN=/usr/bin/spin -DCC=/usr/bin/gcc -DMODEL=h2d_slots.pml -DWORK_DIR=<dir>
#         [-DDEFINES=FREE_ON_FAILURE] -DEXPECT=pass|fail [-DDEPTH=100000] -P run_spin.cmake
#   EXPECT=pass : errors: 0 required (the correct model)
#   EXPECT=fail : errors >= 1 required (a mutant must be caught); the counterexample trail is replayed
foreach(v SPIN CC MODEL WORK_DIR EXPECT)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "run_spin.cmake: -D${v}=... is required")
  endif()
endforeach()
if(NOT DEFINED DEPTH)
  set(DEPTH 100000)
endif()

set(_spin_defs "")
foreach(d IN LISTS DEFINES)
  list(APPEND _spin_defs "-D${d}")
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
get_filename_component(_name "${MODEL}" NAME)
configure_file("${MODEL}" "${WORK_DIR}/${_name}" COPYONLY)

execute_process(COMMAND "${SPIN}" -a ${_spin_defs} "${_name}" WORKING_DIRECTORY "${WORK_DIR}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "spin -a ${_spin_defs} ${_name} failed (${rc}):\n${out}")
endif()

# SAFETY: assertions + invalid end states (deadlock); COLLAPSE: exhaustive, compressed state storage.
execute_process(COMMAND "${CC}" -O2 -DSAFETY -DCOLLAPSE -w -o pan pan.c WORKING_DIRECTORY "${WORK_DIR}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${CC} pan.c failed (${rc}):\n${out}")
endif()

string(TIMESTAMP _t0 "%s")
execute_process(COMMAND "${WORK_DIR}/pan" -m${DEPTH} WORKING_DIRECTORY "${WORK_DIR}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(TIMESTAMP _t1 "%s")
math(EXPR _secs "${_t1} - ${_t0}")
file(WRITE "${WORK_DIR}/pan.out" "${out}")

string(REGEX MATCH "errors: ([0-9]+)" _m "${out}")
if(NOT _m)
  message(FATAL_ERROR "pan (${_spin_defs}) printed no 'errors: N' line (rc ${rc}):\n${out}")
endif()
set(errors "${CMAKE_MATCH_1}")
string(REGEX MATCH "([0-9]+) states, stored" _m "${out}")
set(stored "${CMAKE_MATCH_1}")
string(REGEX MATCH "depth reached ([0-9]+)" _m "${out}")
set(depth "${CMAKE_MATCH_1}")
string(REGEX MATCH "pan:[0-9]+: [^\n]*" violation "${out}")
if(out MATCHES "max search depth too small")
  message(FATAL_ERROR "pan: search depth ${DEPTH} too small, the search was truncated:\n${out}")
endif()

set(_what "${_name} ${_spin_defs}")
message(STATUS "spin ${_what}: errors: ${errors}, states stored: ${stored}, depth reached: ${depth} (~${_secs} s)")

if(EXPECT STREQUAL "pass")
  if(NOT errors EQUAL 0)
    execute_process(COMMAND "${SPIN}" -t ${_spin_defs} -p "${_name}" WORKING_DIRECTORY "${WORK_DIR}"
                    OUTPUT_VARIABLE trail ERROR_VARIABLE trail)
    string(LENGTH "${trail}" _len)
    if(_len GREATER 6000)
      math(EXPR _from "${_len} - 6000")
      string(SUBSTRING "${trail}" ${_from} 6000 trail)
    endif()
    message(FATAL_ERROR "spin found ${errors} error(s) in the correct model: ${violation}\n"
                        "pan output:\n${out}\ncounterexample (tail):\n${trail}")
  endif()
elseif(EXPECT STREQUAL "fail")
  if(errors EQUAL 0)
    message(FATAL_ERROR "mutant ${_spin_defs} NOT caught: spin explored ${stored} states and found no error")
  endif()
  execute_process(COMMAND "${SPIN}" -t ${_spin_defs} -p "${_name}" WORKING_DIRECTORY "${WORK_DIR}"
                  OUTPUT_VARIABLE trail ERROR_VARIABLE trail)
  file(WRITE "${WORK_DIR}/trail.txt" "${trail}")
  string(REGEX MATCHALL "spin: [^\n]*" _lines "${trail}")
  list(JOIN _lines "\n  " _lines)
  message(STATUS "mutant ${_spin_defs} caught: ${violation}\n  ${_lines}\n  full trail: ${WORK_DIR}/trail.txt")
else()
  message(FATAL_ERROR "run_spin.cmake: EXPECT must be pass or fail, got '${EXPECT}'")
endif()
