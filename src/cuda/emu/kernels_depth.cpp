// The depth routing and layer kernels (src/cuda/depth.cu), compiled for the CUDA emulator.
#include "depth.cu"
