# SPDX-License-Identifier: Apache-2.0
# Asserts the publication primitives in ferry's CUDA kernels compile to system-scope release/acquire. The
# kernels are named below (qualified name, then how many instantiations, i.e. `.entry`s, the PTX must hold:
# one per copy form for the copy kernels, one per vector width for the gather); a named kernel with fewer or
# more entries fails the check, so a renamed or dropped kernel cannot silently leave it.
#   * every entry of a PUBLISHING kernel has st.release.sys (or red/atom .release.sys) and none of:
#     st.volatile, st.release.gpu, membar.gl, fence.sc.gpu / fence.acq_rel.gpu (__threadfence)
#   * every entry of a D2H kernel (launched programmatically on sm_90+) executes griddepcontrol.wait: without
#     it a kernel could read the cursor or the source before the kernel ahead of it on the stream completed;
#     every entry in ferry::kernels::d2h must be a named D2H kernel
#   * an entry whose name contains "publish" or "release" must be a named publishing kernel
#   * over all kernels: at least one st.release.sys.b64 and one ld.acquire.sys.b64
#   * no ld.acquire.gpu / st.release.gpu anywhere (a device-scope primitive is invisible to the CPU)
set(publishing_kernels
    "ferry::kernels::d2h::copy_entry_publish=5"    # kernels/d2h/copy: bytes, v1, v2, v4, v8 (fused release)
    "ferry::kernels::d2h::gather_publish=4"        # kernels/d2h/gather: v1, v2, v4, v8
    "ferry::kernels::d2h::gather_rows_publish=1"   # kernels/d2h/select: the row gather (optional release)
    "ferry::kernels::d2h::reduce_rows_publish=2"   # kernels/d2h/reduce: the reduced row batch (topk, fp8)
    "ferry::kernels::d2h::publish_head=1"          # kernels/d2h/publish: the batch release
    "ferry::kernels::d2h::commit_check=1"          # kernels/d2h/publish: the commit flag's release
    "ferry::kernels::d2h::claim_replay=1"          # kernels/d2h/replay: the unplanned-launch report's release
    "ferry::kernels::d2h::arm_replay=1"            # kernels/d2h/replay: the token queue's overflow report
    "ferry::testing::probe::kernels::publish=1")   # kernels/testing/probe.cu: the probe's release
set(d2h_kernels
    "ferry::kernels::d2h::copy_entry=9"            # bytes, v1, v2, v4, v8 and the four lean forms
    "ferry::kernels::d2h::copy_entry_publish=5"
    "ferry::kernels::d2h::gather_publish=4"
    "ferry::kernels::d2h::gather_rows_publish=1"
    "ferry::kernels::d2h::publish_head=1"
    "ferry::kernels::d2h::commit_check=1"
    "ferry::kernels::d2h::arm_replay=1"
    "ferry::kernels::d2h::select_rows=1"
    "ferry::kernels::d2h::reduce_rows=4"           # topk, fp8_e4m3, mean, stats
    "ferry::kernels::d2h::reduce_rows_publish=2"
    "ferry::kernels::d2h::claim_replay=1")
set(other_kernels
    "ferry::kernels::h2d::scatter=1")              # kernels/h2d/scatter: no publication (stream order)

# mangled_prefix(<out> <qualified name>): the Itanium prefix of its .entry names, up to the name's end;
# the next character is I (a template's arguments) or E (the parameters of a plain function).
function(mangled_prefix out qualified)
  string(REPLACE "::" ";" parts "${qualified}")
  set(p "_ZN")
  foreach(part IN LISTS parts)
    string(LENGTH "${part}" n)
    string(APPEND p "${n}${part}")
  endforeach()
  set(${out} "${p}" PARENT_SCOPE)
