// The CUDA emulator itself (src/cuda/emu): the guarantees the CUDA tests rely on when they run
// without a GPU. Each kernel here is a small CUDA kernel compiled as host code; a correct kernel
// must give the device's answer, and each kind of misuse must be reported, not silently pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "emu_test_support.hpp"
#include "kernel_launch.hpp"
#include "launch.hpp"

namespace {

constexpr unsigned kFull = 0xffffffffu;

using emu_test::DeviceArray;
using emu_test::launch_failed_with;

// --- kernels -----------------------------------------------------------------------------------------

/// out[b * n + t] = in[b * n + (t + 1) % n] through shared memory (barrier between write and read).
__global__ void rotate_kernel(const int* in, int* out, bool sync) {
  __shared__ int s[256];
  const int t = threadIdx.x, n = blockDim.x, b = blockIdx.x;
  s[t] = in[b * n + t];
  if (sync) __syncthreads();
  out[b * n + t] = s[(t + 1) % n];
}

/// out[t] = in[t - 1] through shared memory without the barrier (out[0] = in[0]).
__global__ void shift_back_racy_kernel(const int* in, int* out) {
  __shared__ int s[256];
  const int t = threadIdx.x;
  s[t] = in[t];
  out[t] = t > 0 ? s[t - 1] : in[0];  // a __syncthreads() is missing before this read
}

/// Sum and maximum of the warp by butterfly shuffles, and a broadcast of lane 5.
__global__ void warp_kernel(const float* in, float* sum, float* mx, float* bcast) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float s = in[i], m = in[i];
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(kFull, s, o);
    m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  }
  sum[i] = s;
  mx[i] = m;
  bcast[i] = __shfl_sync(kFull, in[i], 5);
}

/// Warp and lane order of a 3-D block (x fastest): lane 0's linear id and the neighbour's.
__global__ void warp_order_kernel(int* out) {
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[tid] = __shfl_sync(kFull, tid, 0) + 1000 * __shfl_xor_sync(kFull, tid, 1);
}

/// A half-warp shuffle (lanes 0-15, mask 0xffff), then a full-warp one: legal since sm_70.
__global__ void partial_then_full_kernel(int* out) {
  const int lane = threadIdx.x;
  int v = lane;
  if (lane < 16) v = __shfl_sync(0x0000ffffu, v, 15 - lane);
  out[lane] = __shfl_sync(kFull, v, (lane + 1) % 32);
}

/// Two half-warps shuffle concurrently with disjoint masks.
__global__ void disjoint_masks_kernel(int* out) {
  const int lane = threadIdx.x;
  int v = lane;
  if (lane < 16)
    v = __shfl_sync(0x0000ffffu, v, lane ^ 1);
  else
    v = __shfl_sync(0xffff0000u, v, 47 - lane);
  out[lane] = v;
}

/// Shuffles within segments of 16 lanes.
__global__ void width16_kernel(int* idx, int* xor16, int* xor1) {
  const int lane = threadIdx.x;
  idx[lane] = __shfl_sync(kFull, lane, 3, 16);
  xor16[lane] = __shfl_xor_sync(kFull, lane, 16, 16);
  xor1[lane] = __shfl_xor_sync(kFull, lane, 1, 16);
}

/// Accumulates into shared memory it never initialised.
__global__ void uninitialised_shared_kernel(int* out) {
  __shared__ int acc[64];
  acc[threadIdx.x] += 1;
  __syncthreads();
  out[threadIdx.x] = acc[threadIdx.x];
}

/// The same in a template kernel (GCC ignores section attributes on the statics of templates, so
/// the emulator finds shared memory through the symbol table).
template <int N>
__global__ void uninitialised_shared_template_kernel(int* out) {
  __shared__ int acc[N];
  acc[threadIdx.x] += 1;
  __syncthreads();
  out[threadIdx.x] = acc[threadIdx.x];
}

/// out = x0 * x1 + x2, written without fmaf.
__global__ void multiply_add_kernel(const float* x, float* out) { out[0] = x[0] * x[1] + x[2]; }

/// Block 0 publishes a value that the other blocks read without a grid-wide synchronisation.
__global__ void cross_block_racy_kernel(int* buf) {
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) buf[0] = 42;
  } else if (threadIdx.x == 0) {
    buf[blockIdx.x] = buf[0];
  }
}

__global__ void throwing_kernel(int* out) {
  if (threadIdx.x == 7) throw std::runtime_error("thrown in device code");
  out[threadIdx.x] = 1;
}

