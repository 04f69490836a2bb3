// src/cuda/attention_dispatch.cpp — the attention kernel choice (KernelOptions, kernel_choice) and
// the launch of the chosen kernel; see attention_dispatch.hpp and docs/cuda.md, "Choosing a
// kernel".
#include "attention_dispatch.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>

#include "device_util.hpp"

namespace oasis::cuda {

const char* to_string(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::automatic: return "automatic";
    case AttentionKernel::fused: return "fused";
    case AttentionKernel::split_keys: return "split_keys";
    case AttentionKernel::tensor_cores: return "tensor_cores";
  }
  return "unknown";
}

namespace detail {
namespace {

constexpr int kMaxKeySplits = 1024;
constexpr index_t kMinKeysPerWarp = 64;  // a split's warp streams at least this many keys

/// Streaming multiprocessors of the current device, queried once per device (1 without one).
int multiprocessors() {
  static std::atomic<int> cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return 1;
  }
  int n = cached[dev].load();
  if (n == 0) {
    cudaDeviceProp prop{};
    n = cudaGetDeviceProperties(&prop, dev) == cudaSuccess && prop.multiProcessorCount > 0 ? prop.multiProcessorCount
                                                                                            : 1;
    cudaGetLastError();
    cached[dev].store(n);
  }
  return n;
}

index_t row_groups(const AttentionShape& s) { return (s.H / s.H_kv * s.Tq + kSplitRows - 1) / kSplitRows; }

int heuristic_splits(const AttentionShape& s) {
  const index_t units = s.B * s.H_kv * row_groups(s);
  // 16 blocks of 4 warps per SM: several waves of the 4 blocks an SM holds, so the last one is short
  const index_t target = 16 * static_cast<index_t>(multiprocessors());
  const index_t most = std::max<index_t>(1, (s.Tk + kSplitWarps * kMinKeysPerWarp - 1) / (kSplitWarps * kMinKeysPerWarp));
  return static_cast<int>(std::clamp<index_t>((target + units - 1) / units, 1, std::min<index_t>(most, kMaxKeySplits)));
}

}  // namespace

KernelChoice resolve_kernel(const AttentionShape& s, io::DType type, const MaskFeatures& f, const KernelOptions& k) {
  OASIS_REQUIRE(k.key_splits >= 0 && k.key_splits <= kMaxKeySplits, "key_splits", "must be in [0, ", kMaxKeySplits,
                "] (0: the heuristic's count), got ", k.key_splits);
  OASIS_REQUIRE(k.key_splits == 0 || k.kernel == AttentionKernel::split_keys, "key_splits",
                "is set (", k.key_splits, ") but the kernel is ", to_string(k.kernel), ", not split_keys");
  OASIS_REQUIRE(k.kernel != AttentionKernel::tensor_cores || type == io::DType::f16 || type == io::DType::bf16,
                "kernel", "tensor_cores takes float16 or bfloat16 inputs, got ", io::to_string(type));
  // Both layouts are strides of the launch, which every kernel addresses by.
  const bool plain = f.window == 0 && !f.bias;
  if (k.kernel == AttentionKernel::split_keys || k.kernel == AttentionKernel::tensor_cores) {
    const char* name = to_string(k.kernel);
    OASIS_REQUIRE(f.window == 0, "window", "the ", name, " kernel does not implement a sliding window");
    OASIS_REQUIRE(!f.bias, "bias", "the ", name, " kernel does not implement an additive bias");
  }
  KernelOptions resolved = k;
  if (k.kernel == AttentionKernel::automatic) resolved.kernel = plain ? kernel_choice(s).kernel : AttentionKernel::fused;
  if (resolved.kernel != AttentionKernel::split_keys) return KernelChoice{resolved.kernel, 0};
  return KernelChoice{AttentionKernel::split_keys, k.key_splits > 0 ? k.key_splits : heuristic_splits(s)};
}

SplitLaunch split_plan(const AttentionLaunch& a, int splits) {
  SplitLaunch sp;
  sp.splits = splits;
  const long long parts = static_cast<long long>(splits) * kSplitWarps;
  sp.keys_per_warp = static_cast<int>(std::max<long long>(1, (a.Tk + parts - 1) / parts));
  return sp;
}

std::size_t split_workspace_floats(const AttentionLaunch& a, const SplitLaunch& s) {
  const std::size_t rows = static_cast<std::size_t>(a.B) * static_cast<std::size_t>(a.H) * static_cast<std::size_t>(a.Tq);
  return rows * static_cast<std::size_t>(s.splits) * (2 + static_cast<std::size_t>(a.d_v));
}

void launch_chosen(const AttentionLaunch& a, const KernelChoice& c, CUstream_st* stream) {
  switch (c.kernel) {
    case AttentionKernel::automatic:
    case AttentionKernel::fused: check(launch_attention(a, stream), "fused attention launch"); return;
    case AttentionKernel::tensor_cores: check(launch_attention_tc(a, stream), "tensor-core attention launch"); return;
    case AttentionKernel::split_keys: break;
  }
  SplitLaunch sp = split_plan(a, c.key_splits);
  const std::size_t rows = static_cast<std::size_t>(a.B) * static_cast<std::size_t>(a.H) * static_cast<std::size_t>(a.Tq);
  const std::size_t slots = rows * static_cast<std::size_t>(sp.splits);
  void* ws = nullptr;
  check(cudaMallocAsync(&ws, split_workspace_floats(a, sp) * sizeof(float), stream), "cudaMallocAsync (split-K workspace)");
  sp.part_m = static_cast<float*>(ws);
  sp.part_l = sp.part_m + slots;
  sp.part_o = sp.part_l + slots;
  int e = launch_attention_split_partials(a, sp, stream);
  if (e == 0) e = launch_attention_split_combine(a, sp, stream);
  cudaFreeAsync(ws, stream);
  check(e, "split-K attention launch");
}

}  // namespace detail

KernelChoice kernel_choice(const AttentionShape& s, const KernelOptions& opt) {
  OASIS_REQUIRE(s.B > 0 && s.H > 0 && s.H_kv > 0 && s.H % s.H_kv == 0 && s.Tq > 0 && s.Tk > 0, "shape",
                "not a valid attention shape (positive sizes, H_kv dividing H)");
  if (opt.kernel != AttentionKernel::automatic)
    return KernelChoice{opt.kernel, opt.kernel == AttentionKernel::split_keys
                                        ? (opt.key_splits > 0 ? opt.key_splits : detail::heuristic_splits(s))
                                        : 0};
  // Few query rows per kv head: the fused kernel would run one mostly idle block per (b, h) over
  // every key; split-K reads each key once per group of 4 rows and spreads the keys over the device.
  if (s.H / s.H_kv * s.Tq <= 4 * detail::kSplitRows && s.Tk >= detail::kSplitWarps * detail::kMinKeysPerWarp)
    return KernelChoice{AttentionKernel::split_keys, detail::heuristic_splits(s)};
  return KernelChoice{AttentionKernel::fused, 0};
}

}  // namespace oasis::cuda
