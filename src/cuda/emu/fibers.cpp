// src/cuda/emu/fibers.cpp — the execution model of the CUDA emulator (cuda_runtime.h): a launch
// runs its blocks one after another; the threads of a block are fibers that the scheduler resumes
// in passes (forward, reverse or shuffled order), each running until it waits at a barrier or a
// warp collective, or exits. Barriers and collectives are resolved when their last participant
// arrives; misuse (a barrier after a thread exited, a collective naming an exited lane, a block
// whose threads all wait) is a device fault that stops the launch.
//
// Fibers switch with a few instructions on x86-64 (callee-saved registers, the stack pointer, the
// SSE and x87 control words: what the System V ABI asks a call to preserve) and with ucontext
// elsewhere. Launches are serialised by a mutex: the __shared__ arrays are statics, one per
// kernel, refilled with 0xFF bytes before every block (shared_memory.cpp).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "emulator.hpp"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// Under AddressSanitizer (the oasis_emu_asan build) every stack switch is announced, so that ASan
// knows which stack is live.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define OASIS_EMU_ASAN 1
#else
#define OASIS_EMU_ASAN 0
#endif

// --- context switch ---------------------------------------------------------------------------------

#if defined(__x86_64__)
// void oasis_emu_switch(void** save_sp, void* load_sp): saves the callee-saved state on the
// current stack, stores the stack pointer in *save_sp, and resumes the context saved at load_sp.
asm(R"(
  .pushsection .text
  .globl oasis_emu_switch
  .hidden oasis_emu_switch
  .type oasis_emu_switch, @function
oasis_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size oasis_emu_switch, .-oasis_emu_switch
  .popsection
)");
extern "C" void oasis_emu_switch(void** save_sp, void* load_sp);
#endif

