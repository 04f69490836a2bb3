// verify/fuzz_cmd.hpp — `oasis-verify fuzz OP --cmd 'PROGRAM {in} {out}'` (fuzz_cmd.cpp).
#pragma once

#include <string>
#include <vector>

namespace oasis::verify {

/// Runs the subcommand on its arguments; the exit status (0 every run passed, 1 a failure: a
/// wrong tensor, a crash or a hang, 2 usage or input error).
int cmd_fuzz(const std::vector<std::string>& args);

}  // namespace oasis::verify
