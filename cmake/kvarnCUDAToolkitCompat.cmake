# kvarn_cudatoolkit_compat(): call before find_package(CUDAToolkit). Lets CMake 3.25's stock
# FindCUDAToolkit work with a CUDA toolkit that has no nvToolsExt library (CUDA >= 12.9,
# CUDA 13: NVTX is the header-only nvtx3 only).
#
# The stock module (Debian 12's cmake-data 3.25.1, Modules/FindCUDAToolkit.cmake:1082-1089):
#
#   _CUDAToolkit_find_and_add_import_lib(nvToolsExt ALT nvToolsExt64)  # no library: no target
#   if(CUDAToolkit_VERSION VERSION_GREATER_EQUAL 10.0)
#     if(CMAKE_MINIMUM_REQUIRED_VERSION VERSION_GREATER_EQUAL 3.25)
#       set_property(TARGET CUDA::nvToolsExt PROPERTY DEPRECATION "...")
#
# errors with "set_property could not find TARGET CUDA::nvToolsExt" in every project that
# requires CMake >= 3.25, as this one does. Later modules guard it with
# `if(TARGET CUDA::nvToolsExt AND ...)`. The module never replaces a CUDA::<lib> target that
# already exists, so when the toolkit has no nvToolsExt library this defines CUDA::nvToolsExt
# first, as a stand-in for what replaced it: CUDA::nvtx3 (<nvtx3/nvToolsExt.h>, header-only;
# the module defines it for CUDA >= 10). Nothing in kvarn links either.
function(kvarn_cudatoolkit_compat)
  if(TARGET CUDA::nvToolsExt)
    return()
  endif()
  # Where the module looks: the toolkit's library directory (the CUDA compiler's toolkit when
  # the CUDA language is enabled, else CUDAToolkit_ROOT, CUDA_PATH, nvcc on PATH,
  # /usr/local/cuda) and the system paths. The module reuses this cache entry.
  set(roots ${CMAKE_CUDA_IMPLICIT_LINK_DIRECTORIES} ${CMAKE_CUDA_COMPILER_TOOLKIT_ROOT}
    ${CUDAToolkit_ROOT} $ENV{CUDAToolkit_ROOT} $ENV{CUDA_PATH})
  find_program(nvcc nvcc NO_CACHE)
  if(nvcc)
    get_filename_component(nvcc_root "${nvcc}" DIRECTORY)
    get_filename_component(nvcc_root "${nvcc_root}" DIRECTORY)
    list(APPEND roots "${nvcc_root}")
  endif()
  list(APPEND roots /usr/local/cuda)
  find_library(CUDA_nvToolsExt_LIBRARY NAMES nvToolsExt nvToolsExt64
    HINTS ${roots}
    PATH_SUFFIXES nvidia/current lib64 lib/x64 lib lib64/stubs lib/x64/stubs lib/stubs stubs)
  mark_as_advanced(CUDA_nvToolsExt_LIBRARY)
  if(NOT CUDA_nvToolsExt_LIBRARY)
    add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
    # Resolved when generating: CUDA::nvtx3 is defined by find_package(CUDAToolkit) next.
    target_link_libraries(CUDA::nvToolsExt INTERFACE CUDA::nvtx3)
  endif()
endfunction()
