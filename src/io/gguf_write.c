#include "io/gguf_write.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "io/fs.h"
#include "io/gguf_dequant.h"
#include "io/gguf_quantize.h"

#define ALIGNMENT 32

typedef struct {
    uint8_t *data;
    size_t len, cap;
} Bytes;

static void bytes_append(Bytes *b, const void *data, size_t n) {
    if (n == 0) return; // data may be NULL then (an empty buffer's)
    if (b->len + n > b->cap) {
        b->cap = b->cap ? 2 * b->cap : 4096;
        if (b->cap < b->len + n) b->cap = b->len + n;
        b->data = xrealloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
}
// GGUF is little-endian; so are the machines marlhf builds for (x86-64, aarch64).
static void put_u32(Bytes *b, uint32_t v) { bytes_append(b, &v, 4); }
static void put_u64(Bytes *b, uint64_t v) { bytes_append(b, &v, 8); }
static void put_string(Bytes *b, const char *s, size_t len) {
    put_u64(b, len);
    bytes_append(b, s, len);
}

typedef struct {
    char *name;
    GgmlType type;
    int n_dims;
    int64_t ne[4];
    uint8_t *data;
    size_t nbytes;
} PendingTensor;

struct GgufWriter {
    Bytes kv;
    uint64_t n_kv;
    PendingTensor *tensors;
    int n_tensors, cap_tensors;
};

GgufWriter *gguf_writer_new(void) { return xcalloc(1, sizeof(GgufWriter)); }

void gguf_writer_free(GgufWriter *w) {
    if (!w) return;
    free(w->kv.data);
    for (int i = 0; i < w->n_tensors; i++) free(w->tensors[i].name), free(w->tensors[i].data);
    free(w->tensors);
    free(w);
}

static void key_header(GgufWriter *w, const char *key, GgufValueType type) {
    put_string(&w->kv, key, strlen(key));
    put_u32(&w->kv, (uint32_t)type);
    w->n_kv++;
}

void gguf_writer_add_string(GgufWriter *w, const char *key, const char *value) {
    key_header(w, key, GGUF_TYPE_STRING);
    put_string(&w->kv, value, strlen(value));
}

void gguf_writer_add_u32(GgufWriter *w, const char *key, uint32_t value) {
    key_header(w, key, GGUF_TYPE_UINT32);
    put_u32(&w->kv, value);
}

void gguf_writer_add_f32(GgufWriter *w, const char *key, float value) {
    key_header(w, key, GGUF_TYPE_FLOAT32);
    bytes_append(&w->kv, &value, 4);
}

void gguf_writer_add_bool(GgufWriter *w, const char *key, bool value) {
    key_header(w, key, GGUF_TYPE_BOOL);
    uint8_t byte = value ? 1 : 0;
    bytes_append(&w->kv, &byte, 1);
}

void gguf_writer_add_string_array(GgufWriter *w, const char *key, const char *const *strings, const size_t *lengths,
                                  uint64_t count) {
    key_header(w, key, GGUF_TYPE_ARRAY);
    put_u32(&w->kv, GGUF_TYPE_STRING);
    put_u64(&w->kv, count);
    for (uint64_t i = 0; i < count; i++) put_string(&w->kv, strings[i], lengths ? lengths[i] : strlen(strings[i]));
}

void gguf_writer_add_i32_array(GgufWriter *w, const char *key, const int32_t *values, uint64_t count) {
    key_header(w, key, GGUF_TYPE_ARRAY);
    put_u32(&w->kv, GGUF_TYPE_INT32);
    put_u64(&w->kv, count);
    bytes_append(&w->kv, values, count * sizeof(int32_t));
}

void gguf_writer_add_f32_array(GgufWriter *w, const char *key, const float *values, uint64_t count) {
    key_header(w, key, GGUF_TYPE_ARRAY);
    put_u32(&w->kv, GGUF_TYPE_FLOAT32);
    put_u64(&w->kv, count);
    bytes_append(&w->kv, values, count * sizeof(float));
}

// IEEE binary16 of a float, rounded to nearest, ties to even (what numpy's astype does).
uint16_t gguf_f32_to_f16(float value) {
    uint32_t x;
    memcpy(&x, &value, 4);
    const uint32_t sign = (x >> 16) & 0x8000, exponent = (x >> 23) & 0xff, mantissa = x & 0x7fffff;
    if (exponent == 0xff) return (uint16_t)(sign | 0x7c00 | (mantissa ? 0x200 | (mantissa >> 13) : 0));
    const int e = (int)exponent - 127 + 15; // the half's biased exponent
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        // A subnormal half holds full * 2^(exponent - 126) units of 2^-24: the 24-bit
        // significand shifted right by 14 - e.
        const int shift = 14 - e;
        if (shift > 24) return (uint16_t)sign;
        const uint32_t full = mantissa | 0x800000;
        uint32_t half = full >> shift;
        const uint32_t rest = full & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) half++; // a carry rounds up the exponent (to inf at most)
    return (uint16_t)(sign | half);
}

