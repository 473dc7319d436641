#pragma once
// For the e2e tests: starts argv[0] (a path) as a child whose stdout and stderr go to `log`, and
// which dies with the test (PR_SET_PDEATHSIG). Returns its pid (-1 if fork failed); the caller
// waits for it. Exit status 126: the log could not be opened; 127: the program could not start.
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace arlo::e2e {

inline pid_t spawn_logged(const std::vector<std::string>& args, const std::filesystem::path& log) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::FILE* f = std::fopen(log.c_str(), "w");
  if (!f) ::_exit(126);
  ::dup2(::fileno(f), 1);
  ::dup2(::fileno(f), 2);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  ::_exit(127);
}

}  // namespace arlo::e2e
