#pragma once
// What the session tests share: a run config with `overrides` applied (key=value, as on the command
// line), as `arlo run` would load it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"

namespace arlo::session::test {

inline config::Config load(std::vector<std::string> overrides) {
  config::LoadOptions o;
  o.overrides = std::move(overrides);
  auto c = config::load_string("run:\n  name: t\n", "<test>", o);
  EXPECT_TRUE(c) << c.error().what();
  return *c;
}

}  // namespace arlo::session::test