void gguf_writer_add_tensor(GgufWriter *w, const char *name, GgmlType type, int n_dims, const int64_t *ne,
                            const float *values) {
    CHECK(n_dims >= 1 && n_dims <= 4, "GGUF tensor %s with %d dimensions", name, n_dims);
    CHECK(type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || gguf_can_quantize(type), "GGUF writer: type %d", type);
    int64_t n = 1;
    PendingTensor t = {.name = xstrdup(name), .type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
    for (int i = 0; i < n_dims; i++) t.ne[i] = ne[i], n *= ne[i];
    if (type == GGML_TYPE_F32) {
        t.nbytes = (size_t)n * 4;
        t.data = xmalloc(t.nbytes);
        memcpy(t.data, values, t.nbytes);
    } else if (type == GGML_TYPE_F16) {
        t.nbytes = (size_t)n * 2;
        t.data = xmalloc(t.nbytes);
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = gguf_f32_to_f16(values[i]);
            memcpy(t.data + 2 * i, &h, 2);
        }
    } else {
        const int block = gguf_type_info(type)->block_size;
        CHECK(ne[0] % block == 0, "%s tensor %s: %lld values per row, not a multiple of %d", gguf_type_name(type), name,
              (long long)ne[0], block);
        t.nbytes = gguf_quantized_size(type, n);
        t.data = xmalloc(t.nbytes);
        gguf_quantize(type, values, t.data, n);
    }
    if (w->n_tensors == w->cap_tensors) {
        w->cap_tensors = w->cap_tensors ? 2 * w->cap_tensors : 64;
        w->tensors = xrealloc(w->tensors, (size_t)w->cap_tensors * sizeof *w->tensors);
    }
    w->tensors[w->n_tensors++] = t;
}

static size_t align_up(size_t n) { return (n + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT; }

int gguf_writer_write(const GgufWriter *w, const char *path) {
    Bytes header = {0};
    bytes_append(&header, "GGUF", 4);
    put_u32(&header, 3);
    put_u64(&header, (uint64_t)w->n_tensors);
    put_u64(&header, w->n_kv);
    bytes_append(&header, w->kv.data, w->kv.len);
    size_t offset = 0;
    for (int i = 0; i < w->n_tensors; i++) {
        const PendingTensor *t = &w->tensors[i];
        put_string(&header, t->name, strlen(t->name));
        put_u32(&header, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(&header, (uint64_t)t->ne[d]);
        put_u32(&header, (uint32_t)t->type);
        put_u64(&header, offset);
        offset = align_up(offset + t->nbytes);
    }
    static const uint8_t zeros[ALIGNMENT] = {0};
    bytes_append(&header, zeros, align_up(header.len) - header.len);

    FsAtomicFile file;
    int rc = fs_atomic_file_begin(&file, path);
    if (rc == 0) rc = fs_atomic_file_write(&file, header.data, header.len);
    for (int i = 0; rc == 0 && i < w->n_tensors; i++) {
        const PendingTensor *t = &w->tensors[i];
        rc = fs_atomic_file_write(&file, t->data, t->nbytes);
        if (rc == 0 && i + 1 < w->n_tensors) rc = fs_atomic_file_write(&file, zeros, align_up(t->nbytes) - t->nbytes);
    }
    if (rc == 0) rc = fs_atomic_file_commit(&file);
    free(header.data);
    return rc;
}
