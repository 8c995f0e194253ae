#include "trainer/train/terminate.h"

#include <csignal>

namespace meshwork::train {
namespace {

// A signal handler reaches state only through a global; one TerminateSignal lives at a time.
volatile sig_atomic_t g_terminate = 0;

void Record(int) { g_terminate = 1; }

}  // namespace

struct TerminateSignal::Previous {
  struct sigaction action {};
};

std::unique_ptr<TerminateSignal> TerminateSignal::Install() {
  std::unique_ptr<TerminateSignal> t(new TerminateSignal());
  t->previous_ = std::make_unique<Previous>();
  g_terminate = 0;
  struct sigaction sa {};
  sa.sa_handler = Record;
  sigemptyset(&sa.sa_mask);
  // Interrupted reads and waits resume: the step finishes, and the ranks agree at its end.
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, &t->previous_->action);
  return t;
}

TerminateSignal::~TerminateSignal() {
  if (previous_) ::sigaction(SIGTERM, &previous_->action, nullptr);
}

bool TerminateSignal::received() const { return g_terminate != 0; }

}  // namespace meshwork::train