namespace oasis_emu {

const ThreadContext* g_current = nullptr;

namespace {

std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

// --- fibers -------------------------------------------------------------------------------------

constexpr std::size_t kStackBytes = 256 * 1024;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxGridYZ = 65535;
constexpr unsigned long long kMaxGridX = 2147483647ull;
constexpr unsigned kFullWarp = 0xffffffffu;

enum class State { runnable, at_block_barrier, at_warp_barrier, finished };

struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr;  // lowest usable byte (a guard page lies below)
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
  ThreadContext ctx{};
  int warp = 0, lane = 0;
  State state = State::finished;
  std::uint64_t shuffle_result = 0;    // this lane's result of its last warp collective
  void* asan_fake_stack = nullptr;
};

/// One warp collective in progress: the lanes of `mask` arrive with their values and source
/// lanes; the last to arrive hands every lane its result. A whole-warp operation (wmma) is a
/// collective of the full mask whose lanes arrive with a pointer to their own data and a
/// description of the call, which every lane must give alike; the last to arrive runs it.
struct Collective {
  unsigned mask = 0, arrived = 0;
  std::uint64_t value[32] = {};
  int src[32] = {};
  const char* op_name = nullptr;  // null: a shuffle
  std::vector<unsigned char> op_call;
  void* op_data[32] = {};
};

struct Warp {
  unsigned live = 0;              // lanes that exist and have not exited
  std::vector<Collective> open;   // collectives waiting for lanes (one per mask)
};

struct Block {
  std::vector<Fiber>* fibers = nullptr;
  int nthreads = 0, live = 0, at_barrier = 0;
  std::vector<Warp> warps;
  bool fault = false;
  std::string fault_message;
};

struct Scheduler {
  std::vector<Fiber> fibers;  // stacks are kept from launch to launch
  Block block;
  Fiber* running = nullptr;
  void* sched_sp = nullptr;
#if !defined(__x86_64__)
  ucontext_t sched_uc;
#endif
  const std::function<void()>* body = nullptr;
  const char* kernel = "";                    // the running kernel's name, for messages
  const std::vector<ByteRange>* shared = nullptr;  // its __shared__ arrays
  Schedule order = Schedule::forward;
  std::mt19937 rng{1};
  void* asan_fake_stack = nullptr;           // the scheduler's, while a fiber runs
  const void* asan_stack_bottom = nullptr;   // the scheduler's stack, learnt at a fiber's first entry
  std::size_t asan_stack_size = 0;
  std::vector<int> pass;  // the order of one pass over the block's threads
};

Schedule schedule_from_environment(unsigned* seed) {
  const char* v = std::getenv("OASIS_EMU_SCHEDULE");
  const std::string s = v ? v : "";
  if (s == "reverse") return Schedule::reverse;
  if (s.rfind("random", 0) == 0) {
    if (s.size() > 7 && s[6] == ':') *seed = static_cast<unsigned>(std::strtoul(s.c_str() + 7, nullptr, 10));
    return Schedule::random;
  }
  return Schedule::forward;
}

Scheduler& sched() {
  static Scheduler s = [] {
    Scheduler init;
    unsigned seed = 1;
    init.order = schedule_from_environment(&seed);
    init.rng.seed(seed);
    return init;
  }();
  return s;
}

char* allocate_stack() {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  mprotect(p, page, PROT_NONE);  // a stack overflow faults instead of corrupting a neighbour
  return static_cast<char*>(p) + page;
}

/// From a fiber back to the scheduler; `final`: the fiber will never be resumed.
void switch_to_scheduler(Fiber* f, bool final = false) {
  Scheduler& s = sched();
#if OASIS_EMU_ASAN
  __sanitizer_start_switch_fiber(final ? nullptr : &f->asan_fake_stack, s.asan_stack_bottom, s.asan_stack_size);
#else
  (void)final;
#endif
#if defined(__x86_64__)
  oasis_emu_switch(&f->sp, s.sched_sp);
#else
  swapcontext(&f->uc, &s.sched_uc);
#endif
#if OASIS_EMU_ASAN
  __sanitizer_finish_switch_fiber(f->asan_fake_stack, nullptr, nullptr);
#endif
}

void resume(Fiber* f) {
  Scheduler& s = sched();
  s.running = f;
  g_current = &f->ctx;
#if OASIS_EMU_ASAN
  __sanitizer_start_switch_fiber(&s.asan_fake_stack, f->stack, kStackBytes);
#endif
#if defined(__x86_64__)
  oasis_emu_switch(&s.sched_sp, f->sp);
#else
  swapcontext(&s.sched_uc, &f->uc);
#endif
#if OASIS_EMU_ASAN
  __sanitizer_finish_switch_fiber(s.asan_fake_stack, nullptr, nullptr);
#endif
}

std::string where(const Fiber& f) {
  std::ostringstream o;
  o << "thread (" << f.ctx.thread_idx.x << "," << f.ctx.thread_idx.y << "," << f.ctx.thread_idx.z << ") of block ("
    << f.ctx.block_idx.x << "," << f.ctx.block_idx.y << "," << f.ctx.block_idx.z << ")";
  return o.str();
}

/// Stops the calling fiber for good: the block is abandoned and the launch reports the fault.
[[noreturn]] void device_fault(const std::string& what) {
  Scheduler& s = sched();
  Fiber* f = s.running;
  if (!s.block.fault) {
    s.block.fault = true;
    s.block.fault_message = std::string(s.kernel) + ": " + where(*f) + ": " + what;
  }
  f->state = State::finished;
  switch_to_scheduler(f, true);
  std::abort();  // never resumed
}

void wait_here(Fiber* f, State st) {
  f->state = st;
  switch_to_scheduler(f);
}

void thread_exit(Fiber* f) {
  Block& b = sched().block;
  Warp& w = b.warps[static_cast<std::size_t>(f->warp)];
  --b.live;
  w.live &= ~(1u << f->lane);
  if (b.at_barrier > 0)
    device_fault("exited while " + std::to_string(b.at_barrier) +
                 " threads of the block wait at __syncthreads() (they would never be released)");
  for (const Collective& c : w.open)
    if (c.mask >> f->lane & 1u)
      device_fault("exited while lanes of its warp wait for it in a warp collective (" +
                   std::string(c.op_name ? c.op_name : "__shfl_sync") + ", mask " + std::to_string(c.mask) + ")");
}

extern "C" void fiber_main() {
  Scheduler& s = sched();
#if OASIS_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &s.asan_stack_bottom, &s.asan_stack_size);
#endif
  Fiber* f = s.running;
  std::string error;
  try {
    (*s.body)();
  } catch (const std::exception& e) {
    error = std::string("exception in device code: ") + e.what();
  } catch (...) {
    error = "unknown exception in device code";
  }
  if (!error.empty()) device_fault(error);  // outside the handler: no live exception across a switch
  thread_exit(f);
  f->state = State::finished;
  switch_to_scheduler(f, true);
  std::abort();  // never resumed
}

#if defined(__x86_64__)
/// The initial stack of a fiber, as oasis_emu_switch leaves one: control words, six callee-saved
/// registers, then fiber_main as the return address, entered with rsp = 8 mod 16 as after a call.
void prepare(Fiber& f) {
#if OASIS_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(f.stack, kStackBytes);  // redzones left by the fiber's previous life
#endif
  auto top = reinterpret_cast<std::uintptr_t>(f.stack + kStackBytes) & ~std::uintptr_t{15};
  auto* p = reinterpret_cast<std::uint64_t*>(top);
  *--p = 0;                                                     // fiber_main's (absent) return address
  *--p = reinterpret_cast<std::uint64_t>(&fiber_main);          // popped by ret
  for (int i = 0; i < 6; ++i) *--p = 0;                         // rbp rbx r12 r13 r14 r15
  std::uint32_t mxcsr = 0;
  std::uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  *--p = static_cast<std::uint64_t>(mxcsr) | (static_cast<std::uint64_t>(fpucw) << 32);
  f.sp = p;
}
#else
void prepare(Fiber& f) {
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = f.stack;
  f.uc.uc_stack.ss_size = kStackBytes;
  f.uc.uc_link = nullptr;
  makecontext(&f.uc, reinterpret_cast<void (*)()>(&fiber_main), 0);
}
#endif

std::string deadlock_message(const Block& b) {
  int at_block = 0, at_warp = 0;
  for (const Fiber& f : *b.fibers) {
    if (f.state == State::at_block_barrier) ++at_block;
    if (f.state == State::at_warp_barrier) ++at_warp;
  }
  const Fiber* first = nullptr;
  for (const Fiber& f : *b.fibers)
    if (f.state != State::finished) { first = &f; break; }
  std::ostringstream o;
  o << "deadlock in block (" << (first ? first->ctx.block_idx.x : 0) << "," << (first ? first->ctx.block_idx.y : 0)
    << "," << (first ? first->ctx.block_idx.z : 0) << "): " << at_block << " threads wait at __syncthreads(), "
    << at_warp << " lanes wait in warp collectives, " << b.live << " threads alive";
  return o.str();
}

/// Runs one block to completion; false on a fault (message in the block).
bool run_block(Scheduler& s, const uint3& bidx, dim3 grid, dim3 blockdim) {
  for (const ByteRange& r : *s.shared) std::memset(r.begin, 0xFF, r.size);  // shared memory starts undefined
  const int n = static_cast<int>(blockdim.x * blockdim.y * blockdim.z);
  Block& b = s.block;
  b = Block{};
  b.fibers = &s.fibers;
  b.nthreads = n;
  b.live = n;
  b.warps.assign(static_cast<std::size_t>((n + 31) / 32), Warp{});
  for (int i = 0; i < n; ++i) {
    Fiber& f = s.fibers[static_cast<std::size_t>(i)];
    f.warp = i / 32;
    f.lane = i % 32;
    f.ctx.thread_idx = uint3{static_cast<unsigned>(i) % blockdim.x, (static_cast<unsigned>(i) / blockdim.x) % blockdim.y,
                             static_cast<unsigned>(i) / (blockdim.x * blockdim.y)};
    f.ctx.block_idx = bidx;
    f.ctx.block_dim = blockdim;
    f.ctx.grid_dim = grid;
    f.state = State::runnable;
    f.shuffle_result = 0;
    b.warps[static_cast<std::size_t>(f.warp)].live |= 1u << f.lane;
    prepare(f);
  }
  s.pass.resize(static_cast<std::size_t>(n));
  std::iota(s.pass.begin(), s.pass.end(), 0);
  if (s.order == Schedule::reverse) std::reverse(s.pass.begin(), s.pass.end());
  for (;;) {
    bool progressed = false;
    if (s.order == Schedule::random) std::shuffle(s.pass.begin(), s.pass.end(), s.rng);
    for (const int i : s.pass) {
      Fiber& f = s.fibers[static_cast<std::size_t>(i)];
      if (f.state != State::runnable) continue;
      resume(&f);
      progressed = true;
      if (b.fault) return false;
    }
    if (b.live == 0) return true;
    if (!progressed) {
      b.fault = true;
      b.fault_message = std::string(s.kernel) + ": " + deadlock_message(b);
      return false;
    }
  }
}

}  // namespace

