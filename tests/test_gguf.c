// GGUF reading, dequantization and config_from_gguf.
//
// Fixtures come from tools/make_gguf_fixtures.py (gguf-py writes them and computes
// the expected f32 values). Damaged files are made at run time in $MARLHF_TEST_TMP
// (default /tmp): every prefix of a valid file, random byte flips, and hand-built
// files with one thing wrong each.
#include <stdint.h>
#include <sys/stat.h>
#include <omp.h>
#include <unistd.h>

#include "core/check.h"
#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "io/gguf_quantize.h"
#include "io/gguf_write.h"
#include "model/config_gguf.h"
#include "test.h"

#define TYPES_GGUF "tests/fixtures/gguf/types.gguf"
#define TYPES_EXPECTED "tests/fixtures/gguf/types.expected.f32"
#define TINY_LLAMA "tests/fixtures/gguf/tiny_llama.gguf"

// --- Helpers ------------------------------------------------------------------------

static char *read_whole_file(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *bytes = xmalloc((size_t)n + 1);
    size_t got = fread(bytes, 1, (size_t)n, fp);
    fclose(fp);
    if (got != (size_t)n) {
        free(bytes);
        return NULL;
    }
    *size = (size_t)n;
    return bytes;
}

static void write_file(const char *path, const void *bytes, size_t size) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp, "cannot write %s", path);
    CHECK(fwrite(bytes, 1, size, fp) == size, "short write to %s", path);
    fclose(fp);
}

static char *tmp_path(const char *name) {
    const char *dir = getenv("MARLHF_TEST_TMP");
    if (!dir || !*dir) dir = "/tmp";
    char *path = xmalloc(strlen(dir) + strlen(name) + 64);
    sprintf(path, "%s/gguf_%d_%s", dir, (int)getpid(), name);
    return path;
}

// Opens a fixture, or records a failure and leaves the test.
#define OPEN_OR_RETURN(f, path)                                                        \
    do {                                                                               \
        if (gguf_open(&(f), (path)) < 0) {                                             \
            EXPECT(false, "open %s: %s (run tools/make_gguf_fixtures.py?)", (path), err_msg()); \
            return;                                                                    \
        }                                                                              \
    } while (0)

static bool contains(const char *haystack, const char *needle) { return strstr(haystack, needle) != NULL; }

// Opening `path` must fail with a message naming the file and containing `needle`
// (and `needle2` when not NULL).
static void expect_open_fails(const char *path, const char *needle, const char *needle2) {
    GgufFile f;
    err_clear();
    int rc = gguf_open(&f, path);
    EXPECT(rc == -1, "gguf_open(%s) returned %d, expected failure (wanted '%s')", path, rc, needle);
    if (rc == 0) {
        gguf_close(&f);
        return;
    }
    EXPECT(contains(err_msg(), path), "message does not name the file: %s", err_msg());
    EXPECT(contains(err_msg(), needle), "message lacks '%s': %s", needle, err_msg());
    if (needle2) EXPECT(contains(err_msg(), needle2), "message lacks '%s': %s", needle2, err_msg());
}

// A byte buffer for building GGUF files by hand.
typedef struct {
    uint8_t *bytes;
    size_t len, cap;
} Buf;

static void put(Buf *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->bytes = xrealloc(b->bytes, b->cap);
    }
    memcpy(b->bytes + b->len, p, n);
    b->len += n;
}
static void put_u32(Buf *b, uint32_t x) { put(b, &x, 4); }
static void put_u64(Buf *b, uint64_t x) { put(b, &x, 8); }
static void put_str(Buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_header(Buf *b, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}
static void put_kv_u32(Buf *b, const char *key, uint32_t value) {
    put_str(b, key);
    put_u32(b, GGUF_TYPE_UINT32);
    put_u32(b, value);
}
static void put_kv_f32(Buf *b, const char *key, float value) {
    put_str(b, key);
    put_u32(b, GGUF_TYPE_FLOAT32);
    put(b, &value, 4);
}
static void put_kv_str(Buf *b, const char *key, const char *value) {
    put_str(b, key);
    put_u32(b, GGUF_TYPE_STRING);
    put_str(b, value);
}
static void put_array_header(Buf *b, const char *key, uint32_t elem_type, uint64_t count) {
    put_str(b, key);
    put_u32(b, GGUF_TYPE_ARRAY);
    put_u32(b, elem_type);
    put_u64(b, count);
}
static void put_tensor_info(Buf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                            uint64_t offset) {
    put_str(b, name);
    put_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) put_u64(b, ne[d]);
    put_u32(b, type);
    put_u64(b, offset);
}
// Pads to the alignment, then appends `n` bytes of data (a repeating pattern).
static void put_data(Buf *b, size_t alignment, size_t n) {
    static const uint8_t zero[64];
    while (b->len % alignment) put(b, zero, 1);
    for (size_t i = 0; i < n; i++) {
        uint8_t byte = (uint8_t)(i * 7 + 1);
        put(b, &byte, 1);
    }
}

static void write_buf(const char *path, Buf *b) {
    write_file(path, b->bytes, b->len);
    free(b->bytes);
    memset(b, 0, sizeof *b);
}

// --- Dequantization against gguf-py --------------------------------------------------

static void test_dequant_matches_gguf_py(void) {
    GgufFile f;
    OPEN_OR_RETURN(f, TYPES_GGUF);
    size_t expected_size;
    char *expected = read_whole_file(TYPES_EXPECTED, &expected_size);
    EXPECT(expected, "cannot read %s", TYPES_EXPECTED);
    if (!expected) {
        gguf_close(&f);
        return;
    }
    bool type_seen[64] = {false};
    size_t pos = 0;
    for (uint64_t i = 0; i < f.n_tensors; i++) {
        const GgufTensor *t = &f.tensors[i];
        size_t n = (size_t)t->n_elements;
        EXPECT(pos + n * 4 <= expected_size, "expected values file too short at tensor %s", t->name);
        if (pos + n * 4 > expected_size) break;
        float *got = xmalloc(n * sizeof(float));
        EXPECT(gguf_tensor_to_f32(&f, t, got) == 0, "%s: %s", t->name, err_msg());
        // Bit-exact, NaN payloads included: the arithmetic is the same as gguf-py's.
        size_t mismatches = 0, first = 0;
        for (size_t j = 0; j < n; j++) {
            if (memcmp(&got[j], expected + pos + j * 4, 4) != 0) {
                if (mismatches++ == 0) first = j;
            }
        }
        if (mismatches) {
            float want;
            memcpy(&want, expected + pos + first * 4, 4);
            EXPECT(false, "%s (%s): %zu of %zu values differ, first at %zu: got %.9g want %.9g", t->name,
                   gguf_type_name(t->type), mismatches, n, first, (double)got[first], (double)want);
        }
        if ((unsigned)t->type < 64) type_seen[t->type] = true;
        pos += n * 4;
        free(got);
    }
    EXPECT(pos == expected_size, "expected values file has %zu bytes, tensors used %zu", expected_size, pos);
    const GgmlType supported[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                                  GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
                                  GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL,
                                  GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4, GGML_TYPE_NVFP4, GGML_TYPE_TQ1_0,
                                  GGML_TYPE_TQ2_0};
    for (size_t k = 0; k < sizeof supported / sizeof supported[0]; k++) {
        EXPECT(type_seen[supported[k]], "fixture has no %s tensor", gguf_type_name(supported[k]));
        EXPECT(gguf_type_info(supported[k])->can_dequantize, "%s not convertible", gguf_type_name(supported[k]));
    }
    free(expected);
    gguf_close(&f);
}

