# SPDX-License-Identifier: Apache-2.0
# CMake < 3.27 does not know nvcc's C++20 flag, so a target whose usage requirements say cxx_std_20
# (ferry::ferry does) may fail at generate time with "requires the language dialect CUDA20". nvcc 12+
# accepts -std=c++20; teach CMake the spelling. Newer CMake already knows it, and then this does nothing.
# Included by ferry's own build and, installed beside it, by ferryConfig.cmake (for consumers that enabled
# CUDA before find_package(ferry)).
if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" AND NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION
   AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  list(APPEND CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
  list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
endif()
