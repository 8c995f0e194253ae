// main() for the client transport tests. cpprestsdk's shared thread pool can hang in its static
// destructor at process exit after its SSL http_listener (tls_test.cpp's server) has run: seen
// once on a loaded machine, where TlsTest.TrustsTheConfiguredCaOnly printed OK and the process
// never exited. The verdict is complete when RUN_ALL_TESTS returns, so leave without running
// static destructors. (The listener is test-only; the client itself does not use it.)
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(rc);
}