/// __syncthreads reached by half of the block only.
__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x % 2 == 0) __syncthreads();
  out[threadIdx.x] = 1;
}

/// Lanes >= 16 leave before a full-mask shuffle.
__global__ void early_exit_shuffle_kernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(kFull, 1.0f, 1);
}

/// Writes one element past the end of its output.
__global__ void overrun_kernel(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) out[i] = 1.0f;  // off by one
}

__global__ void write_kernel(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(i);
}

/// Built-in variables of a 3-D launch: out[linear thread id] = encoded (block, thread) indices.
__global__ void index_kernel(int* out) {
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int nthreads = blockDim.x * blockDim.y * blockDim.z;
  out[bid * nthreads + tid] = bid * 1000 + tid;
}

// --- tests -------------------------------------------------------------------------------------------

TEST(CudaEmulator, IsTheDeviceOfThisBuild) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 1);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_NE(std::string(prop.name).find("emulator"), std::string::npos);
}

TEST(CudaEmulator, BuiltInVariablesCoverA3dGrid) {
  const dim3 grid(3, 2, 2), block(4, 2, 3);
  const int nb = 12, nt = 24;
  DeviceArray<int> out(static_cast<std::size_t>(nb * nt));
  OASIS_LAUNCH(grid, block, nullptr, index_kernel)(out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> h = out.get();
  for (int b = 0; b < nb; ++b)
    for (int t = 0; t < nt; ++t) ASSERT_EQ(h[static_cast<std::size_t>(b * nt + t)], b * 1000 + t);
}

TEST(CudaEmulator, WarpsAndLanesFollowTheLinearThreadIdXFastest) {
  const dim3 block(8, 4, 2);
  DeviceArray<int> out(64);
  OASIS_LAUNCH(1, block, nullptr, warp_order_kernel)(out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> h = out.get();
  for (int t = 0; t < 64; ++t) EXPECT_EQ(h[static_cast<std::size_t>(t)], (t / 32) * 32 + 1000 * (t ^ 1)) << t;
}

TEST(CudaEmulator, SyncthreadsOrdersSharedMemory) {
  const int n = 128, blocks = 3;
  std::vector<int> in(static_cast<std::size_t>(n * blocks));
  std::iota(in.begin(), in.end(), 7);
  DeviceArray<int> din(in.size()), dout(in.size());
  din.put(in);
  OASIS_LAUNCH(blocks, n, nullptr, rotate_kernel)(din.p, dout.p, true);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> out = dout.get();
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < n; ++t)
      ASSERT_EQ(out[static_cast<std::size_t>(b * n + t)], in[static_cast<std::size_t>(b * n + (t + 1) % n)]);
}

// A missing __syncthreads is a race on the device; the emulator runs each thread as far as it can
// before the next one starts, so the first thread reads its neighbour's slot before it is written.
TEST(CudaEmulator, MissingSyncthreadsGivesWrongResults) {
  const int n = 128;
  std::vector<int> in(static_cast<std::size_t>(n));
  std::iota(in.begin(), in.end(), 1000);
  DeviceArray<int> din(in.size()), dout(in.size());
  din.put(in);
  OASIS_LAUNCH(1, n, nullptr, rotate_kernel)(din.p, dout.p, false);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> out = dout.get();
  int wrong = 0;
  for (int t = 0; t < n; ++t) wrong += out[static_cast<std::size_t>(t)] != in[static_cast<std::size_t>((t + 1) % n)];
  EXPECT_GT(wrong, 0) << "the race went unnoticed";
}

/// Restores the schedule in force at construction (tests that change it leave it as they found
/// it, even when an assertion returns early).
struct RestoreSchedule {
  oasis_emu::Schedule initial = oasis_emu::schedule();
  ~RestoreSchedule() { oasis_emu::set_schedule(initial); }
};

// The opposite race (reading what an earlier thread wrote) passes under the forward order and is
// exposed by the reverse and random orders, which is why ctest also runs the CUDA tests under both
// (emu.schedule.*).
TEST(CudaEmulator, ScheduleOrdersExposeRacesTheForwardOrderHides) {
  const int n = 128;
  int base = 5000;
  auto wrong_under = [&](oasis_emu::Schedule order) {
    // Fresh values each run: stale shared memory from the previous run cannot look right.
    std::vector<int> in(static_cast<std::size_t>(n));
    std::iota(in.begin(), in.end(), base += 1000);
    DeviceArray<int> din(in.size()), dout(in.size());
    din.put(in);
    oasis_emu::set_schedule(order, 7);
    OASIS_LAUNCH(1, n, nullptr, shift_back_racy_kernel)(din.p, dout.p);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    const std::vector<int> out = dout.get();
    int wrong = 0;
    for (int t = 1; t < n; ++t) wrong += out[static_cast<std::size_t>(t)] != in[static_cast<std::size_t>(t - 1)];
    return wrong;
  };
  const RestoreSchedule restore;
  EXPECT_EQ(wrong_under(oasis_emu::Schedule::forward), 0);
  EXPECT_GT(wrong_under(oasis_emu::Schedule::reverse), 0);
  EXPECT_GT(wrong_under(oasis_emu::Schedule::random), 0);
}

TEST(CudaEmulator, WarpShufflesReduceAndBroadcast) {
  const int n = 64;
  std::vector<float> in(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(i)] = static_cast<float>((i * 37) % 64) - 20.0f;
  DeviceArray<float> din(in.size()), sum(in.size()), mx(in.size()), bc(in.size());
  din.put(in);
  OASIS_LAUNCH(1, n, nullptr, warp_kernel)(din.p, sum.p, mx.p, bc.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> s = sum.get(), m = mx.get(), b = bc.get();
  for (int w = 0; w < 2; ++w) {
    float want_s = 0.0f, want_m = -INFINITY;
    for (int l = 0; l < 32; ++l) {  // integer-valued: the sum is exact in any order
      want_s += in[static_cast<std::size_t>(w * 32 + l)];
      want_m = std::max(want_m, in[static_cast<std::size_t>(w * 32 + l)]);
    }
    for (int l = 0; l < 32; ++l) {
      const auto i = static_cast<std::size_t>(w * 32 + l);
      EXPECT_EQ(s[i], want_s);
      EXPECT_EQ(m[i], want_m);
      EXPECT_EQ(b[i], in[static_cast<std::size_t>(w * 32 + 5)]);
    }
  }
}

/// Runs `body` under each schedule and restores the initial one.
template <class F>
void under_every_schedule(F body) {
  const RestoreSchedule restore;
  for (const auto order : {oasis_emu::Schedule::forward, oasis_emu::Schedule::reverse, oasis_emu::Schedule::random}) {
    oasis_emu::set_schedule(order, 11);
    SCOPED_TRACE(static_cast<int>(order));
    body();
  }
}

TEST(CudaEmulator, PartialAndDisjointMaskShufflesUnderEverySchedule) {
  under_every_schedule([] {
    DeviceArray<int> a(32), b(32);
    OASIS_LAUNCH(1, 32, nullptr, partial_then_full_kernel)(a.p);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    OASIS_LAUNCH(1, 32, nullptr, disjoint_masks_kernel)(b.p);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const std::vector<int> ha = a.get(), hb = b.get();
    for (int l = 0; l < 32; ++l) {
      const int n = (l + 1) % 32;
      EXPECT_EQ(ha[static_cast<std::size_t>(l)], n < 16 ? 15 - n : n) << l;
      EXPECT_EQ(hb[static_cast<std::size_t>(l)], l < 16 ? l ^ 1 : 47 - l) << l;
    }
  });
}

// width < 32: __shfl_sync reads within the lane's segment; __shfl_xor_sync reads a lane of an
// earlier segment but gives the lane's own value for a later one (PTX shfl.bfly).
TEST(CudaEmulator, ShufflesWithinSegmentsOfSixteenLanes) {
  DeviceArray<int> idx(32), x16(32), x1(32);
  OASIS_LAUNCH(1, 32, nullptr, width16_kernel)(idx.p, x16.p, x1.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> a = idx.get(), b = x16.get(), c = x1.get();
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(a[static_cast<std::size_t>(l)], l < 16 ? 3 : 19) << l;
    EXPECT_EQ(b[static_cast<std::size_t>(l)], l < 16 ? l : l - 16) << l;
    EXPECT_EQ(c[static_cast<std::size_t>(l)], l ^ 1) << l;
  }
}

// Shared memory is undefined when a block starts: the emulator fills it with 0xFF bytes (-1 as
// int) before every block, so a kernel that never initialises it cannot count from 0.
TEST(CudaEmulator, SharedMemoryStartsUndefinedInEveryBlock) {
  for (int launch = 0; launch < 2; ++launch) {
    DeviceArray<int> out(64);
    OASIS_LAUNCH(1, 64, nullptr, uninitialised_shared_kernel)(out.p);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    for (const int v : out.get()) EXPECT_EQ(v, 0) << "launch " << launch << ": shared memory was not refilled";
  }
}

TEST(CudaEmulator, SharedMemoryOfTemplateKernelsStartsUndefinedInEveryBlock) {
  for (int launch = 0; launch < 2; ++launch) {
    DeviceArray<int> out(64);
    OASIS_LAUNCH(2, 64, nullptr, uninitialised_shared_template_kernel<64>)(out.p);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    for (const int v : out.get()) EXPECT_EQ(v, 0) << "launch " << launch << ": shared memory was not refilled";
  }
}

// The kernels' arithmetic rounds as the device build's: nvcc compiles the kernels with
// --fmad=false (OASIS_NVCC_FLAGS, CMakeLists.txt) and the emulator without contraction, so
// x0 * x1 + x2 is two roundings on both, and only an explicit fmaf fuses.
TEST(CudaEmulator, MultiplyAddRoundsTwiceAsInTheDeviceBuild) {
  // x0 * x1 = 1 + 2^-11 + 2^-24 exactly; rounded to float it ties to the even 1 + 2^-11, so the
  // two-rounding result is 0 and the fused one 2^-24.
  const float e = std::ldexp(1.0f, -12);
  const std::vector<float> x{1.0f + e, 1.0f + e, -(1.0f + 2 * e)};
  ASSERT_EQ(std::fma(x[0], x[1], x[2]), std::ldexp(1.0f, -24));
  DeviceArray<float> dx(3), out(1);
  dx.put(x);
  OASIS_LAUNCH(1, 1, nullptr, multiply_add_kernel)(dx.p, out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out.get()[0], 0.0f) << "the emulator contracted a * b + c into an FMA";
  EXPECT_NE(std::string(OASIS_NVCC_FLAGS_STRING).find("--fmad=false"), std::string::npos)
      << "the device build (OASIS_NVCC_FLAGS = '" << OASIS_NVCC_FLAGS_STRING << "') contracts a * b + c";
}

// Blocks run one after another; the reverse and random orders expose a block that reads what
// another block writes without a grid-wide synchronisation.
TEST(CudaEmulator, ReverseBlockOrderExposesACrossBlockRace) {
  const RestoreSchedule restore;
  auto stale_reads = [](oasis_emu::Schedule order) {
    oasis_emu::set_schedule(order, 5);
    DeviceArray<int> buf(8);
    OASIS_LAUNCH(8, 32, nullptr, cross_block_racy_kernel)(buf.p);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    int stale = 0;
    const std::vector<int> h = buf.get();
    for (int b = 1; b < 8; ++b) stale += h[static_cast<std::size_t>(b)] != 42;
    return stale;
  };
  EXPECT_EQ(stale_reads(oasis_emu::Schedule::forward), 0);
  EXPECT_EQ(stale_reads(oasis_emu::Schedule::reverse), 7);
  EXPECT_GT(stale_reads(oasis_emu::Schedule::random), 0);
}

TEST(CudaEmulator, ExceptionInDeviceCodeIsReported) {
  DeviceArray<int> out(32);
  const long long before = oasis_emu::fault_count();
  OASIS_LAUNCH(1, 32, nullptr, throwing_kernel)(out.p);
  EXPECT_TRUE(launch_failed_with("thrown in device code", before));
  EXPECT_NE(oasis_emu::last_fault().find("thread (7,0,0)"), std::string::npos) << oasis_emu::last_fault();
}

TEST(CudaEmulator, HostPointerKernelArgumentIsReported) {
  std::vector<float> host(16);
  const long long before = oasis_emu::fault_count();
  OASIS_LAUNCH(1, 32, nullptr, write_kernel)(host.data(), 16);
  EXPECT_TRUE(launch_failed_with("kernel argument 0", before));
  for (const float v : host) EXPECT_EQ(v, 0.0f);  // not run
}

/// Expects a launcher's status to be a launch fault naming a struct member, and consumes it.
::testing::AssertionResult launcher_failed_on_member(int status, long long faults_before) {
  const bool failed = status == cudaErrorLaunchFailure;
  cudaDeviceSynchronize();
  cudaGetLastError();
  if (!failed) return ::testing::AssertionFailure() << "the launch ran (status " << status << ")";
  if (oasis_emu::fault_count() != faults_before + 1)
    return ::testing::AssertionFailure() << "fault count " << oasis_emu::fault_count();
  if (oasis_emu::last_fault().find("member") == std::string::npos)
    return ::testing::AssertionFailure() << "fault message '" << oasis_emu::last_fault() << "' names no member";
  return ::testing::AssertionSuccess();
}

// The backend's kernels take launch structs by value; a host pointer inside one is reported as
// for a plain pointer argument (on the emulator the kernel would silently read host memory).
TEST(CudaEmulator, HostPointerInsideALaunchStructIsReported) {
  namespace cd = oasis::cuda::detail;
  const int d = 8;
  DeviceArray<float> q(d), k(d), v(d), out(d), lse(1), pn(1);
  std::vector<float> host(d, 1.0f);
  cd::AttentionLaunch a;
  a.q = q.p; a.k = k.p; a.v = v.p;
  a.B = a.H = a.H_kv = a.Tq = a.Tk = 1;
  a.d_h = a.d_v = d;
  a.q_st = a.k_st = a.v_st = a.o_st = d;
  a.out = out.p; a.lse = lse.p; a.p_null = pn.p;
  q.put(host);
  k.put(host);
  v.put(host);
  ASSERT_EQ(cd::launch_attention(a, nullptr), 0);  // device memory only: runs
  cd::AttentionLaunch bad = a;
  bad.k = host.data();
  long long before = oasis_emu::fault_count();
  EXPECT_TRUE(launcher_failed_on_member(cd::launch_attention(bad, nullptr), before));
  bad = a;
  bad.p_null = host.data();
  before = oasis_emu::fault_count();
  EXPECT_TRUE(launcher_failed_on_member(cd::launch_attention(bad, nullptr), before));

  DeviceArray<float> g_old(d), psi(d), g(d), dpsi(d), alpha(d), an(1);
  cd::DepthLaunch r;
  r.n = d;
  r.N = 1;
  r.g_old = g_old.p; r.psi = psi.p;
  r.g = g.p; r.dpsi = dpsi.p; r.alpha = host.data(); r.alpha_null = an.p;
  before = oasis_emu::fault_count();
  EXPECT_TRUE(launcher_failed_on_member(cd::launch_depth_weights(r, nullptr), before));
}

TEST(CudaEmulator, BarrierThatSomeThreadsSkipIsReported) {
  DeviceArray<int> out(64);
  const long long before = oasis_emu::fault_count();
  OASIS_LAUNCH(1, 64, nullptr, divergent_barrier_kernel)(out.p);
  EXPECT_TRUE(launch_failed_with("divergent_barrier_kernel", before));
  EXPECT_NE(oasis_emu::last_fault().find("__syncthreads"), std::string::npos) << oasis_emu::last_fault();
}

TEST(CudaEmulator, ShuffleWithExitedLanesIsReported) {
  DeviceArray<float> out(32);
  const long long before = oasis_emu::fault_count();
  OASIS_LAUNCH(1, 32, nullptr, early_exit_shuffle_kernel)(out.p);
  EXPECT_TRUE(launch_failed_with("warp collective", before));
}

TEST(CudaEmulator, WritePastAnAllocationIsReportedAtFree) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer the allocation has no guard bytes and ASan reports the write itself "
                  "(that report is the death test of test_emulator_asan.cpp)";
#endif
  const int n = 100;
  float* p = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)), cudaSuccess);
  OASIS_LAUNCH(1, 128, nullptr, overrun_kernel)(p, n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const long long before = oasis_emu::fault_count();
  EXPECT_EQ(cudaFree(p), cudaErrorIllegalAddress);
  EXPECT_EQ(oasis_emu::fault_count(), before + 1);
  EXPECT_NE(oasis_emu::last_fault().find("outside an allocation"), std::string::npos) << oasis_emu::last_fault();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);  // reported once by the next sync
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaEmulator, UnwrittenDeviceMemoryReadsAsNaN) {
  DeviceArray<float> out(100);
  OASIS_LAUNCH(1, 128, nullptr, write_kernel)(out.p, 90);  // leaves the last 10 unwritten
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> h = out.get();
  for (int i = 0; i < 90; ++i) EXPECT_EQ(h[static_cast<std::size_t>(i)], static_cast<float>(i));
  for (int i = 90; i < 100; ++i) EXPECT_TRUE(std::isnan(h[static_cast<std::size_t>(i)])) << i;
}