static void test_tensor_infos(void) {
    GgufFile f;
    OPEN_OR_RETURN(f, TYPES_GGUF);
    EXPECT(f.version == 3, "version %u", f.version);
    EXPECT(f.alignment == 64, "alignment %u", f.alignment);
    EXPECT(f.data_offset % 64 == 0, "data offset %zu", f.data_offset);
    const GgufTensor *t = gguf_find_tensor(&f, "quant.Q8_0");
    EXPECT(t != NULL, "quant.Q8_0 missing");
    if (t) {
        EXPECT(t->n_dims == 3 && t->ne[0] == 64 && t->ne[1] == 2 && t->ne[2] == 2 && t->ne[3] == 1,
               "shape %d [%lld %lld %lld %lld]", t->n_dims, (long long)t->ne[0], (long long)t->ne[1],
               (long long)t->ne[2], (long long)t->ne[3]);
        EXPECT(t->n_elements == 256 && t->nbytes == 8 * 34, "elements %lld bytes %zu", (long long)t->n_elements,
               t->nbytes);
        EXPECT(t->type == GGML_TYPE_Q8_0, "type %d", (int)t->type);
    }
    for (uint64_t i = 0; i < f.n_tensors; i++) {
        const uint8_t *data = f.tensors[i].data;
        EXPECT((size_t)(data - f.map) % 64 == 0, "%s not aligned", f.tensors[i].name);
    }
    EXPECT(gguf_find_tensor(&f, "no.such.tensor") == NULL, "found a missing tensor");
    const GgmlTypeInfo *q4k = gguf_type_info(GGML_TYPE_Q4_K);
    EXPECT(q4k && q4k->block_size == 256 && q4k->type_size == 144 && strcmp(q4k->name, "Q4_K") == 0, "Q4_K info");
    EXPECT(gguf_type_info(4) == NULL && gguf_type_info(99) == NULL, "removed/unknown ids must be unknown");
    gguf_close(&f);
}

static void test_dequant_rows(void) {
    GgufFile f;
    OPEN_OR_RETURN(f, TYPES_GGUF);
    const char *names[] = {"random.Q4_K", "random.Q5_1", "quant.Q8_0", "special.F16"};
    for (size_t k = 0; k < 4; k++) {
        const GgufTensor *t = gguf_find_tensor(&f, names[k]);
        EXPECT(t, "%s missing", names[k]);
        if (!t) continue;
        int64_t row_len = t->ne[0], rows = t->n_elements / row_len;
        float *all = xmalloc((size_t)t->n_elements * sizeof(float));
        float *some = xmalloc((size_t)t->n_elements * sizeof(float));
        EXPECT(gguf_tensor_to_f32(&f, t, all) == 0, "%s", err_msg());
        EXPECT(gguf_tensor_rows_to_f32(&f, t, 1, rows - 1, some) == 0, "%s", err_msg());
        EXPECT(memcmp(all + row_len, some, (size_t)((rows - 1) * row_len) * sizeof(float)) == 0,
               "%s: rows 1.. differ from the whole tensor", names[k]);
        free(all);
        free(some);
    }
    gguf_close(&f);
}

static void test_f16_conversion(void) {
    // Every finite half against the compiler's own conversion; NaNs keep their payload.
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float got = gguf_f16_to_f32((uint16_t)h);
        uint16_t bits = (uint16_t)h;
        _Float16 half;
        memcpy(&half, &bits, 2);
        float want = (float)half;
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            uint32_t got_bits;
            memcpy(&got_bits, &got, 4);
            if (!isnan(got) || (got_bits & 0x7fffff) >> 13 != (h & 0x3ff) || (got_bits >> 31) != (h >> 15)) bad++;
        } else if (memcmp(&got, &want, 4) != 0) {
            bad++;
        }
    }
    EXPECT(bad == 0, "%d half values convert wrongly", bad);
    EXPECT(gguf_bf16_to_f32(0x3f80) == 1.0f && gguf_bf16_to_f32(0xc000) == -2.0f, "bf16");
}