// --- the execution model -------------------------------------------------------------------------------

void syncthreads() {
  Scheduler& s = sched();
  Block& b = s.block;
  Fiber* f = s.running;
  if (b.live != b.nthreads)
    device_fault("__syncthreads() reached after " + std::to_string(b.nthreads - b.live) +
                 " threads of the block exited (undefined behaviour on the device)");
  if (++b.at_barrier == b.live) {
    b.at_barrier = 0;
    for (Fiber& o : *b.fibers)
      if (o.state == State::at_block_barrier) o.state = State::runnable;
    return;
  }
  wait_here(f, State::at_block_barrier);
}

int lane_id() { return sched().running->lane; }

std::uint64_t warp_exchange(unsigned mask, std::uint64_t value, int src_lane) {
  Scheduler& s = sched();
  Fiber* f = s.running;
  Warp& w = s.block.warps[static_cast<std::size_t>(f->warp)];
  const unsigned me = 1u << f->lane;
  if (!(mask & me)) device_fault("calls a warp collective with a mask that does not name its own lane");
  if ((mask & w.live) != mask)
    device_fault("warp collective mask names lanes that have exited or do not exist (mask " + std::to_string(mask) +
                 ", live " + std::to_string(w.live) + ")");
  if (src_lane < 0 || src_lane > 31 || !(mask >> src_lane & 1u))
    device_fault("reads lane " + std::to_string(src_lane) + ", which is not in the collective's mask");
  // Collectives of different masks may be open at once (independent thread scheduling, sm_70+:
  // lanes 16-31 may wait in a full-mask shuffle while lanes 0-15 finish one of their own). A lane
  // joins the open collective of its mask: it cannot still be waiting in an earlier one of the
  // same mask. Masks that can never complete (lanes waiting in each other's) end in the
  // scheduler's deadlock report.
  Collective* c = nullptr;
  for (Collective& o : w.open)
    if (o.mask == mask) c = &o;
  if (!c) {
    w.open.emplace_back();
    c = &w.open.back();
    c->mask = mask;
  }
  if (c->op_name)
    device_fault(std::string("calls __shfl_sync while other lanes of its warp wait in ") + c->op_name);
  c->value[f->lane] = value;
  c->src[f->lane] = src_lane;
  c->arrived |= me;
  if (c->arrived == mask) {  // complete: every lane's result, then release the lanes
    const int base = f->warp * 32;
    for (int l = 0; l < 32; ++l)
      if (mask >> l & 1u) {
        Fiber& o = (*s.block.fibers)[static_cast<std::size_t>(base + l)];
        o.shuffle_result = c->value[c->src[l]];
        if (o.state == State::at_warp_barrier) o.state = State::runnable;
      }
    w.open.erase(w.open.begin() + (c - w.open.data()));
  } else {
    wait_here(f, State::at_warp_barrier);
  }
  return f->shuffle_result;
}

