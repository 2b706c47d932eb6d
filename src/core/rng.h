// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
//
// A random value is a pure function of (seed, stream, counter): no hidden state advances,
// so a sampled token depends only on its seed, its row's stream and its position — not on
// which other rows share the batch, how many threads run, or whether the run restarted.
#pragma once
#include <stdint.h>

#include "core/philox.h"

// The raw block for key (seed) and 128-bit counter (stream, counter).
Philox4x32 philox4x32(uint64_t seed, uint64_t stream, uint64_t counter);

// A uniform float in [0, 1) with 24 random bits, from the first word of the block.
float rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);
// A uniform double in [0, 1) with 53 random bits.
double rng_uniform_double(uint64_t seed, uint64_t stream, uint64_t counter);
// A uniform integer in [0, n) without modulo bias (n > 0).
uint64_t rng_below(uint64_t seed, uint64_t stream, uint64_t counter, uint64_t n);
// Derives a stream id from a name and numbers (e.g. "sample", row, step): FNV-1a + mixing.
uint64_t rng_stream(const char *name, uint64_t a, uint64_t b);