endfunction()
# match_named(<out> <name> <specs...>): the qualified name of the spec whose kernel `name` is an entry of.
function(match_named out name)
  set(${out} "" PARENT_SCOPE)
  foreach(spec IN LISTS ARGN)
    string(REGEX REPLACE "=.*" "" q "${spec}")
    mangled_prefix(p "${q}")
    string(LENGTH "${p}" n)
    string(SUBSTRING "${name}" 0 ${n} head)
    string(SUBSTRING "${name}" ${n} 1 next)
    if(head STREQUAL p AND next MATCHES "^[IE]$")
      set(${out} "${q}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
endfunction()

string(REPLACE "|" ";" PTX_FILES "${PTX_FILES}")
set(all "")
set(failures "")
set(found "")  # one element per entry: its kernel's qualified name
foreach(f IN LISTS PTX_FILES)
  if(NOT EXISTS "${f}")
    message(FATAL_ERROR "PTX file missing: ${f}")
  endif()
  file(READ "${f}" ptx)
  string(APPEND all "${ptx}")
  # split into entries: ".entry name(" ... up to the next ".entry" or end
  string(REGEX MATCHALL "\\.entry[^\n]*" entries "${ptx}")
  foreach(e IN LISTS entries)
    string(REGEX MATCH "\\.entry ([A-Za-z0-9_]+)" _m "${e}")
    set(name "${CMAKE_MATCH_1}")
    string(FIND "${ptx}" "${e}" start)
    string(SUBSTRING "${ptx}" ${start} -1 rest)
    string(SUBSTRING "${rest}" 7 -1 rest_after)
    string(FIND "${rest_after}" ".entry" next)
    if(next GREATER -1)
      string(SUBSTRING "${rest}" 0 ${next} body)
    else()
      set(body "${rest}")
    endif()
    match_named(pub "${name}" ${publishing_kernels})
    match_named(d2h "${name}" ${d2h_kernels})
    match_named(other "${name}" ${other_kernels})
    foreach(q IN ITEMS "${pub}" "${d2h}" "${other}")
      if(q)
        list(APPEND found "${q}")
        break()
      endif()
    endforeach()
    if(d2h)
      if(NOT body MATCHES "griddepcontrol\\.wait")
        list(APPEND failures "${name}: a D2H kernel without griddepcontrol.wait (programmatic launch join)")
      endif()
    elseif(name MATCHES "^_ZN5ferry7kernels3d2h")
      list(APPEND failures "${name}: a D2H kernel not named in tests/ptx/check_ptx.cmake (d2h_kernels)")
    endif()
    if(pub)
      if(NOT body MATCHES "(st|red|atom)\\.release\\.sys")
        list(APPEND failures "${name}: no system-scope release (st.release.sys)")
      endif()
      foreach(bad "st\\.volatile" "st\\.release\\.gpu" "membar\\.gl" "fence\\.sc\\.gpu" "fence\\.acq_rel\\.gpu")
        if(body MATCHES "${bad}")
          list(APPEND failures "${name}: forbidden ${bad} in a publication kernel")
        endif()
      endforeach()
    elseif(name MATCHES "publish|release")
      list(APPEND failures "${name}: a publication kernel not named in tests/ptx/check_ptx.cmake (publishing_kernels)")
    endif()
  endforeach()
endforeach()
# Every named kernel, with its number of entries.
foreach(spec IN LISTS publishing_kernels d2h_kernels other_kernels)
  string(REGEX REPLACE "=.*" "" q "${spec}")
  string(REGEX REPLACE ".*=" "" want "${spec}")
  set(seen ${found})
  list(FILTER seen INCLUDE REGEX "^${q}$")
  list(LENGTH seen got)
  if(NOT got EQUAL want)
    list(APPEND failures "${q}: ${got} entries in the PTX, expected ${want}")
  endif()
endforeach()
if(NOT all MATCHES "st\\.release\\.sys\\.b64")
  list(APPEND failures "no st.release.sys.b64 in any kernel")
endif()
if(NOT all MATCHES "ld\\.acquire\\.sys\\.b64")
  list(APPEND failures "no ld.acquire.sys.b64 in any kernel")
endif()
if(all MATCHES "ld\\.acquire\\.gpu|st\\.release\\.gpu")
  list(APPEND failures "device-scope acquire/release found (must be .sys)")
endif()
if(failures)
  list(REMOVE_DUPLICATES failures)
  string(REPLACE ";" "\n  " msg "${failures}")
  message(FATAL_ERROR "PTX memory-ordering check failed:\n  ${msg}")
endif()
list(LENGTH publishing_kernels npub)
list(LENGTH d2h_kernels nd2h)
list(LENGTH found nfound)
message(STATUS "PTX check passed (${nfound} entries of the named kernels): the ${npub} publishing kernels use "
               "st.release.sys and no device-scope fence or volatile store; the ${nd2h} D2H kernels execute "
               "griddepcontrol.wait; acquire is ld.acquire.sys")