void warp_operation(const char* name, const void* call, std::size_t call_bytes, void* data,
                    void (*run)(void* const* lane_data, const void* call)) {
  Scheduler& s = sched();
  Fiber* f = s.running;
  Warp& w = s.block.warps[static_cast<std::size_t>(f->warp)];
  if (w.live != kFullWarp)
    device_fault(std::string(name) + " needs all 32 lanes of the warp, but lanes have exited or do not exist (live " +
                 std::to_string(w.live) + ")");
  Collective* c = nullptr;
  for (Collective& o : w.open)
    if (o.mask == kFullWarp) c = &o;
  const auto* bytes = static_cast<const unsigned char*>(call);
  if (!c) {
    w.open.emplace_back();
    c = &w.open.back();
    c->mask = kFullWarp;
    c->op_name = name;
    c->op_call.assign(bytes, bytes + call_bytes);
  } else if (!c->op_name || std::strcmp(c->op_name, name) != 0) {
    device_fault(std::string("calls ") + name + " while other lanes of its warp wait in " +
                 (c->op_name ? c->op_name : "__shfl_sync"));
  } else if (c->op_call.size() != call_bytes || std::memcmp(c->op_call.data(), bytes, call_bytes) != 0) {
    device_fault(std::string("calls ") + name +
                 " with arguments (pointer, leading dimension, layout or fill value) that differ from those of "
                 "the other lanes of its warp");
  }
  c->op_data[f->lane] = data;
  c->arrived |= 1u << f->lane;
  if (c->arrived != kFullWarp) {
    wait_here(f, State::at_warp_barrier);
    return;
  }
  // Complete: run the operation over every lane's data, then release the lanes. The collective is
  // closed first, so that a fault inside the operation leaves no open collective behind.
  void* lane_data[32];
  std::memcpy(lane_data, c->op_data, sizeof lane_data);
  std::vector<unsigned char> args = std::move(c->op_call);
  w.open.erase(w.open.begin() + (c - w.open.data()));
  const int base = f->warp * 32;
  for (int l = 0; l < 32; ++l) {
    Fiber& o = (*s.block.fibers)[static_cast<std::size_t>(base + l)];
    if (o.state == State::at_warp_barrier) o.state = State::runnable;
  }
  run(lane_data, args.data());
}

