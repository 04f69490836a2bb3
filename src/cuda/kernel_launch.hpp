// src/cuda/kernel_launch.hpp — one spelling of a kernel launch for nvcc and for the CUDA emulator.
//
//   OASIS_LAUNCH(grid, block, stream, kernel<Args...>)(arguments...)
//
// is kernel<<<grid, block, 0, stream>>>(arguments...) under nvcc, and runs the same kernel source
// on the host under the emulator (OASIS_CUDA_EMU, src/cuda/emu). The kernel comes last so that a
// template-id with commas needs no parentheses.
#pragma once

#if defined(OASIS_CUDA_EMU)
#define OASIS_LAUNCH(grid, block, stream, ...) ::oasis_emu::launch(grid, block, stream, #__VA_ARGS__, __VA_ARGS__)
#else
#define OASIS_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<grid, block, 0, stream>>>
#endif
