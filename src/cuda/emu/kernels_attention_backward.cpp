// The attention backward kernels (src/cuda/attention_backward.cu), compiled for the CUDA emulator.
#include "attention_backward.cu"
