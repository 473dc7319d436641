// arlo-reward-host --fd N: the child process arlo starts for a reward plugin configured with
// `isolate: process`. It loads the plugin named in the first frame on fd N and scores what arlo
// sends until arlo closes the connection (rollout/reward_process.h). Not meant to be run by hand.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "rollout/reward_process.h"

int main(int argc, char** argv) {
  int fd = -1;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--fd") == 0) fd = std::atoi(argv[i + 1]);
  if (fd < 0) {
    std::fprintf(stderr, "usage: arlo-reward-host --fd N (started by arlo for reward plugins with isolate: process)\n");
    return 2;
  }
  return arlo::rollout::serve_reward_host(fd);
}
