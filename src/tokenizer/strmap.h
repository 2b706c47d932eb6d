// Hash maps for the tokenizer: byte string -> int (the vocabulary), and a pair of ids ->
// (rank, merged id) (the BPE merges). Open addressing, power-of-two tables.
#pragma once
#include <stddef.h>
#include <stdint.h>

// Keys are not copied: the caller keeps them alive as long as the map.
typedef struct {
    const char **keys;
    uint32_t *key_len;
    int *values;
    size_t cap, count; // cap: a power of two (0 when empty)
} StrMap;

// Sets key -> value (replacing an existing value).
void strmap_put(StrMap *map, const char *key, size_t len, int value);
// The value of key, or -1.
int strmap_get(const StrMap *map, const char *key, size_t len);
void strmap_free(StrMap *map);

typedef struct {
    uint64_t *keys; // (left << 32 | right) + 1; 0 = empty slot
    int *rank, *merged;
    size_t cap, count;
} PairMap;

void pairmap_put(PairMap *map, int left, int right, int rank, int merged);
// 1 and *rank, *merged set if (left, right) is a merge, else 0.
int pairmap_get(const PairMap *map, int left, int right, int *rank, int *merged);
void pairmap_free(PairMap *map);

uint64_t tok_hash_bytes(const char *data, size_t len);