TEST(CudaEmulator, InvalidLaunchConfigurationsAreRejected) {
  DeviceArray<float> out(1);
  OASIS_LAUNCH(dim3(1, 65536), 32, nullptr, write_kernel)(out.p, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  OASIS_LAUNCH(1, 2048, nullptr, write_kernel)(out.p, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  OASIS_LAUNCH(0, 32, nullptr, write_kernel)(out.p, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  OASIS_LAUNCH(1, dim3(1, 1, 65), nullptr, write_kernel)(out.p, 0);  // block z <= 64
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  OASIS_LAUNCH(dim3(2147483648u), 32, nullptr, write_kernel)(out.p, 0);  // grid x <= 2^31 - 1
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cleared by the read
}

TEST(CudaEmulator, CopiesOutsideAnAllocationAreRejected) {
  DeviceArray<float> d(10);
  std::vector<float> h(11, 1.0f);
  EXPECT_EQ(cudaMemcpy(d.p, h.data(), 11 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), d.p + 1, 10 * sizeof(float), cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), h.data() + 1, 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);  // host as device
  EXPECT_EQ(cudaMemset(d.p + 5, 0, 6 * sizeof(float)), cudaErrorInvalidValue);
  DeviceArray<float> e(10);
  EXPECT_EQ(cudaMemcpy(e.p, d.p, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // device memory as host
  EXPECT_EQ(cudaMemcpy(e.p, d.p, 4, cudaMemcpyDeviceToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d.p + 5, h.data(), 5 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  cudaGetLastError();
}

// SGEMM against the definition, for the four transpose combinations, with leading dimensions
// larger than the rows (integer-valued data: exact in float).
TEST(CudaEmulator, SgemmFollowsCublasColumnMajorSemantics) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const int m = 5, n = 4, k = 3, pad = 2;
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      const int ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
      const int lda = ra + pad, ldb = rb + pad, ldc = m + pad;
      std::vector<float> A(static_cast<std::size_t>(lda * ca)), B(static_cast<std::size_t>(ldb * cb)),
          C(static_cast<std::size_t>(ldc * n), 3.0f);
      for (std::size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
      for (std::size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
      DeviceArray<float> dA(A.size()), dB(B.size()), dC(C.size());
      dA.put(A);
      dB.put(B);
      dC.put(C);
      const float alpha = 2.0f, beta = -1.0f;
      ASSERT_EQ(cublasSgemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, dA.p,
                            lda, dB.p, ldb, &beta, dC.p, ldc),
                CUBLAS_STATUS_SUCCESS);
      const std::vector<float> got = dC.get();
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
          float want = 0.0f;
          for (int l = 0; l < k; ++l) {
            const float a = ta ? A[static_cast<std::size_t>(l + i * lda)] : A[static_cast<std::size_t>(i + l * lda)];
            const float b = tb ? B[static_cast<std::size_t>(j + l * ldb)] : B[static_cast<std::size_t>(l + j * ldb)];
            want += a * b;
          }
          EXPECT_EQ(got[static_cast<std::size_t>(i + j * ldc)], alpha * want + beta * 3.0f)
              << "ta " << ta << " tb " << tb << " (" << i << "," << j << ")";
        }
      for (int j = 0; j < n; ++j)  // padding rows of C untouched
        for (int i = m; i < ldc; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i + j * ldc)], 3.0f);
    }
  const float one = 1.0f, zero = 0.0f;
  DeviceArray<float> small(4);
  EXPECT_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, small.p, 1, small.p, 2, &zero, small.p, 2),
            CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  EXPECT_EQ(cublasSgemm(h, static_cast<cublasOperation_t>(7), CUBLAS_OP_N, 2, 2, 2, &one, small.p, 2, small.p, 2,
                        &zero, small.p, 2),
            CUBLAS_STATUS_INVALID_VALUE);  // not an operation
  const long long before = oasis_emu::fault_count();
  EXPECT_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, small.p, 2, small.p, 3, &zero, small.p, 2),
            CUBLAS_STATUS_EXECUTION_FAILED);  // A and B need 6 and 6 elements, the allocation has 4
  EXPECT_EQ(oasis_emu::fault_count(), before + 1);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  cudaGetLastError();
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

}  // namespace

// The faults provoked above are expected; emu_fault_check.cpp is not linked into this program.
