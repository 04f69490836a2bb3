// The split-K attention kernels (src/cuda/attention_split.cu), compiled for the CUDA emulator.
#include "attention_split.cu"
