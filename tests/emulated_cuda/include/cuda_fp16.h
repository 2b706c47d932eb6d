// The emulated CUDA runtime (tests/emulated_cuda/emulated_runtime.h) in place of the toolkit's cuda_fp16.h.
#pragma once
#include "../emulated_runtime.h"
