// meshwork-launch: the command each trainer pod runs; starts --nproc local ranks of COMMAND.
#include <iostream>
#include <string>
#include <vector>

#include "trainer/launch/launcher.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  meshwork::Result<meshwork::launch::LaunchOptions> options =
      meshwork::launch::ParseLaunchArgs(args);
  if (!options.ok()) {
    std::cerr << "meshwork-launch: " << options.status().ToString() << "\n";
    return meshwork::ExitCodeFor(options.status().code());
  }
  return meshwork::launch::RunLauncher(*options, std::cerr);
}
