// tests/cuda/emu_test_support.hpp — helpers of the emulator's own tests (test_emulator*.cpp):
// a device array with host copies, and the check that a launch failed with a recorded fault.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include <cuda_runtime.h>

namespace emu_test {

template <class T>
struct DeviceArray {
  T* p = nullptr;
  std::size_t n = 0;
  explicit DeviceArray(std::size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void put(const std::vector<T>& h) {
    ASSERT_EQ(h.size(), n);
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
};

/// Expects the launch just made to have failed with a fault whose message contains `what`,
/// and consumes the fault (so the fault check at exit sees only unexpected ones).
inline ::testing::AssertionResult launch_failed_with(const std::string& what, long long faults_before) {
  const cudaError_t e = cudaGetLastError();
  cudaDeviceSynchronize();  // consume the pending fault (which also sets the last error again)
  cudaGetLastError();
  if (e != cudaErrorLaunchFailure)
    return ::testing::AssertionFailure() << "expected cudaErrorLaunchFailure, got " << cudaGetErrorName(e);
  if (oasis_emu::fault_count() != faults_before + 1)
    return ::testing::AssertionFailure() << "fault count " << oasis_emu::fault_count() << ", expected "
                                         << faults_before + 1;
  if (oasis_emu::last_fault().find(what) == std::string::npos)
    return ::testing::AssertionFailure() << "fault message '" << oasis_emu::last_fault() << "' lacks '" << what
                                         << "'";
  return ::testing::AssertionSuccess();
}

}  // namespace emu_test