// f32 -> f16 rounds to nearest even, as the compiler's own conversion: every half comes
// back as itself, and random floats over the whole range (subnormal halves, overflow) agree.
static void test_f16_from_f32(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; // NaN
        if (gguf_f32_to_f16(gguf_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    EXPECT(bad == 0, "%d halves do not round-trip", bad);
    uint64_t state = 12345;
    bad = 0;
    for (int i = 0; i < 2000000; i++) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t bits = (uint32_t)(state >> 32);
        // Exponents around the half's range: biased 100..145 (2^-27 .. 2^18).
        bits = (bits & 0x807fffff) | ((100u + (bits >> 23) % 46) << 23);
        float x;
        memcpy(&x, &bits, 4);
        _Float16 want = (_Float16)x;
        uint16_t want_bits;
        memcpy(&want_bits, &want, 2);
        if (gguf_f32_to_f16(x) != want_bits) bad++;
    }
    EXPECT(bad == 0, "%d of 2000000 floats round differently from the compiler", bad);
    EXPECT(gguf_f32_to_f16(1e6f) == 0x7c00 && gguf_f32_to_f16(-1e6f) == 0xfc00, "overflow to infinity");
    EXPECT(gguf_f32_to_f16(65504.0f) == 0x7bff && gguf_f32_to_f16(1e-9f) == 0, "largest half, underflow");
}

// The writer's file reads back: every key type, and F32, F16, Q8_0 tensors.
static void test_writer_roundtrip(void) {
    char *path = tmp_path("written.gguf");
    GgufWriter *w = gguf_writer_new();
    gguf_writer_add_string(w, "general.architecture", "llama");
    gguf_writer_add_u32(w, "test.u32", 4000000000u);
    gguf_writer_add_f32(w, "test.f32", 0.15625f);
    gguf_writer_add_bool(w, "test.bool", true);
    const char *strings[] = {"a", "", "h\xc3\xa9llo"};
    gguf_writer_add_string_array(w, "test.strings", strings, NULL, 3);
    const int32_t ints[] = {-1, 0, 7};
    gguf_writer_add_i32_array(w, "test.ints", ints, 3);
    const float floats[] = {0.5f, -2.0f};
    gguf_writer_add_f32_array(w, "test.floats", floats, 2);
    float values[3 * 64];
    for (int i = 0; i < 3 * 64; i++) values[i] = sinf((float)i) * (1.0f + (float)i / 50.0f);
    const int64_t ne_vector[1] = {5}, ne_matrix[2] = {64, 3};
    gguf_writer_add_tensor(w, "vector", GGML_TYPE_F32, 1, ne_vector, values);
    gguf_writer_add_tensor(w, "half", GGML_TYPE_F16, 2, ne_matrix, values);
    gguf_writer_add_tensor(w, "q8", GGML_TYPE_Q8_0, 2, ne_matrix, values);
    EXPECT(gguf_writer_write(w, path) == 0, "write: %s", err_msg());
    gguf_writer_free(w);

    GgufFile f;
    OPEN_OR_RETURN(f, path);
    uint32_t u32;
    float f32;
    bool b;
    char *s;
    const GgufValue *v;
    EXPECT(gguf_get_string(&f, "general.architecture", &s) == 0 && !strcmp(s, "llama"), "string");
    free(s);
    EXPECT(gguf_get_u32(&f, "test.u32", &u32) == 0 && u32 == 4000000000u, "u32");
    EXPECT(gguf_get_f32(&f, "test.f32", &f32) == 0 && f32 == 0.15625f, "f32");
    EXPECT(gguf_get_bool(&f, "test.bool", &b) == 0 && b, "bool");
    EXPECT(gguf_get_string_array(&f, "test.strings", &v) == 0 && gguf_array_count(v) == 3 &&
               gguf_array_string(v, 2).len == 6 && !memcmp(gguf_array_string(v, 2).ptr, strings[2], 6) &&
               gguf_array_string(v, 1).len == 0,
           "string array");
    EXPECT(gguf_get_int_array(&f, "test.ints", &v) == 0 && gguf_array_int(v, 0) == -1 && gguf_array_int(v, 2) == 7,
           "int array");
    EXPECT(gguf_get_float_array(&f, "test.floats", &v) == 0 && gguf_array_float(v, 1) == -2.0, "float array");
    float got[3 * 64];
    const GgufTensor *t = gguf_find_tensor(&f, "vector");
    EXPECT(t && t->type == GGML_TYPE_F32 && t->n_elements == 5 && gguf_tensor_to_f32(&f, t, got) == 0 &&
               !memcmp(got, values, 5 * 4),
           "f32 tensor");
    t = gguf_find_tensor(&f, "half");
    EXPECT(t && t->type == GGML_TYPE_F16 && t->ne[0] == 64 && t->ne[1] == 3 && gguf_tensor_to_f32(&f, t, got) == 0,
           "f16 tensor");
    for (int i = 0; t && i < 3 * 64; i++)
        EXPECT(got[i] == gguf_f16_to_f32(gguf_f32_to_f16(values[i])), "f16 value %d", i);
    t = gguf_find_tensor(&f, "q8");
    EXPECT(t && t->type == GGML_TYPE_Q8_0 && gguf_tensor_to_f32(&f, t, got) == 0, "q8_0 tensor");
    for (int row = 0; t && row < 6; row++) { // blocks of 32: error at most half a step of max/127
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(values[row * 32 + i]));
        for (int i = 0; i < 32; i++)
            EXPECT(fabsf(got[row * 32 + i] - values[row * 32 + i]) <= 0.5f * amax / 127.0f * 1.01f + 1e-6f,
                   "q8_0 value %d", row * 32 + i);
    }
    EXPECT((size_t)f.data_offset % 32 == 0, "data section aligned");
    gguf_close(&f);
    unlink(path);
    free(path);

    w = gguf_writer_new();
    EXPECT(gguf_writer_write(w, "/nonexistent-dir/x.gguf") != 0 && strstr(err_msg(), "/nonexistent-dir/x.gguf"),
           "an unwritable path is an error naming it: %s", err_msg());
    gguf_writer_free(w);
}

// --- Metadata -------------------------------------------------------------------------

static void test_metadata_roundtrip(void) {
    GgufFile f;
    OPEN_OR_RETURN(f, TINY_LLAMA);
    EXPECT(f.alignment == 32, "default alignment, got %u", f.alignment);
    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;
    char *s;
    const GgufValue *v = NULL;
    EXPECT(gguf_get_u32(&f, "test.u8", &u32) == 0 && u32 == 200, "u8 %u", u32);
    EXPECT(gguf_get_i64(&f, "test.i8", &i64) == 0 && i64 == -100, "i8");
    EXPECT(gguf_get_u32(&f, "test.u16", &u32) == 0 && u32 == 60000, "u16");
    EXPECT(gguf_get_i64(&f, "test.i16", &i64) == 0 && i64 == -30000, "i16");
    EXPECT(gguf_get_u32(&f, "test.u32", &u32) == 0 && u32 == 4000000000u, "u32");
    EXPECT(gguf_get_i64(&f, "test.i32", &i64) == 0 && i64 == -2000000000, "i32");
    EXPECT(gguf_get_f32(&f, "test.f32", &f32) == 0 && f32 == 0.15625f, "f32");
    EXPECT(gguf_get_bool(&f, "test.bool", &b) == 0 && b, "bool");
    EXPECT(gguf_get_i64(&f, "test.u64", &i64) == 0 && i64 == (1LL << 40) + 5, "u64");
    EXPECT(gguf_get_i64(&f, "test.i64", &i64) == 0 && i64 == -(1LL << 40), "i64");
    v = gguf_find(&f, "test.f64");
    EXPECT(v && v->type == GGUF_TYPE_FLOAT64 && v->f64 == 3.141592653589793, "f64");
    EXPECT(gguf_get_f32(&f, "test.f64", &f32) == 0 && f32 == (float)3.141592653589793, "f64 as f32");
    EXPECT(gguf_get_string(&f, "test.string", &s) == 0 && strcmp(s, "h\xc3\xa9llo w\xc3\xb6rld") == 0, "string");
    free(s);
    EXPECT(gguf_get_string(&f, "test.empty_string", &s) == 0 && s[0] == '\0', "empty string");
    free(s);
    EXPECT(gguf_get_string(&f, "general.architecture", &s) == 0 && strcmp(s, "llama") == 0, "architecture");
    free(s);
    EXPECT(gguf_get_string(&f, "tokenizer.chat_template", &s) == 0 &&
               strcmp(s, "{% for m in messages %}{{ m['content'] }}\n{% endfor %}") == 0,
           "chat template");
    free(s);

    // Wrong types and missing keys name the key and the file.
    EXPECT(gguf_get_u32(&f, "test.i8", &u32) == -1 && contains(err_msg(), "test.i8") &&
               contains(err_msg(), TINY_LLAMA),
           "negative as u32: %s", err_msg());
    EXPECT(gguf_get_u32(&f, "test.u64", &u32) == -1, "u64 too big for u32");
    EXPECT(gguf_get_f32(&f, "test.u32", &f32) == -1 && contains(err_msg(), "test.u32"), "int as float");
    EXPECT(gguf_get_string(&f, "test.u8", &s) == -1 && contains(err_msg(), "test.u8"), "int as string");
    EXPECT(gguf_get_bool(&f, "no.such.key", &b) == -1 && contains(err_msg(), "no.such.key") &&
               contains(err_msg(), TINY_LLAMA),
           "missing: %s", err_msg());
    EXPECT(gguf_find(&f, "no.such.key") == NULL, "find missing");

    // Arrays.
    EXPECT(gguf_get_string_array(&f, "tokenizer.ggml.tokens", &v) == 0, "%s", err_msg());
    if (v) {
        EXPECT(gguf_array_count(v) == 32, "tokens %llu", (unsigned long long)gguf_array_count(v));
        GgufString t1 = gguf_array_string(v, 1), last = gguf_array_string(v, 31);
        EXPECT(t1.len == 3 && memcmp(t1.ptr, "<s>", 3) == 0, "token 1");
        EXPECT(last.len == 5 && memcmp(last.ptr, "\xc3\xa9t\xc3\xa9", 5) == 0, "token 31");
    }
    EXPECT(gguf_get_float_array(&f, "tokenizer.ggml.scores", &v) == 0 && gguf_array_count(v) == 32 &&
               gguf_array_float(v, 3) == -0.75 && v->arr.elem_type == GGUF_TYPE_FLOAT32,
           "scores");
    EXPECT(gguf_get_int_array(&f, "tokenizer.ggml.token_type", &v) == 0 && gguf_array_count(v) == 32 &&
               gguf_array_int(v, 0) == 3 && gguf_array_int(v, 4) == 1 && v->arr.elem_type == GGUF_TYPE_INT32,
           "token types");
    EXPECT(gguf_get_string_array(&f, "tokenizer.ggml.merges", &v) == 0 && gguf_array_count(v) == 3 &&
               gguf_array_string(v, 1).len == 4 && memcmp(gguf_array_string(v, 1).ptr, "to k", 4) == 0,
           "merges");
    EXPECT(gguf_get_int_array(&f, "test.array_u16", &v) == 0 && gguf_array_int(v, 1) == 65535, "u16 array");
    EXPECT(gguf_get_int_array(&f, "test.array_i64", &v) == 0 && gguf_array_int(v, 0) == -(1LL << 40) &&
               gguf_array_int(v, 2) == 7,
           "i64 array");
    EXPECT(gguf_get_float_array(&f, "test.array_f64", &v) == 0 && gguf_array_float(v, 0) == 0.1 &&
               gguf_array_float(v, 1) == -2.5,
           "f64 array");
    EXPECT(gguf_get_array(&f, "test.array_bool", &v) == 0 && v->arr.elem_type == GGUF_TYPE_BOOL &&
               gguf_array_count(v) == 3 && gguf_array_int(v, 0) == 1 && gguf_array_int(v, 1) == 0,
           "bool array");
    EXPECT(gguf_get_int_array(&f, "test.array_u64_big", &v) == -1 && contains(err_msg(), "test.array_u64_big"),
           "u64 above INT64_MAX: %s", err_msg());
    EXPECT(gguf_get_int_array(&f, "tokenizer.ggml.tokens", &v) == -1 && contains(err_msg(), "tokenizer.ggml.tokens"),
           "strings as ints");
    EXPECT(gguf_get_string_array(&f, "tokenizer.ggml.scores", &v) == -1, "floats as strings");
    EXPECT(gguf_get_array(&f, "test.u8", &v) == -1 && contains(err_msg(), "test.u8"), "scalar as array");
    gguf_close(&f);
}

