// Launchers of the CUDA kernels in fused_kernels.cu, which is compiled only where nvcc was found
// at build time (then MESHWORK_FUSED_KERNELS is defined: cmake/cuda.cmake). Raw pointers and an
// opaque stream (a cudaStream_t), so that callers include no CUDA header. The tables of the rope
// launchers are in the arithmetic type: double for kDouble, float otherwise. Each returns nullptr
// on success, else the CUDA runtime's error string for the launch.
#pragma once

#include <cstdint>

#include "trainer/model/fused_elementwise.h"
#include "trainer/model/fused_softmax.h"

namespace meshwork::model::fused {

enum class ElementType { kFloat, kDouble, kBFloat16, kHalf };

const char* LaunchSwiGluForward(ElementType type, int64_t rows, int64_t f, const void* gate_up, void* out,
                                void* stream);
const char* LaunchSwiGluBackward(ElementType type, int64_t rows, int64_t f, const void* gate_up,
                                 const void* grad_out, void* grad_gate_up, void* stream);
const char* LaunchRopeForward(ElementType type, int64_t batch, const RopeShape& shape, const void* x,
                              const void* cos, const void* sin, void* out, void* stream);
const char* LaunchRopeBackward(ElementType type, int64_t batch, const RopeShape& shape, const void* grad_out,
                               const void* cos, const void* sin, void* grad_x, void* stream);

// logits [rows, vocab] (contiguous) become softmax - onehot(targets) in place; lse and
// target_logit [rows] (the arithmetic type) receive each row's log-sum-exp and target logit.
const char* LaunchSoftmaxGradient(ElementType type, int64_t rows, int64_t vocab, void* logits, const int64_t* targets,
                                  void* lse, void* target_logit, void* stream);

}  // namespace meshwork::model::fused
