// The CUDA emulator under AddressSanitizer (test_cuda_emu_asan): a kernel that reads one element
// past its input is stopped by ASan at the read, so the instrumented emulated runs of the parity
// and device tests (same program) show the kernels stay inside their buffers.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include "kernel_launch.hpp"

namespace {

__global__ void read_past_end_kernel(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i + 1];  // off by one: the last thread reads in[n]
}

void launch_reading_past_the_end() {
  const int n = 100;
  float *in = nullptr, *out = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&in), n * sizeof(float));
  cudaMalloc(reinterpret_cast<void**>(&out), n * sizeof(float));
  OASIS_LAUNCH(1, 128, nullptr, read_past_end_kernel)(in, out, n);
  cudaFree(in);
  cudaFree(out);
}

TEST(CudaEmulatorAsan, OutOfBoundsReadInAKernelIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(launch_reading_past_the_end(), "heap-buffer-overflow");
}

}  // namespace
