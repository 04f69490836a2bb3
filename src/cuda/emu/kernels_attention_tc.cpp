// The tensor-core attention kernel (src/cuda/attention_tc.cu), compiled for the CUDA emulator.
#include "attention_tc.cu"
