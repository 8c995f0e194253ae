// main() of the test binaries that use libtorch: GoogleTest's, after UseBestBlasKernel, so their
// matrix multiplies run the kernels the trainer runs (common/blas_kernel.h).
#include <gtest/gtest.h>

#include "common/blas_kernel.h"

int main(int argc, char** argv) {
  meshwork::UseBestBlasKernel(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