// --- config_from_gguf ---------------------------------------------------------------

static void test_config_from_gguf(void) {
    GgufFile f;
    OPEN_OR_RETURN(f, TINY_LLAMA);
    ModelConfig c;
    EXPECT(config_from_gguf(&c, &f, TINY_LLAMA) == 0, "%s", err_msg());
    EXPECT(c.family == FAMILY_LLAMA && strcmp(c.model_type, "llama") == 0, "family %d", (int)c.family);
    EXPECT(c.hidden_size == 64 && c.num_layers == 2 && c.num_heads == 4 && c.num_kv_heads == 2, "sizes");
    EXPECT(c.head_dim == 16 && c.intermediate_size == 128 && c.max_position_embeddings == 256, "sizes 2");
    EXPECT(c.vocab_size == 32, "vocab %d (from tokenizer.ggml.tokens)", c.vocab_size);
    EXPECT(c.norm_eps == 1e-5f && c.rope_theta == 100000.0f, "eps %g theta %g", (double)c.norm_eps,
           (double)c.rope_theta);
    EXPECT(c.bos_token_id == 1 && c.eos_token_id == 2 && c.pad_token_id == -1, "special tokens");
    EXPECT(c.tie_word_embeddings, "no output.weight means tied embeddings");
    EXPECT(c.norm == NORM_RMSNORM && c.positions == POSITIONS_ROPE && c.mlp == MLP_SWIGLU, "switches");
    gguf_close(&f);
}

