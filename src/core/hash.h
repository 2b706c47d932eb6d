// FNV-1a over the bits of float arrays, a 64-bit word (two floats) at a time: the weight
// fingerprints that ranks compare (dist/model_sync.c) and that a LoRA adapter records of
// its base (model/lora.c). Word-wise because a base of 7B weights is 28 GB: byte-wise
// hashing would take tens of seconds.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define HASH_FNV1A_START 14695981039346656037ULL

// Continues `hash` over values[0, n). Hashing an array in pieces gives the hash of the
// whole when every piece but the last has an even length.
uint64_t hash_floats(uint64_t hash, const float *values, long n);
// Continues `hash` over the n bytes at `data`, one at a time (FNV-1a as written: for short
// records, such as the token ids of a data set's rows).
uint64_t hash_bytes(uint64_t hash, const void *data, size_t n);
