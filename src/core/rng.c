#include "core/rng.h"

Philox4x32 philox4x32(uint64_t seed, uint64_t stream, uint64_t counter) {
    return philox4x32_block(seed, stream, counter);
}

float rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    return (float)(philox4x32(seed, stream, counter).v[0] >> 8) * (1.0f / 16777216.0f);
}

double rng_uniform_double(uint64_t seed, uint64_t stream, uint64_t counter) {
    Philox4x32 r = philox4x32(seed, stream, counter);
    uint64_t bits = ((uint64_t)r.v[0] << 21) ^ (r.v[1] >> 11);
    return (double)(bits & ((1ULL << 53) - 1)) * (1.0 / 9007199254740992.0);
}

uint64_t rng_below(uint64_t seed, uint64_t stream, uint64_t counter, uint64_t n) {
    // Rejection sampling over successive blocks: counter advances in the high half of the
    // stream word so draws for different counters never share a block.
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    for (uint64_t attempt = 0;; attempt++) {
        Philox4x32 r = philox4x32(seed ^ (attempt * 0x9E3779B97F4A7C15ULL), stream, counter);
        uint64_t x = ((uint64_t)r.v[0] << 32) | r.v[1];
        if (x < limit) return x % n;
    }
}

uint64_t rng_stream(const char *name, uint64_t a, uint64_t b) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
    h ^= a * 0x9E3779B97F4A7C15ULL;
    h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ULL;
    h ^= b * 0xC2B2AE3D27D4EB4FULL;
    h = (h ^ (h >> 29)) * 0x94D049BB133111EBULL;
    return h ^ (h >> 32);
}
