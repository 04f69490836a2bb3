// verify/figures_cmd.hpp — `oasis-verify figures MODEL TRACE --out DIR` (figures_cmd.cpp).
#pragma once

#include <string>
#include <vector>

namespace oasis::verify {

/// Runs the subcommand on its arguments; the exit status (0 written, 2 usage or input error).
int cmd_figures(const std::vector<std::string>& args);

}  // namespace oasis::verify
