#include "core/hash.h"

#include <string.h>

#define FNV1A_PRIME 1099511628211ULL

uint64_t hash_floats(uint64_t hash, const float *values, long n) {
    for (long i = 0; i + 1 < n; i += 2) {
        uint64_t word;
        memcpy(&word, values + i, sizeof word);
        hash = (hash ^ word) * FNV1A_PRIME;
    }
    if (n % 2) {
        uint32_t last;
        memcpy(&last, values + n - 1, sizeof last);
        hash = (hash ^ last) * FNV1A_PRIME;
    }
    return hash;
}

uint64_t hash_bytes(uint64_t hash, const void *data, size_t n) {
    const unsigned char *bytes = data;
    for (size_t i = 0; i < n; i++) hash = (hash ^ bytes[i]) * FNV1A_PRIME;
    return hash;
}
