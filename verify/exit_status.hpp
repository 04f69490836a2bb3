// verify/exit_status.hpp — the exit statuses of every oasis-verify subcommand (docs/verify.md):
// 0 everything passed, 1 a check or comparison failed, 2 usage or input error.
#pragma once

namespace oasis::verify {

constexpr int kOk = 0, kFailed = 1, kUsage = 2;

}  // namespace oasis::verify
