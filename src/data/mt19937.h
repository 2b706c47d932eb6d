// numpy's legacy random generator (numpy.random.RandomState), the parts DeepSpeed-Chat's
// data splits use, reproduced bit for bit: the Mersenne Twister MT19937 (Matsumoto &
// Nishimura 1998), seeded the way RandomState(seed) seeds it, and RandomState.shuffle
// of a 1-D array.
//
// Verified against numpy 2.4 by experiment (tools/make_split_fixtures.py writes the
// expected permutations; tests/test_data.c compares every index):
//   - RandomState(s) for an integer s in [0, 2^32) is MT19937's init_genrand(s) (the
//     1998 reference's Knuth-multiplier fill), NOT init_by_array({s}): get_state()'s key
//     starts 1234, 3159640283, ... for s = 1234, as init_genrand gives.
//   - shuffle(x) of n items is Fisher-Yates from the end: for i = n-1 down to 1, draw
//     j uniform in [0, i] and swap x[i], x[j]. j comes from numpy's random_interval():
//     mask = i with every bit below its top bit set, draw (32-bit draw & mask) until the
//     value is <= i (rejection, no modulo), a 64-bit draw when i >= 2^32.
#pragma once
#include <stdint.h>

typedef struct {
    uint32_t key[624];
    int position; // next word of key[] to temper; 624: regenerate first
} Mt19937;

// RandomState(seed) for an integer seed (init_genrand).
void mt19937_seed(Mt19937 *mt, uint32_t seed);
// The next 32-bit output (numpy's random_uint32 / legacy "tomaxint" word).
uint32_t mt19937_next_u32(Mt19937 *mt);
// Two words, the first in the high half. numpy builds its 64-bit draw from two calls
// in one C expression, whose order C leaves open; this is the high-first reading. Only
// shuffles of 2^32 or more items use it, and that case is not verified against numpy.
uint64_t mt19937_next_u64(Mt19937 *mt);
// A double in [0, 1) with 53 bits, as RandomState.random_sample() draws it.
double mt19937_next_double(Mt19937 *mt);
// Uniform in [0, max], numpy's random_interval() (masked rejection sampling).
uint64_t mt19937_interval(Mt19937 *mt, uint64_t max);
// RandomState.shuffle on a 1-D array of n items.
void mt19937_shuffle(Mt19937 *mt, long *items, long n);
