// MT19937 with numpy's legacy seeding and shuffle; see mt19937.h for what was verified.
#include "data/mt19937.h"

enum { MT_N = 624, MT_M = 397 };

void mt19937_seed(Mt19937 *mt, uint32_t seed) {
    mt->key[0] = seed;
    for (uint32_t i = 1; i < MT_N; i++) {
        uint32_t previous = mt->key[i - 1];
        mt->key[i] = 1812433253u * (previous ^ (previous >> 30)) + i;
    }
    mt->position = MT_N;
}

// Regenerates all 624 words of the state (the "twist").
static void mt19937_twist(Mt19937 *mt) {
    for (int i = 0; i < MT_N; i++) {
        uint32_t y = (mt->key[i] & 0x80000000u) | (mt->key[(i + 1) % MT_N] & 0x7fffffffu);
        mt->key[i] = mt->key[(i + MT_M) % MT_N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    mt->position = 0;
}

uint32_t mt19937_next_u32(Mt19937 *mt) {
    if (mt->position >= MT_N) mt19937_twist(mt);
    uint32_t y = mt->key[mt->position++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint64_t mt19937_next_u64(Mt19937 *mt) {
    uint64_t high = mt19937_next_u32(mt);
    uint64_t low = mt19937_next_u32(mt);
    return high << 32 | low;
}

double mt19937_next_double(Mt19937 *mt) {
    uint32_t a = mt19937_next_u32(mt) >> 5, b = mt19937_next_u32(mt) >> 6;
    return (a * 67108864.0 + b) / 9007199254740992.0;
}

uint64_t mt19937_interval(Mt19937 *mt, uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    for (int shift = 1; shift <= 32; shift *= 2) mask |= mask >> shift;
    uint64_t value;
    if (max <= 0xffffffffu) {
        do value = mt19937_next_u32(mt) & mask;
        while (value > max);
    } else {
        do value = mt19937_next_u64(mt) & mask;
        while (value > max);
    }
    return value;
}

void mt19937_shuffle(Mt19937 *mt, long *items, long n) {
    for (long i = n - 1; i >= 1; i--) {
        long j = (long)mt19937_interval(mt, (uint64_t)i);
        long swap = items[i];
        items[i] = items[j];
        items[j] = swap;
    }
}
