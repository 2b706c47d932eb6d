#include "tokenizer/strmap.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

// FNV-1a over 8-byte words then bytes, with a final mix: fast on the short keys of a
// vocabulary, and good enough spread for open addressing.
uint64_t tok_hash_bytes(const char *data, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)len;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, data + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < len; i++) h = (h ^ (uint8_t)data[i]) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

static void strmap_grow(StrMap *map) {
    size_t cap = map->cap ? map->cap * 2 : 64;
    StrMap next = {xcalloc(cap, sizeof(char *)), xcalloc(cap, sizeof(uint32_t)), xcalloc(cap, sizeof(int)), cap, 0};
    for (size_t i = 0; i < map->cap; i++)
        if (map->keys[i]) strmap_put(&next, map->keys[i], map->key_len[i], map->values[i]);
    strmap_free(map);
    *map = next;
}

void strmap_put(StrMap *map, const char *key, size_t len, int value) {
    CHECK(len < UINT32_MAX, "key too long");
    if (2 * (map->count + 1) > map->cap) strmap_grow(map);
    size_t mask = map->cap - 1, i = tok_hash_bytes(key, len) & mask;
    while (map->keys[i]) {
        if (map->key_len[i] == len && memcmp(map->keys[i], key, len) == 0) {
            map->values[i] = value;
            return;
        }
        i = (i + 1) & mask;
    }
    // An empty key still needs a non-NULL pointer to mark the slot used.
    map->keys[i] = len ? key : "";
    map->key_len[i] = (uint32_t)len;
    map->values[i] = value;
    map->count++;
}

int strmap_get(const StrMap *map, const char *key, size_t len) {
    if (!map->cap) return -1;
    size_t mask = map->cap - 1, i = tok_hash_bytes(key, len) & mask;
    while (map->keys[i]) {
        if (map->key_len[i] == len && memcmp(map->keys[i], key, len) == 0) return map->values[i];
        i = (i + 1) & mask;
    }
    return -1;
}

void strmap_free(StrMap *map) {
    free(map->keys);
    free(map->key_len);
    free(map->values);
    memset(map, 0, sizeof *map);
}

static uint64_t pair_key(int left, int right) { return ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1; }

static size_t pair_slot(uint64_t key, size_t mask) {
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29)) & mask;
}

static void pairmap_grow(PairMap *map) {
    size_t cap = map->cap ? map->cap * 2 : 1024;
    PairMap next = {xcalloc(cap, sizeof(uint64_t)), xcalloc(cap, sizeof(int)), xcalloc(cap, sizeof(int)), cap, 0};
    for (size_t i = 0; i < map->cap; i++) {
        if (!map->keys[i]) continue;
        size_t j = pair_slot(map->keys[i], cap - 1);
        while (next.keys[j]) j = (j + 1) & (cap - 1);
        next.keys[j] = map->keys[i];
        next.rank[j] = map->rank[i];
        next.merged[j] = map->merged[i];
        next.count++;
    }
    pairmap_free(map);
    *map = next;
}

void pairmap_put(PairMap *map, int left, int right, int rank, int merged) {
    if (2 * (map->count + 1) > map->cap) pairmap_grow(map);
    uint64_t key = pair_key(left, right);
    size_t mask = map->cap - 1, i = pair_slot(key, mask);
    while (map->keys[i] && map->keys[i] != key) i = (i + 1) & mask;
    if (!map->keys[i]) map->count++;
    map->keys[i] = key;
    map->rank[i] = rank;
    map->merged[i] = merged;
}

int pairmap_get(const PairMap *map, int left, int right, int *rank, int *merged) {
    if (!map->cap) return 0;
    uint64_t key = pair_key(left, right);
    size_t mask = map->cap - 1, i = pair_slot(key, mask);
    while (map->keys[i]) {
        if (map->keys[i] == key) {
            *rank = map->rank[i];
            *merged = map->merged[i];
            return 1;
        }
        i = (i + 1) & mask;
    }
    return 0;
}

void pairmap_free(PairMap *map) {
    free(map->keys);
    free(map->rank);
    free(map->merged);
    memset(map, 0, sizeof *map);
}
