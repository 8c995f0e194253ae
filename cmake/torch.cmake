# libtorch, CUDA + NCCL and the precompiled libtorch header: everything the trainer needs that the
# control plane and the operator do not. Included by the top-level CMakeLists.txt when
# MESHWORK_BUILD_TRAINER is ON.

# libtorch: Debian's 1.13 CPU build here and in CI; a CUDA-enabled libtorch 2.x is picked up
# through CMAKE_PREFIX_PATH (python3 -c 'import torch; print(torch.utils.cmake_prefix_path)').
find_package(Torch REQUIRED)
message(STATUS "Meshwork: libtorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX}")

# GPU code is compiled when CUDA and NCCL are present; its absence only turns it off.
set(MESHWORK_HAVE_CUDA OFF)
if(NOT MESHWORK_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(MESHWORK_HAVE_CUDA ON)
    message(STATUS "Meshwork: GPU code ON (CUDA ${CUDAToolkit_VERSION}, NCCL ${NCCL_LIBRARY})")
  elseif(MESHWORK_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MESHWORK_WITH_CUDA=ON but CUDA toolkit or NCCL was not found")
  else()
    message(STATUS "Meshwork: GPU code OFF (CUDA toolkit or NCCL not found)")
  endif()
endif()

# libtorch headers are heavy: every torch-using target reuses one precompiled header.
add_library(meshwork_torch_pch STATIC cmake/torch_pch.cpp)
target_link_libraries(meshwork_torch_pch PUBLIC ${TORCH_LIBRARIES})
target_include_directories(meshwork_torch_pch PUBLIC ${TORCH_INCLUDE_DIRS})
target_precompile_headers(meshwork_torch_pch PRIVATE <torch/torch.h>)
# A CUDA-enabled libtorch (2.x on the GPU machines) exposes its caching-allocator statistics.
if(TARGET torch_cuda OR TARGET c10_cuda)
  target_compile_definitions(meshwork_torch_pch PUBLIC MESHWORK_TORCH_CUDA=1)
  message(STATUS "Meshwork: libtorch has CUDA")
endif()

# meshwork_torch_library(NAME SOURCES...): a static library that uses libtorch.
function(meshwork_torch_library name)
  add_library(${name} STATIC ${ARGN})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC meshwork_torch_pch)
  target_precompile_headers(${name} REUSE_FROM meshwork_torch_pch)
endfunction()
