// Linked into every CUDA test built on the emulator: a device fault (a kernel that deadlocks or
// misuses a warp collective, a write past an allocation found at cudaFree, an SGEMM operand out of
// bounds) fails the test program even where the code under test ignored the error code.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

namespace {

class EmulatorFaultCheck : public ::testing::Environment {
 public:
  void TearDown() override {
    EXPECT_EQ(oasis_emu::fault_count(), 0) << "the CUDA emulator recorded device faults; the last: "
                                            << oasis_emu::last_fault();
  }
};

[[maybe_unused]] ::testing::Environment* const kFaultCheck =
    ::testing::AddGlobalTestEnvironment(new EmulatorFaultCheck);

}  // namespace
