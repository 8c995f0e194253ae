// Tests that run ranks over the Gloo communicator skip, saying why, in a build without it: the
// CUDA flavor's libtorch (PyPI's wheel) has no Gloo headers, so CMake builds it with Gloo OFF
// (cmake/torch.cmake). Such a suite derives its fixture from NeedsGloo.
#pragma once

#include <gtest/gtest.h>

namespace meshwork::testing {

#ifdef MESHWORK_HAVE_GLOO
inline constexpr bool kHaveGloo = true;
#else
inline constexpr bool kHaveGloo = false;
#endif

template <typename Base = ::testing::Test>
class NeedsGloo : public Base {
 protected:
  void SetUp() override {
    if (!kHaveGloo) {
      GTEST_SKIP() << "no Gloo communicator in this build: its libtorch has no Gloo headers (the pip wheel "
                      "of the CUDA flavor), so CMake configured MESHWORK_WITH_GLOO off";
    }
  }
};

}  // namespace meshwork::testing
