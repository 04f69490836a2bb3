// The fused AttnRes kernels (src/cuda/attn_res.cu), compiled for the CUDA emulator.
#include "attn_res.cu"
