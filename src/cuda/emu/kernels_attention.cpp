// The fused attention kernels (src/cuda/attention.cu), compiled for the CUDA emulator.
#include "attention.cu"
