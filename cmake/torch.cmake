# libtorch, CUDA + NCCL, Gloo and the precompiled libtorch header: everything the trainer needs that
# the control plane and the operator do not. Included by the top-level CMakeLists.txt when
# MESHWORK_BUILD_TRAINER is ON.

# libtorch: Debian's 1.13 CPU build here and in CI; a CUDA-enabled libtorch 2.x is picked up
# through CMAKE_PREFIX_PATH (python3 -c 'import torch; print(torch.utils.cmake_prefix_path)').
#
# A CUDA libtorch's Caffe2Config.cmake includes its public/cuda.cmake, which wants a CUDA toolkit
# with nvcc (find_package(CUDA), enable_language(CUDA)) so that a project can compile .cu files.
# The trainer calls nvcc itself for its one .cu file (cmake/cuda.cmake), when there is an nvcc: the
# NVIDIA wheels of a pip torch have none. Of what that file
# defines, libtorch's exported targets use only torch::cudart (c10_cuda and torch_cuda link it):
# defining it first makes cuda.cmake return at its include guard (`if(TARGET torch::cudart)`), and
# it is pointed below at the CUDA runtime that cmake/cuda.cmake finds. A CPU libtorch ignores it.
if(NOT TARGET torch::cudart)
  add_library(torch::cudart INTERFACE IMPORTED)
endif()
find_package(Torch REQUIRED)
message(STATUS "Meshwork: libtorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX}")
# TorchConfig finds libc10 (and libc10_cuda) with find_library(... PATHS <prefix>/lib), which
# looks in the system's folders first: with Debian's libtorch-dev installed too (as on CI), a pip
# libtorch would be linked with Debian's libc10.so. Take each from libtorch's own lib/ instead.
set(_mw_torch_libraries)
foreach(_mw_lib IN LISTS TORCH_LIBRARIES)
  get_filename_component(_mw_name "${_mw_lib}" NAME)
  string(FIND "${_mw_lib}" "${TORCH_INSTALL_PREFIX}/" _mw_at)
  if(IS_ABSOLUTE "${_mw_lib}" AND NOT _mw_at EQUAL 0 AND EXISTS "${TORCH_INSTALL_PREFIX}/lib/${_mw_name}")
    message(STATUS "Meshwork: linking ${TORCH_INSTALL_PREFIX}/lib/${_mw_name}, not ${_mw_lib}")
    set(_mw_lib "${TORCH_INSTALL_PREFIX}/lib/${_mw_name}")
  endif()
  list(APPEND _mw_torch_libraries "${_mw_lib}")
endforeach()
set(TORCH_LIBRARIES ${_mw_torch_libraries})
# The wheel's public/mkl.cmake gives caffe2::mkl the link folders ${MKL_ROOT}/lib/intel64 & co.;
# with no MKL_ROOT (MKL is inside libtorch_cpu) they would be /lib/intel64 in every RUNPATH.
if(TARGET caffe2::mkl AND NOT MKL_ROOT)
  set_property(TARGET caffe2::mkl PROPERTY INTERFACE_LINK_DIRECTORIES "")
endif()