// A minimal metadata-only model file for config tests.
static void build_config_file(Buf *b, const char *arch, bool with_block_count, bool with_vocab_size) {
    char key[96];
    uint64_t n_kv = 7 + (with_block_count ? 1 : 0) + (with_vocab_size ? 1 : 0);
    put_header(b, 0, n_kv);
    put_kv_str(b, "general.architecture", arch);
#define ARCH_KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    put_kv_u32(b, ARCH_KEY("embedding_length"), 96);
    if (with_block_count) put_kv_u32(b, ARCH_KEY("block_count"), 3);
    put_kv_u32(b, ARCH_KEY("attention.head_count"), 4);
    put_kv_u32(b, ARCH_KEY("feed_forward_length"), 200);
    put_kv_u32(b, ARCH_KEY("context_length"), 512);
    put_kv_u32(b, ARCH_KEY("attention.key_length"), 32);
    put_kv_f32(b, ARCH_KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    if (with_vocab_size) put_kv_u32(b, ARCH_KEY("vocab_size"), 1000);
#undef ARCH_KEY
}

static void test_config_variants(void) {
    char *path = tmp_path("config.gguf");
    Buf b = {0};
    GgufFile f;
    ModelConfig c;

    build_config_file(&b, "gemma", true, true);
    write_buf(path, &b);
    EXPECT(gguf_open(&f, path) == 0, "%s", err_msg());
    EXPECT(config_from_gguf(&c, &f, path) == 0, "%s", err_msg());
    EXPECT(c.family == FAMILY_GEMMA && c.head_dim == 32 && c.num_kv_heads == 4 && c.vocab_size == 1000,
           "gemma sizes: head_dim %d kv %d vocab %d", c.head_dim, c.num_kv_heads, c.vocab_size);
    EXPECT(c.rope_theta == 10000.0f && c.bos_token_id == -1, "defaults");
    EXPECT(c.norm_weight_plus_one, "gemma scales by 1 + weight (the loader subtracts the 1 GGUF stores)");
    EXPECT(c.tie_word_embeddings, "tied");
    gguf_close(&f);

    build_config_file(&b, "llama", false, true);
    write_buf(path, &b);
    EXPECT(gguf_open(&f, path) == 0, "%s", err_msg());
    EXPECT(config_from_gguf(&c, &f, path) == -1 && contains(err_msg(), "llama.block_count") &&
               contains(err_msg(), path),
           "missing block_count: %s", err_msg());
    gguf_close(&f);

    build_config_file(&b, "qwen2", true, false);
    write_buf(path, &b);
    EXPECT(gguf_open(&f, path) == 0, "%s", err_msg());
    EXPECT(config_from_gguf(&c, &f, path) == -1 && contains(err_msg(), "qwen2.vocab_size") &&
               contains(err_msg(), "tokenizer.ggml.tokens"),
           "no vocabulary size: %s", err_msg());
    gguf_close(&f);

    build_config_file(&b, "mamba", true, true);
    write_buf(path, &b);
    EXPECT(gguf_open(&f, path) == 0, "%s", err_msg());
    EXPECT(config_from_gguf(&c, &f, path) == -1 && contains(err_msg(), "mamba") && contains(err_msg(), path),
           "unknown architecture: %s", err_msg());
    gguf_close(&f);
    unlink(path);
    free(path);
}

// Writes w's keys to path (freeing w) and reads the model config back from the file.
static int write_and_read_config(GgufWriter *w, ModelConfig *c, const char *path) {
    CHECK(gguf_writer_write(w, path) == 0, "%s", err_msg());
    gguf_writer_free(w);
    GgufFile f;
    CHECK(gguf_open(&f, path) == 0, "%s", err_msg());
    int rc = config_from_gguf(c, &f, path);
    gguf_close(&f);
    return rc;
}

// RoPE scaling as llama.cpp stores it. A tiny llama config (head_dim 16, theta 5e5: the
// wavelengths 6.3 .. 6e5 cross Llama 3's 2048 and 8192 thresholds) with `type` in
// rope.scaling.type (NULL: none) and, unless NULL, `factors` as rope_freqs.weight.
static int rope_config(ModelConfig *c, const char *path, const char *type, const float *factors) {
    GgufWriter *w = gguf_writer_new();
    gguf_writer_add_string(w, "general.architecture", "llama");
    gguf_writer_add_u32(w, "llama.embedding_length", 64);
    gguf_writer_add_u32(w, "llama.block_count", 1);
    gguf_writer_add_u32(w, "llama.attention.head_count", 4);
    gguf_writer_add_u32(w, "llama.feed_forward_length", 128);
    gguf_writer_add_u32(w, "llama.context_length", 256);
    gguf_writer_add_u32(w, "llama.vocab_size", 100);
    gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_add_f32(w, "llama.rope.freq_base", 500000.0f);
    if (type) {
        gguf_writer_add_string(w, "llama.rope.scaling.type", type);
        gguf_writer_add_f32(w, "llama.rope.scaling.factor", 4.0f);
    }
    const int64_t ne[1] = {8};
    if (factors) gguf_writer_add_tensor(w, "rope_freqs.weight", GGML_TYPE_F32, 1, ne, factors);
    return write_and_read_config(w, c, path);
}

// Gemma 2's keys: a tiny gemma2 config whose soft caps are written by `caps` (0: absent,
// 1: 40 / 20, 2: a string, 3: a negative one) and whose window is 128 of a 512 context.
static int gemma2_config(ModelConfig *c, const char *path, int caps) {
    GgufWriter *w = gguf_writer_new();
    gguf_writer_add_string(w, "general.architecture", "gemma2");
    gguf_writer_add_u32(w, "gemma2.embedding_length", 64);
    gguf_writer_add_u32(w, "gemma2.block_count", 2);
    gguf_writer_add_u32(w, "gemma2.attention.head_count", 4);
    gguf_writer_add_u32(w, "gemma2.attention.key_length", 32);
    gguf_writer_add_u32(w, "gemma2.feed_forward_length", 128);
    gguf_writer_add_u32(w, "gemma2.context_length", 512);
    gguf_writer_add_u32(w, "gemma2.attention.sliding_window", 128);
    gguf_writer_add_u32(w, "gemma2.vocab_size", 100);
    gguf_writer_add_f32(w, "gemma2.attention.layer_norm_rms_epsilon", 1e-6f);
    if (caps == 1) gguf_writer_add_f32(w, "gemma2.attn_logit_softcapping", 40.0f);
    if (caps == 2) gguf_writer_add_string(w, "gemma2.attn_logit_softcapping", "fifty");
    if (caps == 3) gguf_writer_add_f32(w, "gemma2.attn_logit_softcapping", -50.0f);
    if (caps == 1) gguf_writer_add_f32(w, "gemma2.final_logit_softcapping", 20.0f);
    return write_and_read_config(w, c, path);
}

static void test_config_gemma2(void) {
    char *path = tmp_path("gemma2.gguf");
    ModelConfig c;
    EXPECT(gemma2_config(&c, path, 1) == 0, "%s", err_msg());
    EXPECT(c.family == FAMILY_GEMMA2 && c.sandwich_norms && c.attn_logit_softcap == 40.0f &&
               c.final_logit_softcap == 20.0f && c.query_pre_attn_scalar == 32.0f && c.max_position_embeddings == 512 &&
               c.sliding_window == 128 && config_layer_window(&c, 0) == 128 && config_layer_window(&c, 1) == 0,
           "gemma2: caps %g / %g, scalar %g, context %d, window %d", (double)c.attn_logit_softcap,
           (double)c.final_logit_softcap, (double)c.query_pre_attn_scalar, c.max_position_embeddings, c.sliding_window);
    EXPECT(gemma2_config(&c, path, 0) == 0 && c.attn_logit_softcap == 50.0f && c.final_logit_softcap == 30.0f,
           "gemma2 without cap keys: llama.cpp's defaults 50 / 30, got %g / %g", (double)c.attn_logit_softcap,
           (double)c.final_logit_softcap);
    EXPECT(gemma2_config(&c, path, 2) == -1 && contains(err_msg(), "gemma2.attn_logit_softcapping") &&
               contains(err_msg(), path),
           "a string soft cap: '%s'", err_msg());
    EXPECT(gemma2_config(&c, path, 3) == -1 && contains(err_msg(), "soft caps") && contains(err_msg(), path),
           "a negative soft cap: '%s'", err_msg());
    free(path);
}

static void test_config_rope_scaling(void) {
    char *path = tmp_path("rope.gguf");
    ModelConfig c, meta = {.head_dim = 16, .rope_theta = 500000.0f, .rope_scaling = ROPE_SCALING_LLAMA3,
                           .rope_factor = 8.0f, .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f,
                           .rope_original_max_positions = 8192};
    float factors[8];
    rope_frequency_factors(&meta, factors);
    EXPECT(factors[0] == 1.0f && factors[7] == 8.0f && factors[4] > 1.0f && factors[4] < 8.0f,
           "Llama 3's divisors: kept, blended, divided (%g %g %g)", factors[0], factors[4], factors[7]);
    // A Llama 3.1 GGUF: the divisors alone, recognised as Meta's settings.
    EXPECT(rope_config(&c, path, NULL, factors) == 0, "%s", err_msg());
    EXPECT(c.rope_scaling == ROPE_SCALING_LLAMA3 && c.rope_factor == 8.0f && c.rope_low_freq_factor == 1.0f &&
               c.rope_high_freq_factor == 4.0f && c.rope_original_max_positions == 8192,
           "read as %d factor %g", (int)c.rope_scaling, (double)c.rope_factor);
    // Divisors of another scaling are refused, not run as plain RoPE.
    factors[4] *= 1.01f;
    EXPECT(rope_config(&c, path, NULL, factors) == -1 && contains(err_msg(), "rope_freqs.weight") &&
               contains(err_msg(), "not Llama 3") && contains(err_msg(), path),
           "other divisors: %s", err_msg());
    EXPECT(rope_config(&c, path, "linear", NULL) == 0 && c.rope_scaling == ROPE_SCALING_LINEAR && c.rope_factor == 4.0f,
           "linear: %s", err_msg());
    EXPECT(rope_config(&c, path, "none", NULL) == 0 && c.rope_scaling == ROPE_SCALING_NONE, "none: %s", err_msg());
    EXPECT(rope_config(&c, path, "yarn", NULL) == -1 && contains(err_msg(), "'yarn'") && contains(err_msg(), path),
           "yarn: %s", err_msg());
    unlink(path);
    free(path);
}

// --- Damaged files ----------------------------------------------------------------

// Every prefix of the file must fail cleanly, until the end of the last tensor's data.
static void test_truncations(void) {
    size_t size;
    char *bytes = read_whole_file(TINY_LLAMA, &size);
    EXPECT(bytes, "cannot read %s", TINY_LLAMA);
    if (!bytes) return;
    GgufFile f;
    EXPECT(gguf_open(&f, TINY_LLAMA) == 0, "%s", err_msg());
    size_t needed = 0, infos_end = f.data_offset;
    for (uint64_t i = 0; i < f.n_tensors; i++) {
        size_t end = (size_t)((const uint8_t *)f.tensors[i].data - f.map) + f.tensors[i].nbytes;
        if (end > needed) needed = end;
    }
    gguf_close(&f);

    char *path = tmp_path("truncated.gguf");
    int failures_ok = 0, wrong = 0;
    for (size_t cut = 0; cut < size; cut++) {
        write_file(path, bytes, cut);
        err_clear();
        int rc = gguf_open(&f, path);
        if (rc == 0) {
            gguf_close(&f);
            if (cut < needed) {
                EXPECT(false, "a file cut at %zu of %zu bytes opened", cut, size);
                wrong++;
            }
            continue;
        }
        bool ok = contains(err_msg(), path);
        // Inside the header, the metadata or the tensor infos: "truncated"; inside the
        // data: the tensor that does not fit.
        if (cut < infos_end - 32) ok = ok && contains(err_msg(), "truncated");
        if (cut >= infos_end && cut < needed) ok = ok && contains(err_msg(), "data lies outside the file");
        if (!ok && wrong++ < 5) EXPECT(false, "cut at %zu: %s", cut, err_msg());
        failures_ok += ok;
        if (wrong > 20) break;
    }
    EXPECT(failures_ok >= (int)needed, "only %d clean failures for %zu cuts", failures_ok, needed);
    // One cut of each kind, with its message shown in the test log.
    write_file(path, bytes, 12);
    expect_open_fails(path, "truncated", "header");
    const char *tokens_key = memmem(bytes, size, "tokenizer.ggml.tokens", 21);
    EXPECT(tokens_key, "no tokens key in %s", TINY_LLAMA);
    if (tokens_key) { // 300 bytes into its array of 32 strings
        write_file(path, bytes, (size_t)(tokens_key - bytes) + 21 + 300);
        expect_open_fails(path, "truncated", "'tokenizer.ggml.tokens'");
    }
    write_file(path, bytes, infos_end - 40);
    expect_open_fails(path, "truncated", "tensor");
    write_file(path, bytes, needed - 1);
    expect_open_fails(path, "data lies outside the file", "output_norm.weight");
    unlink(path);
    free(path);
    free(bytes);
}

static void test_bad_header(void) {
    size_t size;
    char *bytes = read_whole_file(TINY_LLAMA, &size);
    if (!bytes) {
        EXPECT(false, "cannot read %s", TINY_LLAMA);
        return;
    }
    char *path = tmp_path("header.gguf");
    bytes[0] = 'X';
    write_file(path, bytes, size);
    expect_open_fails(path, "bad GGUF magic", NULL);
    bytes[0] = 'G';
    uint32_t version = 7;
    memcpy(bytes + 4, &version, 4);
    write_file(path, bytes, size);
    expect_open_fails(path, "unsupported GGUF version 7", NULL);
    version = 2; // same layout as 3
    memcpy(bytes + 4, &version, 4);
    write_file(path, bytes, size);
    GgufFile f;
    EXPECT(gguf_open(&f, path) == 0, "version 2: %s", err_msg());
    if (f.map) gguf_close(&f);
    version = 3;
    memcpy(bytes + 4, &version, 4);
    uint64_t absurd = 1ULL << 62;
    memcpy(bytes + 16, &absurd, 8); // key/value count
    write_file(path, bytes, size);
    expect_open_fails(path, "key/values", NULL);
    memcpy(bytes + 16, &absurd, 8);
    memcpy(bytes + 8, &absurd, 8); // tensor count
    uint64_t n_kv = 0;
    memcpy(bytes + 16, &n_kv, 8);
    write_file(path, bytes, size);
    expect_open_fails(path, "tensors", NULL);

    expect_open_fails("tests/fixtures/gguf/no-such-file.gguf", "cannot open", NULL);
    expect_open_fails("tests/fixtures/gguf", "not a regular file", NULL);
    write_file(path, "", 0);
    expect_open_fails(path, "truncated", NULL);
    unlink(path);
    free(path);
    free(bytes);
}

// One tensor "t" of 64 F32 values after one key/value; `ne0`, `type`, `offset`,
// `n_dims` are the fields to damage.
static void build_one_tensor(Buf *b, uint32_t n_dims, uint64_t ne0, uint32_t type, uint64_t offset) {
    put_header(b, 1, 1);
    put_kv_str(b, "general.architecture", "llama");
    uint64_t ne[5] = {ne0, 1, 1, 1, 1};
    put_tensor_info(b, "blk.0.attn_q.weight", n_dims, ne, type, offset);
    put_data(b, 32, 256);
}

static void test_bad_tensors(void) {
    char *path = tmp_path("tensor.gguf");
    Buf b = {0};
    GgufFile f;

    build_one_tensor(&b, 1, 64, GGML_TYPE_F32, 0);
    write_buf(path, &b);
    EXPECT(gguf_open(&f, path) == 0, "the undamaged file: %s", err_msg());
    if (f.map) gguf_close(&f);

    build_one_tensor(&b, 1, 64, GGML_TYPE_F32, 64); // 64 + 256 bytes > 256 bytes of data
    write_buf(path, &b);
    expect_open_fails(path, "data lies outside the file", "'blk.0.attn_q.weight'");
    build_one_tensor(&b, 1, 64, GGML_TYPE_F32, UINT64_MAX - 31); // offset + size overflows
    write_buf(path, &b);
    expect_open_fails(path, "data lies outside the file", "blk.0.attn_q.weight");
    build_one_tensor(&b, 1, 64, GGML_TYPE_F32, 4);
    write_buf(path, &b);
    expect_open_fails(path, "alignment", "blk.0.attn_q.weight");
    build_one_tensor(&b, 1, 64, 99, 0);
    write_buf(path, &b);
    expect_open_fails(path, "unknown type id 99", "blk.0.attn_q.weight");
    build_one_tensor(&b, 5, 64, GGML_TYPE_F32, 0);
    write_buf(path, &b);
    expect_open_fails(path, "5 dimensions", "blk.0.attn_q.weight");
    build_one_tensor(&b, 1, 48, GGML_TYPE_Q4_0, 0); // 48 is not a multiple of 32
    write_buf(path, &b);
    expect_open_fails(path, "block size", "blk.0.attn_q.weight");
    build_one_tensor(&b, 1, 1ULL << 63, GGML_TYPE_F32, 0);
    write_buf(path, &b);
    expect_open_fails(path, "absurd size", "blk.0.attn_q.weight");
    build_one_tensor(&b, 1, 1ULL << 62, GGML_TYPE_F32, 0); // elements fit, bytes overflow
    write_buf(path, &b);
    expect_open_fails(path, "blk.0.attn_q.weight", NULL);

    // Two dimensions whose product overflows.
    put_header(&b, 1, 0);
    uint64_t ne[2] = {1ULL << 32, 1ULL << 32};
    put_tensor_info(&b, "big", 2, ne, GGML_TYPE_F32, 0);
    put_data(&b, 32, 64);
    write_buf(path, &b);
    expect_open_fails(path, "absurd size", "'big'");

    // A known type that cannot be converted opens, then fails to convert.
    build_one_tensor(&b, 1, 256, GGML_TYPE_Q8_K, 0);
    put_data(&b, 1, 292);
    write_buf(path, &b);
    EXPECT(gguf_open(&f, path) == 0, "Q8_K file: %s", err_msg());
    if (f.map) {
        float out[256];
        EXPECT(gguf_tensor_to_f32(&f, &f.tensors[0], out) == -1, "Q8_K converted");
        EXPECT(contains(err_msg(), "GGUF tensor 'blk.0.attn_q.weight' has unsupported type 15 (Q8_K)") &&
                   contains(err_msg(), path),
               "message: %s", err_msg());
        gguf_close(&f);
    }

    // Duplicate tensor names.
    put_header(&b, 2, 0);
    uint64_t ne64 = 64;
    put_tensor_info(&b, "dup", 1, &ne64, GGML_TYPE_F32, 0);
    put_tensor_info(&b, "dup", 1, &ne64, GGML_TYPE_F32, 256);
    put_data(&b, 32, 512);
    write_buf(path, &b);
    expect_open_fails(path, "'dup' appears more than once", NULL);

    // A string length of 2^62 in a tensor name.
    put_header(&b, 1, 0);
    put_u64(&b, 1ULL << 62);
    put_data(&b, 1, 64);
    write_buf(path, &b);
    expect_open_fails(path, "truncated", "tensor info #0");
    unlink(path);
    free(path);
}

static void test_bad_metadata(void) {
    char *path = tmp_path("metadata.gguf");
    Buf b = {0};

    // Key length 2^62.
    put_header(&b, 0, 1);
    put_u64(&b, 1ULL << 62);
    put_data(&b, 1, 64);
    write_buf(path, &b);
    expect_open_fails(path, "truncated", "metadata key #0");

    // String value length 2^62.
    put_header(&b, 0, 1);
    put_str(&b, "general.name");
    put_u32(&b, GGUF_TYPE_STRING);
    put_u64(&b, 1ULL << 62);
    put_data(&b, 1, 64);
    write_buf(path, &b);
    expect_open_fails(path, "truncated", "general.name");

    // Array counts of 2^62, of strings and of u32.
    put_header(&b, 0, 1);
    put_array_header(&b, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, 1ULL << 62);
    put_data(&b, 1, 64);
    write_buf(path, &b);
    expect_open_fails(path, "tokenizer.ggml.tokens", "truncated");
    put_header(&b, 0, 1);
    put_array_header(&b, "tokenizer.ggml.token_type", GGUF_TYPE_UINT32, 1ULL << 62);
    put_data(&b, 1, 64);
    write_buf(path, &b);
    expect_open_fails(path, "tokenizer.ggml.token_type", "truncated");

    // A string array whose third string runs past the end.
    put_header(&b, 0, 1);
    put_array_header(&b, "tokenizer.ggml.merges", GGUF_TYPE_STRING, 3);
    put_str(&b, "a b");
    put_str(&b, "c d");
    put_u64(&b, 1000);
    put(&b, "xyz", 3);
    write_buf(path, &b);
    expect_open_fails(path, "tokenizer.ggml.merges", "truncated");

    // Unknown value type, array of arrays, array of unknown type.
    put_header(&b, 0, 1);
    put_str(&b, "general.name");
    put_u32(&b, 13);
    put_data(&b, 1, 64);
    write_buf(path, &b);
    expect_open_fails(path, "unknown value type 13", "general.name");
    put_header(&b, 0, 1);
    put_array_header(&b, "nested", GGUF_TYPE_ARRAY, 1);
    put_data(&b, 1, 64);
    write_buf(path, &b);
    expect_open_fails(path, "array of arrays", "nested");
    put_header(&b, 0, 1);
    put_array_header(&b, "weird", 77, 1);
    put_data(&b, 1, 64);
    write_buf(path, &b);
    expect_open_fails(path, "unknown value type 77", "weird");

    // Duplicate keys; bad alignments.
    put_header(&b, 0, 2);
    put_kv_u32(&b, "a.key", 1);
    put_kv_u32(&b, "a.key", 2);
    write_buf(path, &b);
    expect_open_fails(path, "'a.key' appears more than once", NULL);
    put_header(&b, 0, 1);
    put_kv_u32(&b, "general.alignment", 48);
    write_buf(path, &b);
    expect_open_fails(path, "alignment 48", NULL);
    put_header(&b, 0, 1);
    put_kv_u32(&b, "general.alignment", 0);
    write_buf(path, &b);
    expect_open_fails(path, "alignment 0", NULL);
    put_header(&b, 0, 1);
    put_kv_str(&b, "general.alignment", "32");
    write_buf(path, &b);
    expect_open_fails(path, "general.alignment", "string");

    // Empty strings, an empty array and no tensors are all fine.
    put_header(&b, 0, 2);
    put_kv_str(&b, "", "");
    put_array_header(&b, "empty", GGUF_TYPE_STRING, 0);
    write_buf(path, &b);
    GgufFile f;
    EXPECT(gguf_open(&f, path) == 0, "empty values: %s", err_msg());
    if (f.map) {
        const GgufValue *v;
        EXPECT(gguf_get_string_array(&f, "empty", &v) == 0 && gguf_array_count(v) == 0, "empty array");
        gguf_close(&f);
    }
    unlink(path);
    free(path);
}

// Random byte changes in the header, metadata and tensor infos: every result must be
// a clean success or a clean failure, and a success must keep tensors inside the file.
static void test_random_damage(void) {
    size_t size;
    char *original = read_whole_file(TINY_LLAMA, &size);
    if (!original) {
        EXPECT(false, "cannot read %s", TINY_LLAMA);
        return;
    }
    GgufFile f;
    EXPECT(gguf_open(&f, TINY_LLAMA) == 0, "%s", err_msg());
    size_t damage_end = f.data_offset;
    gguf_close(&f);
    char *bytes = xmalloc(size);
    char *path = tmp_path("damaged.gguf");
    uint64_t state = 0x9e3779b97f4a7c15ULL;
    int opened = 0, bad_messages = 0;
    for (int iter = 0; iter < 1500; iter++) {
        memcpy(bytes, original, size);
        int n_changes = 1 + iter % 4;
        for (int k = 0; k < n_changes; k++) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t at = (size_t)(state >> 33) % damage_end;
            // Mostly small changes of one bit, sometimes a byte set to an extreme.
            if (state & 8)
                bytes[at] = (char)((state >> 12) & 0xff);
            else
                bytes[at] = (char)(bytes[at] ^ (1u << ((state >> 20) & 7)));
        }
        write_file(path, bytes, size);
        err_clear();
        if (gguf_open(&f, path) == 0) {
            opened++;
            for (uint64_t i = 0; i < f.n_tensors; i++) {
                const GgufTensor *t = &f.tensors[i];
                const uint8_t *data = t->data;
                EXPECT(data >= f.map && data + t->nbytes <= f.map + f.size, "iteration %d: tensor outside", iter);
            }
            gguf_close(&f);
        } else if (!contains(err_msg(), path) && bad_messages++ < 5) {
            EXPECT(false, "iteration %d: message without the path: %s", iter, err_msg());
        }
    }
    EXPECT(opened < 1500, "no damage was ever detected");
    unlink(path);
    free(path);
    free(bytes);
    free(original);
}

