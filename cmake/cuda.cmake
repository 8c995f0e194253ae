# The CUDA runtime (headers + libcudart) and NCCL (nccl.h + libnccl), found without nvcc (the NVIDIA
# wheels that come with a pip torch carry none); and nvcc, if there is one, for the trainer's own
# kernels (trainer/model/fused_kernels.cu): without it they are left out and the model runs the
# composition they replace (training.fused_kernels). Included by cmake/torch.cmake after
# find_package(Torch).
#
# Looked for, first found wins:
#   CUDA runtime  MESHWORK_CUDA_ROOTS (folders with include/ and/or lib/: scripts/gpu-build.sh puts
#                 the bundle's crt/ and CCCL headers there), CUDAToolkit_ROOT, the wheels next to
#                 libtorch (site-packages/nvidia/cu13 for CUDA 13, nvidia/cuda_runtime for CUDA 12:
#                 what libtorch loads at run time), $CUDAToolkit_ROOT, $CUDA_HOME, /usr/local/cuda,
#                 the system
#                 (crt/ and nv/target: beside cuda_runtime_api.h first, then the same places)
#   NCCL          NCCL_ROOT, $NCCL_ROOT, the nvidia-nccl-cu* wheel next to libtorch
#                 (site-packages/nvidia/nccl), then the CUDA runtime's places
#   nvcc          MESHWORK_NVCC, then bin/ of the CUDA runtime's places (the nvidia-cuda-nvcc and
#                 nvidia-nvvm wheels unpack there: scripts/cuda-flavor.sh), then PATH
# The wheels ship versioned libraries only (libcudart.so.13, libnccl.so.2), hence the extra names.
#
# Sets MESHWORK_CUDA_INCLUDE_DIRS, MESHWORK_CUDART_LIBRARY, MESHWORK_CUDA_VERSION ("13.0"),
# MESHWORK_CUDA_FOUND; MESHWORK_NVCC (or MESHWORK_NVCC-NOTFOUND), MESHWORK_CUDA_ARCHS; NCCL_INCLUDE_DIR, NCCL_LIBRARY, MESHWORK_NCCL_VERSION, MESHWORK_NCCL_FOUND.

# A pip torch lives at site-packages/torch; its NVIDIA wheels unpack beside it, at site-packages/nvidia.
get_filename_component(_mw_site_packages "${TORCH_INSTALL_PREFIX}" DIRECTORY)
set(_mw_cuda_hints)
set(MESHWORK_CUDA_ROOTS "" CACHE STRING "Folders searched first for CUDA headers and libcudart")
foreach(_mw_dir IN ITEMS ${MESHWORK_CUDA_ROOTS} "${CUDAToolkit_ROOT}" "${_mw_site_packages}/nvidia/cu13"
                         "${_mw_site_packages}/nvidia/cuda_runtime" "$ENV{CUDAToolkit_ROOT}" "$ENV{CUDA_HOME}"
                         /usr/local/cuda)
  if(_mw_dir AND IS_DIRECTORY "${_mw_dir}")
    list(APPEND _mw_cuda_hints "${_mw_dir}")
  endif()
endforeach()

find_path(MESHWORK_CUDA_INCLUDE_DIR cuda_runtime_api.h
  HINTS ${_mw_cuda_hints} PATH_SUFFIXES include targets/x86_64-linux/include)
# cuda_runtime_api.h includes crt/host_defines.h, which CUDA 13 moved to a wheel of its own
# (nvidia-cuda-crt) that torch does not depend on.
find_path(MESHWORK_CUDA_CRT_INCLUDE_DIR crt/host_defines.h
  HINTS ${MESHWORK_CUDA_INCLUDE_DIR} ${_mw_cuda_hints} PATH_SUFFIXES include targets/x86_64-linux/include)
# cuda_fp16.h (included by nccl.h) includes <nv/target> from CCCL, again a wheel of its own in
# CUDA 13 (nvidia-cuda-cccl) that torch does not depend on.
find_path(MESHWORK_CUDA_CCCL_INCLUDE_DIR nv/target
  HINTS ${MESHWORK_CUDA_INCLUDE_DIR} ${_mw_cuda_hints} PATH_SUFFIXES include include/cccl targets/x86_64-linux/include)
find_library(MESHWORK_CUDART_LIBRARY NAMES cudart libcudart.so.13 libcudart.so.12
  HINTS ${_mw_cuda_hints} PATH_SUFFIXES lib lib64 targets/x86_64-linux/lib)

set(MESHWORK_CUDA_FOUND OFF)
set(MESHWORK_CUDA_VERSION "")
if(MESHWORK_CUDA_INCLUDE_DIR AND MESHWORK_CUDA_CRT_INCLUDE_DIR AND MESHWORK_CUDA_CCCL_INCLUDE_DIR
   AND MESHWORK_CUDART_LIBRARY)
  set(MESHWORK_CUDA_FOUND ON)
  set(MESHWORK_CUDA_INCLUDE_DIRS "${MESHWORK_CUDA_INCLUDE_DIR}" "${MESHWORK_CUDA_CRT_INCLUDE_DIR}"
                                 "${MESHWORK_CUDA_CCCL_INCLUDE_DIR}")
  list(REMOVE_DUPLICATES MESHWORK_CUDA_INCLUDE_DIRS)
  file(STRINGS "${MESHWORK_CUDA_INCLUDE_DIR}/cuda_runtime_api.h" _mw_line REGEX "^#define CUDART_VERSION +[0-9]+")
  if(_mw_line MATCHES "([0-9]+)$")
    math(EXPR _mw_major "${CMAKE_MATCH_1} / 1000")
    math(EXPR _mw_minor "(${CMAKE_MATCH_1} % 1000) / 10")
    set(MESHWORK_CUDA_VERSION "${_mw_major}.${_mw_minor}")
  endif()
endif()

set(_mw_nccl_hints)
foreach(_mw_dir IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "${_mw_site_packages}/nvidia/nccl" ${_mw_cuda_hints})
  if(_mw_dir AND IS_DIRECTORY "${_mw_dir}")
    list(APPEND _mw_nccl_hints "${_mw_dir}")
  endif()
endforeach()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_mw_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_mw_nccl_hints} PATH_SUFFIXES lib lib64)

set(MESHWORK_NCCL_FOUND OFF)
set(MESHWORK_NCCL_VERSION "")
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  set(MESHWORK_NCCL_FOUND ON)
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _mw_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_mw_part IN ITEMS MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_mw_part} +([0-9]+)" _mw_match "${_mw_lines}")
    set(_mw_nccl_${_mw_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(MESHWORK_NCCL_VERSION "${_mw_nccl_MAJOR}.${_mw_nccl_MINOR}.${_mw_nccl_PATCH}")
endif()

# nvcc for the trainer's kernels, called directly (trainer/model/CMakeLists.txt) rather than
# through enable_language(CUDA), whose toolkit detection expects a whole toolkit's layout. The
# architectures: A100 (80), H100/H200 (90), B200 (100) as machine code, and PTX of 90 that newer
# GPUs compile when loaded.
find_program(MESHWORK_NVCC nvcc HINTS ${_mw_cuda_hints} PATH_SUFFIXES bin
  DOC "nvcc for trainer/model/fused_kernels.cu (empty: the kernels are left out)")
set(MESHWORK_CUDA_ARCHS "80;90;100" CACHE STRING "GPU architectures the trainer's kernels are compiled for")