# GPU code: a CUDA libtorch needs the CUDA runtime's headers and libcudart (its c10/cuda headers
# include them; device.cpp calls the runtime); the NCCL communicator also needs NCCL. Without a
# CUDA libtorch no tensor can live on a GPU, so there is no GPU code to build.
set(MESHWORK_HAVE_CUDA OFF)
if(TARGET torch_cuda OR TARGET c10_cuda)
  include(cmake/cuda.cmake)
  if(NOT MESHWORK_CUDA_FOUND)
    message(FATAL_ERROR "libtorch at ${TORCH_INSTALL_PREFIX} is a CUDA build, but the CUDA runtime was not "
      "found (cuda_runtime_api.h: ${MESHWORK_CUDA_INCLUDE_DIR}; crt/host_defines.h: "
      "${MESHWORK_CUDA_CRT_INCLUDE_DIR}; nv/target: ${MESHWORK_CUDA_CCCL_INCLUDE_DIR}; libcudart: "
      "${MESHWORK_CUDART_LIBRARY}). Install the wheels nvidia-cuda-runtime, nvidia-cuda-crt and "
      "nvidia-cuda-cccl next to torch, or point -DCUDAToolkit_ROOT=<dir> at a CUDA toolkit (docs/gpu.md).")
  endif()
  set_target_properties(torch::cudart PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${MESHWORK_CUDA_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${MESHWORK_CUDART_LIBRARY}")
  message(STATUS "Meshwork: libtorch has CUDA (runtime ${MESHWORK_CUDA_VERSION}: ${MESHWORK_CUDART_LIBRARY})")
  if(MESHWORK_WITH_CUDA STREQUAL "OFF")
    message(STATUS "Meshwork: GPU communicator OFF (MESHWORK_WITH_CUDA=OFF)")
  elseif(MESHWORK_NCCL_FOUND)
    set(MESHWORK_HAVE_CUDA ON)
    message(STATUS "Meshwork: GPU code ON (CUDA ${MESHWORK_CUDA_VERSION}, NCCL ${MESHWORK_NCCL_VERSION}: ${NCCL_LIBRARY})")
  elseif(MESHWORK_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MESHWORK_WITH_CUDA=ON but NCCL was not found (nccl.h: ${NCCL_INCLUDE_DIR}; "
      "libnccl: ${NCCL_LIBRARY}): install the nvidia-nccl-cu13 wheel next to torch or set -DNCCL_ROOT=<dir>")
  else()
    message(STATUS "Meshwork: GPU communicator OFF (NCCL not found: set -DNCCL_ROOT=<dir>)")
  endif()
elseif(MESHWORK_WITH_CUDA STREQUAL "ON")
  message(FATAL_ERROR "MESHWORK_WITH_CUDA=ON but libtorch at ${TORCH_INSTALL_PREFIX} is a CPU build: "
    "point CMAKE_PREFIX_PATH at a CUDA libtorch (python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')")
else()
  message(STATUS "Meshwork: GPU code OFF (libtorch ${Torch_VERSION} has no CUDA)")
endif()

# Gloo, the CPU communicator, goes through c10d's ProcessGroupGloo, whose header includes Gloo's.
# Usable only with the Gloo that this libtorch was built with, so its headers are looked for next
# to libtorch's own and nowhere else: Debian's libtorch and libgloo-dev share /usr/include (and
# libtorch_cpu links libgloo.so, which we then link too); the pip wheel has Gloo inside
# libtorch_cpu.so but ships no Gloo headers, and a system Gloo of another version would not match.
set(MESHWORK_HAVE_GLOO OFF)
if(NOT MESHWORK_WITH_GLOO STREQUAL "OFF")
  find_path(MESHWORK_GLOO_INCLUDE_DIR gloo/config.h HINTS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(MESHWORK_GLOO_INCLUDE_DIR)
    set(MESHWORK_HAVE_GLOO ON)
    get_filename_component(_mw_gloo_prefix "${MESHWORK_GLOO_INCLUDE_DIR}" DIRECTORY)
    find_library(GLOO_LIBRARY gloo NO_DEFAULT_PATH
      HINTS "${_mw_gloo_prefix}/lib" "${_mw_gloo_prefix}/lib/${CMAKE_LIBRARY_ARCHITECTURE}" "${_mw_gloo_prefix}/lib64")
    if(GLOO_LIBRARY)
      message(STATUS "Meshwork: Gloo: ON (headers in ${MESHWORK_GLOO_INCLUDE_DIR}, ${GLOO_LIBRARY})")
    else()
      set(GLOO_LIBRARY "")  # no libgloo beside the headers: Gloo's code is inside libtorch_cpu
      message(STATUS "Meshwork: Gloo: ON (headers in ${MESHWORK_GLOO_INCLUDE_DIR}, code in libtorch)")
    endif()
  elseif(MESHWORK_WITH_GLOO STREQUAL "ON")
    message(FATAL_ERROR "MESHWORK_WITH_GLOO=ON but libtorch at ${TORCH_INSTALL_PREFIX} has no Gloo headers "
      "(gloo/config.h not in ${TORCH_INCLUDE_DIRS})")
  endif()
endif()
if(NOT MESHWORK_HAVE_GLOO)
  if(MESHWORK_WITH_GLOO STREQUAL "OFF")
    set(_mw_why "MESHWORK_WITH_GLOO=OFF")
  else()
    set(_mw_why "libtorch at ${TORCH_INSTALL_PREFIX} has no Gloo headers")
  endif()
  if(MESHWORK_HAVE_CUDA)
    message(STATUS "Meshwork: Gloo: OFF — ${_mw_why}; this build runs NCCL only (training.device=cuda)")
  else()
    message(WARNING "Meshwork: Gloo: OFF — ${_mw_why}, and there is no NCCL either: this build "
      "trains in one process only")
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
endif()

# meshwork_torch_library(NAME SOURCES...): a static library that uses libtorch.
function(meshwork_torch_library name)
  add_library(${name} STATIC ${ARGN})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC meshwork_torch_pch)
  target_precompile_headers(${name} REUSE_FROM meshwork_torch_pch)
endfunction()