// The quantizers (io/gguf_quantize.c) through the dequantizers checked bit for bit against
// gguf-py above: on Gaussian data with a few large values, as weights have, each type's
// relative RMS error stays under its bound (a misplaced bit would be far above), Q4_K's
// fitted scales beat Q4_0's, and the one-scale types are fixed points (quantizing
// dequantized values gives them back exactly; Q5_1's scale and minimum too; the K-quants'
// and IQ4_XS's second-level scales are not, nor IQ4_NL's fitted scale). Zero blocks come
// back as zeros. Measured 2026-12-07: IQ4_NL 0.0847, IQ4_XS 0.0846, Q3_K 0.159, Q2_K 0.278.
static void test_quantizers(void) {
    const int64_t n = 4096;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float)), *z = malloc(n * sizeof(float));
    uint64_t state = 12345;
    for (int64_t i = 0; i < n; i++) { // Box-Muller on a SplitMix stream
        double u[2];
        for (int k = 0; k < 2; k++) {
            uint64_t v = (state += 0x9e3779b97f4a7c15ull);
            v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull, v = (v ^ (v >> 27)) * 0x94d049bb133111ebull, v ^= v >> 31;
            u[k] = ((v >> 11) + 0.5) / 9007199254740992.0;
        }
        x[i] = (float)(0.02 * sqrt(-2 * log(u[0])) * cos(2 * M_PI * u[1]));
        if (i % 997 == 0) x[i] *= 8; // outliers
    }
    struct { GgmlType type; double bound; bool fixed_point; } cases[] = {
        {GGML_TYPE_Q8_0, 0.007, true}, {GGML_TYPE_Q6_K, 0.025, false}, {GGML_TYPE_Q5_0, 0.055, true},
        {GGML_TYPE_Q5_1, 0.045, true},  {GGML_TYPE_Q5_K, 0.045, false}, {GGML_TYPE_Q4_K, 0.09, false},
        {GGML_TYPE_Q4_0, 0.115, true}, {GGML_TYPE_IQ4_NL, 0.095, false}, {GGML_TYPE_IQ4_XS, 0.095, false},
        {GGML_TYPE_Q3_K, 0.18, false},  {GGML_TYPE_Q2_K, 0.31, false}};
    double error_q4_k = 0, error_q4_0 = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const GgmlType type = cases[c].type;
        uint8_t *q = malloc(gguf_quantized_size(type, n)), *q2 = malloc(gguf_quantized_size(type, n));
        gguf_quantize(type, x, q, n);
        gguf_dequantize(type, q, y, n);
        double diff = 0, norm = 0;
        for (int64_t i = 0; i < n; i++) diff += (double)(y[i] - x[i]) * (y[i] - x[i]), norm += (double)x[i] * x[i];
        const double error = sqrt(diff / norm);
        printf("# %-5s relative RMS error %.4f (bound %.3f), %zu bytes for %lld values\n", gguf_type_name(type), error,
               cases[c].bound, gguf_quantized_size(type, n), (long long)n);
        EXPECT(error < cases[c].bound, "%s: relative RMS error %.4f", gguf_type_name(type), error);
        if (type == GGML_TYPE_Q4_K) error_q4_k = error;
        if (type == GGML_TYPE_Q4_0) error_q4_0 = error;
        if (cases[c].fixed_point) {
            gguf_quantize(type, y, q2, n);
            gguf_dequantize(type, q2, z, n);
            EXPECT(memcmp(y, z, n * sizeof(float)) == 0, "%s: dequantized values do not quantize to themselves",
                   gguf_type_name(type));
        }
        // A block of zeros comes back as zeros (an all-zero scale must not divide by zero).
        const int block = gguf_type_info(type)->block_size;
        float zeros[256] = {0};
        gguf_quantize(type, zeros, q2, block);
        gguf_dequantize(type, q2, z, block);
        long nonzero = 0;
        for (int i = 0; i < block; i++) nonzero += z[i] != 0.0f;
        EXPECT(nonzero == 0, "%s: %ld of a zero block's values come back nonzero", gguf_type_name(type), nonzero);
        free(q), free(q2);
    }
    EXPECT(error_q4_k < 0.8 * error_q4_0, "Q4_K (%.4f) should beat Q4_0 (%.4f)", error_q4_k, error_q4_0);
    free(x), free(y), free(z);
}

