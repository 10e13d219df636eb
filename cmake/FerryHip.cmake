# SPDX-License-Identifier: Apache-2.0
# enable_language(HIP) on Debian with CMake < 3.27.
#
# CMake 3.25 looks for hip-lang-config.cmake under <ROCM_ROOT>/lib/cmake/hip-lang, but Debian installs it
# in the multiarch directory /usr/lib/x86_64-linux-gnu/cmake/hip-lang (Kitware issue 24562, fixed in
# CMake 3.27). We build a tiny "ROCm root" in the build tree whose lib/cmake/hip-lang links to Debian's,
# point CMAKE_HIP_COMPILER_ROCM_ROOT at it, and tell clang where Debian keeps the device libraries.
# Debian's hipcc 5.2 brings clang-15; always name an offload arch (default gfx90a).
macro(ferry_enable_hip)
  if(NOT DEFINED CMAKE_HIP_ARCHITECTURES)
    set(CMAKE_HIP_ARCHITECTURES gfx90a)
  endif()
  set(_ferry_multiarch "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}")
  if(NOT CMAKE_LIBRARY_ARCHITECTURE)
    set(_ferry_multiarch "/usr/lib/x86_64-linux-gnu")
  endif()
  # Also on a reconfigure of a build tree that has ferry's root cached: the flags below are not cached.
  set(_ferry_rocm_root "${CMAKE_BINARY_DIR}/ferry-rocm-root")
  if(CMAKE_VERSION VERSION_LESS 3.27 AND EXISTS "${_ferry_multiarch}/cmake/hip-lang/hip-lang-config.cmake"
     AND (NOT DEFINED CMAKE_HIP_COMPILER_ROCM_ROOT OR CMAKE_HIP_COMPILER_ROCM_ROOT STREQUAL _ferry_rocm_root))
    file(MAKE_DIRECTORY "${_ferry_rocm_root}/lib/cmake")
    if(NOT EXISTS "${_ferry_rocm_root}/lib/cmake/hip-lang")
      file(CREATE_LINK "${_ferry_multiarch}/cmake/hip-lang" "${_ferry_rocm_root}/lib/cmake/hip-lang" SYMBOLIC)
    endif()
    set(CMAKE_HIP_COMPILER_ROCM_ROOT "${_ferry_rocm_root}" CACHE PATH "ROCm root seen by enable_language(HIP)")
    list(APPEND CMAKE_PREFIX_PATH "${_ferry_multiarch}/cmake")
    # enable_language's try_compile projects see the environment, not this scope's variables.
    if(DEFINED ENV{CMAKE_PREFIX_PATH})
      set(ENV{CMAKE_PREFIX_PATH} "$ENV{CMAKE_PREFIX_PATH}:${_ferry_multiarch}/cmake")
    else()
      set(ENV{CMAKE_PREFIX_PATH} "${_ferry_multiarch}/cmake")
    endif()
    if(NOT CMAKE_HIP_COMPILER AND NOT DEFINED ENV{HIPCXX})
      find_program(_ferry_clang15 clang++-15)
      if(_ferry_clang15)
        set(CMAKE_HIP_COMPILER "${_ferry_clang15}")
      endif()
    endif()
    if(NOT DEFINED ENV{HIPFLAGS} AND EXISTS "${_ferry_multiarch}/amdgcn/bitcode")
      set(CMAKE_HIP_FLAGS "${CMAKE_HIP_FLAGS} --rocm-path=/usr --rocm-device-lib-path=${_ferry_multiarch}/amdgcn/bitcode")
    endif()
  endif()
  enable_language(HIP)
  find_package(hip CONFIG REQUIRED)
endmacro()