void device_error(const std::string& what) { device_fault(what); }

void run_grid(dim3 grid, dim3 block, const char* name, const void* kernel, const std::function<void()>& body) {
  std::lock_guard<std::mutex> lock(launch_mutex());
  const unsigned long long nthreads = 1ull * block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > kMaxGridX || grid.y > kMaxGridYZ ||
      grid.z > kMaxGridYZ || nthreads == 0 || nthreads > kMaxThreadsPerBlock || block.z > 64) {
    set_last(cudaErrorInvalidConfiguration);
    return;
  }
  Scheduler& s = sched();
  while (s.fibers.size() < nthreads) {
    Fiber f;
    f.stack = allocate_stack();
    if (!f.stack) {
      set_last(cudaErrorMemoryAllocation);
      return;
    }
    s.fibers.push_back(f);
  }
  s.body = &body;
  s.kernel = name;
  s.shared = &shared_arrays(kernel, name);
  const ThreadContext* saved = g_current;
  // Blocks in x-fastest order, reversed or shuffled with the schedule (a kernel that reads what
  // another block writes without a grid-wide synchronisation shows under one of the orders).
  const unsigned long long nblocks = 1ull * grid.x * grid.y * grid.z;
  std::vector<unsigned long long> order;
  if (s.order == Schedule::random) {
    order.resize(nblocks);
    std::iota(order.begin(), order.end(), 0ull);
    std::shuffle(order.begin(), order.end(), s.rng);
  }
  for (unsigned long long k = 0; k < nblocks; ++k) {
    const unsigned long long lin =
        s.order == Schedule::forward ? k : s.order == Schedule::reverse ? nblocks - 1 - k : order[k];
    const uint3 bidx{static_cast<unsigned>(lin % grid.x), static_cast<unsigned>(lin / grid.x % grid.y),
                     static_cast<unsigned>(lin / (1ull * grid.x * grid.y))};
    if (!run_block(s, bidx, grid, block)) {
      g_current = saved;
      record_fault(cudaErrorLaunchFailure, s.block.fault_message);
      return;
    }
  }
  g_current = saved;
}

void launch_fault(const char* name, const std::string& what) {
  std::lock_guard<std::mutex> lock(launch_mutex());
  record_fault(cudaErrorLaunchFailure, std::string(name) + ": " + what);
}

void set_schedule(Schedule order, unsigned seed) {
  std::lock_guard<std::mutex> lock(launch_mutex());
  sched().order = order;
  sched().rng.seed(seed);
}
Schedule schedule() { return sched().order; }

}  // namespace oasis_emu