// gguf_quantize splits a long array's blocks between threads: the bytes are those of one
// thread, for every type it writes (a block must find its values from its own input alone).
static void test_quantizers_threads(void) {
    const int64_t n = 512 * 256; // 512 super-blocks: enough blocks of every type to split
    float *x = malloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)(0.03 * sin(0.37 * (double)i) + 0.01 * cos(1.9 * (double)(i % 613)));
    const GgmlType types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                              GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K,
                              GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    const int threads = omp_get_max_threads();
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const size_t bytes = gguf_quantized_size(types[t], n);
        uint8_t *one = malloc(bytes), *several = malloc(bytes);
        omp_set_num_threads(1);
        gguf_quantize(types[t], x, one, n);
        omp_set_num_threads(3); // more than the machine's 2 cores: uneven shares
        gguf_quantize(types[t], x, several, n);
        EXPECT(memcmp(one, several, bytes) == 0, "%s: 3 threads write other bytes than one", gguf_type_name(types[t]));
        free(one), free(several);
    }
    omp_set_num_threads(threads);
    free(x);
}

int main(void) {
    RUN(test_dequant_matches_gguf_py);
    RUN(test_tensor_infos);
    RUN(test_dequant_rows);
    RUN(test_f16_conversion);
    RUN(test_f16_from_f32);
    RUN(test_quantizers);
    RUN(test_quantizers_threads);
    RUN(test_writer_roundtrip);
    RUN(test_metadata_roundtrip);
    RUN(test_config_from_gguf);
    RUN(test_config_gemma2);
    RUN(test_config_variants);
    RUN(test_config_rope_scaling);
    RUN(test_truncations);
    RUN(test_bad_header);
    RUN(test_bad_tensors);
    RUN(test_bad_metadata);
    RUN(test_random_damage);
    TEST_EXIT();
}
