// SIGTERM as "save and stop" (checkpoint.save_on_terminate): Kubernetes stops a Pod with SIGTERM
// and SIGKILL after its grace period, on a resize, a preemption, a drain or a gang restart. With
// checkpoints on, a trainer that got SIGTERM finishes the step it is in, every rank agrees at the
// step's end that one of them got it, and they save a checkpoint of that step and stop (exit
// 128 + SIGTERM, as a process killed by it), so the next gang resumes where this one stopped
// instead of at the last checkpoint.every step. A rank whose peer is gone cannot agree (the
// collective fails) and exits with that error, as before.
#pragma once

#include <memory>

namespace meshwork::train {

class TerminateSignal {
 public:
  // Records SIGTERM from now on (the previous handler comes back when the object goes).
  static std::unique_ptr<TerminateSignal> Install();
  ~TerminateSignal();
  TerminateSignal(const TerminateSignal&) = delete;
  TerminateSignal& operator=(const TerminateSignal&) = delete;

  bool received() const;

 private:
  TerminateSignal() = default;
  struct Previous;
  std::unique_ptr<Previous> previous_;
};

}  // namespace meshwork::train
