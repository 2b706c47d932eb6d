// Tests of io/safetensors and io/fs: every dtype read exactly, sharded sets, the
// writer (bit-exact round trip), atomic files and folders, and corrupt inputs, each
// of which must be a clean error naming the file and the tensor.
//
// Fixtures come from tools/make_safetensors_fixtures.py. Scratch files go under
// $MARLHF_TEST_TMP/test_safetensors (default /tmp); st_roundtrip.safetensors there is
// left for tools/check_safetensors_roundtrip.py, which checks it loads in Python.
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/check.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "test.h"

#define FIXTURES "tests/fixtures/safetensors"

static char scratch[1024];

static const char *tmp_path(const char *name) {
    static char paths[8][4096];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", scratch, name);
    return p;
}

// rc must be -1 and the message must name every given piece (file, tensor, ...).
#define EXPECT_ERROR(rc, ...)                                                            \
    do {                                                                                 \
        int expect_rc_ = (rc);                                                           \
        EXPECT(expect_rc_ == -1, "rc %d", expect_rc_);                                   \
        const char *expect_pieces_[] = {__VA_ARGS__};                                    \
        for (size_t k_ = 0; k_ < sizeof expect_pieces_ / sizeof expect_pieces_[0]; k_++) \
            EXPECT(strstr(err_msg(), expect_pieces_[k_]), "message '%s' lacks '%s'",     \
                   err_msg(), expect_pieces_[k_]);                                       \
    } while (0)

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// True if some entry of `folder` contains `piece` in its name.
static bool folder_has(const char *folder, const char *piece) {
    DIR *dir = opendir(folder);
    if (!dir) return false;
    bool found = false;
    for (struct dirent *e; (e = readdir(dir));)
        if (strstr(e->d_name, piece)) found = true;
    closedir(dir);
    return found;
}

static void test_dtypes_read_exactly(void) {
    SafetensorsSet *set = NULL, *expected = NULL;
    EXPECT(safetensors_open(FIXTURES "/dtypes.safetensors", &set) == 0, "%s", err_msg());
    EXPECT(safetensors_open(FIXTURES "/dtypes_expected.safetensors", &expected) == 0, "%s", err_msg());
    if (!set || !expected) return;
    EXPECT(safetensors_tensor_count(set) == 12, "%d tensors", safetensors_tensor_count(set));
    EXPECT(safetensors_metadata(set, "fixture") && strcmp(safetensors_metadata(set, "fixture"), "dtypes") == 0,
           "metadata");
    EXPECT(safetensors_metadata(set, "absent") == NULL, "absent metadata");

    const struct {
        const char *name;
        SafetensorsDtype dtype;
        int ndim;
        long long dims[2];
    } floats[] = {
        {"f32", SAFETENSORS_F32, 2, {2, 8}}, {"f16", SAFETENSORS_F16, 1, {16}},
        {"bf16", SAFETENSORS_BF16, 2, {4, 4}}, {"f64", SAFETENSORS_F64, 1, {14}},
        {"scalar", SAFETENSORS_F32, 0, {0}},  {"empty", SAFETENSORS_F32, 2, {0, 4}},
    };
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        const SafetensorsTensor *t = safetensors_find(set, floats[i].name);
        const SafetensorsTensor *e = safetensors_find(expected, floats[i].name);
        EXPECT(t && e, "tensor %s", floats[i].name);
        if (!t || !e) continue;
        EXPECT(t->dtype == floats[i].dtype, "%s dtype %s", t->name, safetensors_dtype_name(t->dtype));
        EXPECT(safetensors_check_shape(t, floats[i].ndim, floats[i].dims) == 0, "%s", err_msg());
        EXPECT(strcmp(t->file, FIXTURES "/dtypes.safetensors") == 0, "file %s", t->file);
        float got[32], want[32];
        EXPECT(t->count <= 32 && t->count == e->count, "%s count %lld", t->name, t->count);
        EXPECT(safetensors_read_f32(t, got, t->count) == 0, "%s", err_msg());
        EXPECT(safetensors_read_f32(e, want, e->count) == 0, "%s", err_msg());
        for (long long k = 0; k < t->count; k++)
            EXPECT(bits_of(got[k]) == bits_of(want[k]), "%s[%lld]: 0x%08x, expected 0x%08x", t->name, k,
                   bits_of(got[k]), bits_of(want[k]));
    }
    const char *ints[] = {"i64", "i32", "i16", "i8", "u8", "bool"};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        const SafetensorsTensor *t = safetensors_find(set, ints[i]);
        const SafetensorsTensor *e = safetensors_find(expected, ints[i]);
        EXPECT(t && e && e->dtype == SAFETENSORS_I64, "tensor %s", ints[i]);
        if (!t || !e) continue;
        int64_t got[8], want[8];
        EXPECT(safetensors_read_i64(t, got, t->count) == 0, "%s", err_msg());
        EXPECT(safetensors_read_i64(e, want, e->count) == 0, "%s", err_msg());
        for (long long k = 0; k < t->count; k++)
            EXPECT(got[k] == want[k], "%s[%lld]: %lld, expected %lld", t->name, k, (long long)got[k],
                   (long long)want[k]);
    }
    const SafetensorsTensor *i64 = safetensors_find(set, "i64"), *f32 = safetensors_find(set, "f32");
    int64_t ids[6];
    float values[16];
    EXPECT(safetensors_read_i64(i64, ids, 6) == 0 && ids[0] == INT64_MIN && ids[1] == INT64_MAX && ids[5] == 50256, "i64 extremes");
    EXPECT_ERROR(safetensors_read_f32(i64, values, 6), "'i64'", "I64", "dtypes.safetensors");
    EXPECT_ERROR(safetensors_read_i64(f32, ids, 16), "'f32'", "F32", "dtypes.safetensors");
    EXPECT_ERROR(safetensors_read_f32(f32, values, 15), "'f32'", "16 elements", "dtypes.safetensors");
    EXPECT_ERROR(safetensors_check_shape(f32, 2, (long long[]){8, 2}),
                 "tensor 'f32' has shape [2, 8] but the model expects [8, 2] (" FIXTURES "/dtypes.safetensors)");
    EXPECT_ERROR(safetensors_load_f32(set, "nope", 1, (long long[]){1}, values), "'nope'", "dtypes.safetensors");
    EXPECT(safetensors_load_f32(set, "f32", 2, (long long[]){2, 8}, values) == 0 && values[2] == 1.0f, "load");
    safetensors_close(set);
    safetensors_close(expected);
}

// Every binary16 pattern against an independent computation from the definition.
static void test_f16_all_patterns(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
        float got = f16_bits_to_f32((uint16_t)h);
        if (exponent == 31 && mantissa != 0) {
            EXPECT(bits_of(got) == ((sign << 31) | 0x7f800000u | (mantissa << 13)), "NaN 0x%04x", h);
            continue;
        }
        double magnitude = exponent == 31 ? INFINITY
                           : exponent == 0 ? ldexp(mantissa, -24)
                                           : ldexp(1024 + mantissa, (int)exponent - 25);
        float want = (float)(sign ? -magnitude : magnitude);
        EXPECT(bits_of(got) == bits_of(want), "0x%04x -> 0x%08x, expected 0x%08x", h, bits_of(got), bits_of(want));
    }
    EXPECT(bits_of(bf16_bits_to_f32(0x7f81)) == 0x7f810000u, "bf16 NaN payload");
}

static void check_sharded(const SafetensorsSet *set) {
    static const struct {
        const char *name;
        int ndim;
        long long dims[2];
        SafetensorsDtype dtype;
        const char *shard;
    } expected[] = {
        {"model.embed_tokens.weight", 2, {8, 4}, SAFETENSORS_F32, "model-00001-of-00002"},
        {"model.layers.0.input_layernorm.weight", 1, {4}, SAFETENSORS_F32, "model-00001-of-00002"},
        {"model.layers.0.self_attn.q_proj.weight", 2, {4, 4}, SAFETENSORS_F32, "model-00001-of-00002"},
        {"model.layers.0.mlp.up_proj.weight", 2, {6, 4}, SAFETENSORS_BF16, "model-00002-of-00002"},
        {"model.norm.weight", 1, {4}, SAFETENSORS_F32, "model-00002-of-00002"},
        {"lm_head.weight", 2, {8, 4}, SAFETENSORS_F16, "model-00002-of-00002"},
    };
    EXPECT(safetensors_tensor_count(set) == 6, "%d tensors", safetensors_tensor_count(set));
    for (int k = 0; k < 6; k++) {
        float values[64];
        EXPECT(safetensors_load_f32(set, expected[k].name, expected[k].ndim, expected[k].dims, values) == 0, "%s",
               err_msg());
        const SafetensorsTensor *t = safetensors_find(set, expected[k].name);
        if (!t) continue;
        EXPECT(t->dtype == expected[k].dtype && strstr(t->file, expected[k].shard), "%s in %s", t->name, t->file);
        for (long long i = 0; i < t->count; i++)
            EXPECT(values[i] == (float)(i % 17) * 0.25f - 2 + (float)k, "%s[%lld] = %g", t->name, i, values[i]);
    }
    // Storage order: shard by shard.
    EXPECT(strstr(safetensors_tensor_at(set, 0)->file, "00001") && strstr(safetensors_tensor_at(set, 5)->file, "00002"),
           "order");
    EXPECT(safetensors_find(set, "model.layers.1.mlp.up_proj.weight") == NULL, "absent");
    EXPECT(strcmp(safetensors_metadata(set, "format"), "pt") == 0, "format");
}

static void test_sharded_set(void) {
    SafetensorsSet *set;
    EXPECT(safetensors_open(FIXTURES "/sharded", &set) == 0, "%s", err_msg());
    if (set) {
        check_sharded(set);
        EXPECT(strcmp(safetensors_set_path(set), FIXTURES "/sharded") == 0, "path");
        const SafetensorsTensor *t;
        EXPECT_ERROR(safetensors_require(set, "ghost.weight", &t), "'ghost.weight'", FIXTURES "/sharded");
        safetensors_close(set);
    }
    EXPECT(safetensors_open(FIXTURES "/sharded/model.safetensors.index.json", &set) == 0, "%s", err_msg());
    if (set) check_sharded(set);
    safetensors_close(set);
}

// The contents of st_roundtrip.safetensors; tools/check_safetensors_roundtrip.py
// recomputes the same values.
static const uint32_t special_bits[6] = {0x80000000u, 0x00000001u, 0x7f800000u,
                                         0xff800000u, 0x7fc00123u, 0x7f7fffffu};
static const int64_t token_ids[6] = {0, 1, -1, INT64_MAX, INT64_MIN, 50256};

static void test_write_read_roundtrip(void) {
    float weights[15], specials[6];
    for (int i = 0; i < 15; i++) weights[i] = (float)(i - 7) / 4.0f;
    for (int i = 0; i < 6; i++) specials[i] = float_of(special_bits[i]);
    int32_t step = 42;
    SafetensorsWriteTensor tensors[] = {
        {.name = "weights", .dtype = SAFETENSORS_F32, .ndim = 2, .shape = {3, 5}, .data = weights},
        {.name = "specials", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {6}, .data = specials},
        {.name = "token_ids", .dtype = SAFETENSORS_I64, .ndim = 2, .shape = {2, 3}, .data = token_ids},
        {.name = "step", .dtype = SAFETENSORS_I32, .ndim = 0, .shape = {0}, .data = &step},
        {.name = "empty", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {0}, .data = NULL},
    };
    const char *metadata[] = {"producer", "marlhf test_safetensors roundtrip", "note", "\xc3\xbcnicode \xe2\x9c\x93",
                              NULL};
    const char *path = tmp_path("st_roundtrip.safetensors");
    EXPECT(safetensors_write(path, tensors, 5, metadata) == 0, "%s", err_msg());
    EXPECT(!folder_has(scratch, ".tmp-"), "temporary file left behind");

    char *bytes;
    size_t size;
    EXPECT(fs_read_file(path, 1 << 20, &bytes, &size) == 0, "%s", err_msg());
    if (!bytes) return;
    uint64_t header_length;
    memcpy(&header_length, bytes, 8);
    EXPECT(header_length % 8 == 0 && 8 + header_length + 60 + 24 + 48 + 4 == size, "header %llu, size %zu",
           (unsigned long long)header_length, size);
    EXPECT(bytes[8] == '{' && bytes[8 + header_length - 1] != '\0', "header text");
    EXPECT(strstr(bytes + 8, "\"format\":\"pt\""), "default format metadata");
    free(bytes);

    SafetensorsSet *set;
    EXPECT(safetensors_open(path, &set) == 0, "%s", err_msg());
    if (!set) return;
    for (int i = 0; i < 5; i++)
        EXPECT(strcmp(safetensors_tensor_at(set, i)->name, tensors[i].name) == 0, "order %d", i);
    float got[15];
    EXPECT(safetensors_load_f32(set, "weights", 2, (long long[]){3, 5}, got) == 0, "%s", err_msg());
    EXPECT(memcmp(got, weights, sizeof weights) == 0, "weights differ");
    EXPECT(safetensors_f32_data(safetensors_find(set, "weights")) != NULL, "aligned zero-copy data");
    EXPECT(safetensors_load_f32(set, "specials", 1, (long long[]){6}, got) == 0, "%s", err_msg());
    for (int i = 0; i < 6; i++) EXPECT(bits_of(got[i]) == special_bits[i], "special %d: 0x%08x", i, bits_of(got[i]));
    int64_t ids[6];
    EXPECT(safetensors_read_i64(safetensors_find(set, "token_ids"), ids, 6) == 0, "%s", err_msg());
    EXPECT(memcmp(ids, token_ids, sizeof ids) == 0, "ids differ");
    const SafetensorsTensor *step_tensor = safetensors_find(set, "step");
    EXPECT(step_tensor && step_tensor->ndim == 0 && step_tensor->dtype == SAFETENSORS_I32, "scalar");
    EXPECT(safetensors_read_i64(step_tensor, ids, 1) == 0 && ids[0] == 42, "step");
    EXPECT(safetensors_find(set, "empty")->count == 0, "empty");
    EXPECT(strcmp(safetensors_metadata(set, "note"), "\xc3\xbcnicode \xe2\x9c\x93") == 0, "utf-8 metadata");
    EXPECT(strcmp(safetensors_metadata(set, "format"), "pt") == 0, "format");
    safetensors_close(set);
}

// A tensor whose data comes piece by piece (SafetensorsWriteTensor.fill, how a sharded
// optimizer's moments are written): pieces in order and consecutive, the file the same bytes
// as from a whole buffer; and after a failed file every piece is still asked for (a producer
// fed by other processes must reach its end).
typedef struct {
    long long next, pieces;
    bool in_order;
} FillRecord;

static void fill_ramp(void *context, long long first, long long count, void *out) {
    FillRecord *record = context;
    record->in_order &= first == record->next;
    record->next = first + count, record->pieces++;
    for (long long i = 0; i < count; i++) ((float *)out)[i] = (float)((first + i) % 1000) - 500.0f;
}

static void test_write_with_fill(void) {
    const long long n = (1LL << 20) * 2 + 37; // three pieces, the last short
    float *whole = xmalloc((size_t)n * sizeof(float));
    FillRecord expected = {0};
    fill_ramp(&expected, 0, n, whole);
    int64_t step = 3;
    FillRecord record = {.in_order = true};
    SafetensorsWriteTensor filled[] = {
        {.name = "adam.m", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {n}, .fill = fill_ramp, .fill_context = &record},
        {.name = "adam.step", .dtype = SAFETENSORS_I64, .ndim = 1, .shape = {1}, .data = &step},
    };
    SafetensorsWriteTensor plain[] = {
        {.name = "adam.m", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {n}, .data = whole},
        {.name = "adam.step", .dtype = SAFETENSORS_I64, .ndim = 1, .shape = {1}, .data = &step},
    };
    const char *path_filled = tmp_path("filled.safetensors"), *path_plain = tmp_path("plain.safetensors");
    EXPECT(safetensors_write(path_filled, filled, 2, NULL) == 0, "%s", err_msg());
    EXPECT(record.in_order && record.pieces == 3 && record.next == n, "pieces %lld, in order %d, end %lld",
           record.pieces, record.in_order, record.next);
    CHECK(safetensors_write(path_plain, plain, 2, NULL) == 0, "%s", err_msg());
    char *a = NULL, *b = NULL;
    size_t size_a = 0, size_b = 0;
    EXPECT(fs_read_file(path_filled, 1 << 26, &a, &size_a) == 0 && fs_read_file(path_plain, 1 << 26, &b, &size_b) == 0 &&
               size_a == size_b && memcmp(a, b, size_a) == 0,
           "the filled file differs from the plain one");
    free(a), free(b);
    record = (FillRecord){.in_order = true};
    const char *nowhere = tmp_path("no/such/folder/filled.safetensors");
    EXPECT_ERROR(safetensors_write(nowhere, filled, 2, NULL), "no/such/folder");
    EXPECT(record.pieces == 3 && record.next == n, "after a failed file: %lld pieces", record.pieces);
    free(whole);
}

static void test_writer_rejects(void) {
    float x[2] = {1, 2};
    const char *path = tmp_path("rejected.safetensors");
    SafetensorsWriteTensor twice[] = {{.name = "a", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {2}, .data = x}, {.name = "a", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {2}, .data = x}};
    EXPECT_ERROR(safetensors_write(path, twice, 2, NULL), "'a'", "twice", path);
    SafetensorsWriteTensor reserved[] = {{.name = "__metadata__", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {2}, .data = x}};
    EXPECT_ERROR(safetensors_write(path, reserved, 1, NULL), "__metadata__", path);
    SafetensorsWriteTensor no_data[] = {{.name = "w", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {2}, .data = NULL}};
    EXPECT_ERROR(safetensors_write(path, no_data, 1, NULL), "'w'", path);
    SafetensorsWriteTensor bad_utf8[] = {{.name = "\xff", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {2}, .data = x}};
    EXPECT_ERROR(safetensors_write(path, bad_utf8, 1, NULL), "UTF-8", path);
    SafetensorsWriteTensor ok[] = {{.name = "w", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {2}, .data = x}};
    EXPECT_ERROR(safetensors_write(tmp_path("no/such/folder/x.safetensors"), ok, 1, NULL), "no/such/folder");
    EXPECT(!fs_exists(path) && !folder_has(scratch, ".tmp-"), "nothing written");
}

static void read_text(const char *path, char *out, size_t size) {
    char *data;
    size_t n;
    out[0] = '\0';
    if (fs_read_file(path, 1 << 20, &data, &n) == 0) {
        snprintf(out, size, "%s", data);
        free(data);
    }
}

// A writer that dies or fails half-way must leave the previous file as it was.
static void test_atomic_file(void) {
    const char *path = tmp_path("atomic.txt");
    char text[64];
    EXPECT(fs_write_file_atomic(path, "old contents", 12) == 0, "%s", err_msg());
    read_text(path, text, sizeof text);
    EXPECT(strcmp(text, "old contents") == 0, "got '%s'", text);

    FsAtomicFile file;
    EXPECT(fs_atomic_file_begin(&file, path) == 0, "%s", err_msg());
    EXPECT(fs_atomic_file_write(&file, "new", 3) == 0, "%s", err_msg());
    EXPECT(folder_has(scratch, "atomic.txt.tmp-"), "temporary file while writing");
    fs_atomic_file_abort(&file);
    read_text(path, text, sizeof text);
    EXPECT(strcmp(text, "old contents") == 0 && !folder_has(scratch, ".tmp-"), "abort: '%s'", text);

    // A crash half-way: the child writes part of a file and exits without commit.
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        FsAtomicFile f;
        if (fs_atomic_file_begin(&f, path) == 0) fs_atomic_file_write(&f, "half", 4);
        _exit(0);
    }
    waitpid(child, NULL, 0);
    read_text(path, text, sizeof text);
    EXPECT(strcmp(text, "old contents") == 0, "after crash: '%s'", text);
    char stale[4200];
    snprintf(stale, sizeof stale, "%s.tmp-%ld", path, (long)child);
    EXPECT(fs_is_file(stale), "a crash leaves only the temporary file %s", stale);
    unlink(stale);

    // A real write failure (file size limit, like a full disk) in a child process.
    child = fork();
    if (child == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit limit = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &limit);
        size_t big = 1 << 20;
        char *data = calloc(big, 1);
        int rc = fs_write_file_atomic(path, data, big);
        int ok = rc == -1 && strstr(err_msg(), path) && strstr(err_msg(), "too large");
        float *weights = calloc(big, 4);
        SafetensorsWriteTensor t[] = {{.name = "w", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {(long long)big}, .data = weights}};
        rc = safetensors_write(path, t, 1, NULL);
        ok = ok && rc == -1 && strstr(err_msg(), path);
        if (!ok) fprintf(stderr, "  child: rc %d, message '%s'\n", rc, err_msg());
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "failing write in child: status %d", status);
    read_text(path, text, sizeof text);
    EXPECT(strcmp(text, "old contents") == 0, "after failed write: '%s'", text);
    EXPECT(!folder_has(scratch, ".tmp-"), "failed write left a temporary file");

    EXPECT(fs_write_file_atomic(path, "new contents", 12) == 0, "%s", err_msg());
    read_text(path, text, sizeof text);
    EXPECT(strcmp(text, "new contents") == 0 && !folder_has(scratch, ".tmp-"), "replaced: '%s'", text);
    EXPECT_ERROR(fs_write_file_atomic(scratch, "x", 1), "folder", scratch);
}

static void test_atomic_dir(void) {
    const char *path = tmp_path("checkpoint");
    FsAtomicDir dir;
    EXPECT(fs_atomic_dir_begin(&dir, path) == 0, "%s", err_msg());
    char *file = fs_join(dir.tmp_path, "a.txt");
    EXPECT(fs_write_file_atomic(file, "first", 5) == 0, "%s", err_msg());
    free(file);
    EXPECT(!fs_exists(path), "not visible before commit");
    EXPECT(fs_atomic_dir_commit(&dir) == 0, "%s", err_msg());
    EXPECT(fs_is_file(tmp_path("checkpoint/a.txt")), "committed");

    // Replacing: the old folder's files go, the new ones appear, nothing is left over.
    EXPECT(fs_atomic_dir_begin(&dir, path) == 0, "%s", err_msg());
    file = fs_join(dir.tmp_path, "b.txt");
    EXPECT(fs_write_file_atomic(file, "second", 6) == 0, "%s", err_msg());
    free(file);
    EXPECT(fs_atomic_dir_commit(&dir) == 0, "%s", err_msg());
    EXPECT(fs_is_file(tmp_path("checkpoint/b.txt")) && !fs_exists(tmp_path("checkpoint/a.txt")), "replaced");
    EXPECT(!folder_has(scratch, "checkpoint.tmp-") && !folder_has(scratch, "checkpoint.old-"), "leftovers");

    // Abort: the committed folder stays as it was.
    EXPECT(fs_atomic_dir_begin(&dir, path) == 0, "%s", err_msg());
    file = fs_join(dir.tmp_path, "c.txt");
    EXPECT(fs_write_file_atomic(file, "third", 5) == 0, "%s", err_msg());
    free(file);
    fs_atomic_dir_abort(&dir);
    EXPECT(fs_is_file(tmp_path("checkpoint/b.txt")) && !fs_exists(tmp_path("checkpoint/c.txt")), "abort");
    EXPECT(!folder_has(scratch, "checkpoint.tmp-"), "abort leftovers");

    // Nested new parents are created.
    EXPECT(fs_atomic_dir_begin(&dir, tmp_path("runs/deep/ckpt")) == 0, "%s", err_msg());
    EXPECT(fs_atomic_dir_commit(&dir) == 0 && fs_is_dir(tmp_path("runs/deep/ckpt")), "%s", err_msg());
    EXPECT_ERROR(fs_atomic_dir_begin(&dir, tmp_path("atomic.txt")), "atomic.txt");
}

static void test_fs_helpers(void) {
    const struct {
        const char *dir, *name, *joined;
    } joins[] = {{"a", "b", "a/b"}, {"a/", "b", "a/b"}, {"", "b", "b"}, {"a", "/abs", "/abs"}};
    for (size_t i = 0; i < sizeof joins / sizeof joins[0]; i++) {
        char *j = fs_join(joins[i].dir, joins[i].name);
        EXPECT(strcmp(j, joins[i].joined) == 0, "join -> '%s'", j);
        free(j);
    }
    const char *dirnames[][2] = {{"a/b/c", "a/b"}, {"c", "."}, {"/c", "/"}, {"/", "/"}, {"a//b", "a"}, {"a/b/", "a"}};
    for (size_t i = 0; i < sizeof dirnames / sizeof dirnames[0]; i++) {
        char *d = fs_dirname(dirnames[i][0]);
        EXPECT(strcmp(d, dirnames[i][1]) == 0, "dirname(%s) = '%s'", dirnames[i][0], d);
        free(d);
    }
    EXPECT(fs_mkdir_p(tmp_path("x/y//z/")) == 0 && fs_is_dir(tmp_path("x/y/z")), "%s", err_msg());
    EXPECT(fs_mkdir_p(tmp_path("x/y")) == 0, "existing folder");
    EXPECT(fs_write_file_atomic(tmp_path("x/file"), "12345", 5) == 0, "%s", err_msg());
    EXPECT_ERROR(fs_mkdir_p(tmp_path("x/file/sub")), "x/file");
    EXPECT(fs_is_file(tmp_path("x/file")) && !fs_is_dir(tmp_path("x/file")) && fs_exists(tmp_path("x")), "kinds");
    char *data;
    size_t size;
    EXPECT(fs_read_file(tmp_path("x/file"), 5, &data, &size) == 0 && size == 5 && data[5] == '\0', "read");
    free(data);
    EXPECT_ERROR(fs_read_file(tmp_path("x/file"), 4, &data, &size), "limit", "x/file");
    EXPECT_ERROR(fs_read_file(tmp_path("x/missing"), 4, &data, &size), "x/missing");
    EXPECT_ERROR(fs_read_file(tmp_path("x"), 4, &data, &size), "regular");
    EXPECT(fs_remove_tree(tmp_path("x")) == 0 && !fs_exists(tmp_path("x")), "%s", err_msg());
    EXPECT(fs_remove_tree(tmp_path("x")) == 0, "missing tree");
}

// A file with the given header text and data; header_length_override < 0 keeps the true length.
static void write_raw(const char *path, const char *header, const void *data, size_t data_size,
                      long long header_length_override) {
    size_t n = strlen(header);
    char *bytes = xmalloc(8 + n + data_size);
    uint64_t length = header_length_override >= 0 ? (uint64_t)header_length_override : n;
    memcpy(bytes, &length, 8);
    memcpy(bytes + 8, header, n);
    if (data_size) memcpy(bytes + 8 + n, data, data_size);
    CHECK(fs_write_file_atomic(path, bytes, 8 + n + data_size) == 0, "%s", err_msg());
    free(bytes);
}

static int open_fails(const char *path) {
    SafetensorsSet *set = (SafetensorsSet *)1;
    int rc = safetensors_open(path, &set);
    EXPECT(rc == 0 || set == NULL, "set must be NULL on failure");
    if (rc == 0) safetensors_close(set);
    return rc;
}

static void test_bad_files(void) {
    // A valid file to cut.
    float x[6] = {1, 2, 3, 4, 5, 6};
    SafetensorsWriteTensor tensors[] = {{.name = "a.weight", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {2}, .data = x},
                                        {.name = "b.weight", .dtype = SAFETENSORS_F32, .ndim = 2, .shape = {2, 2}, .data = x + 2}};
    const char *good = tmp_path("good.safetensors");
    EXPECT(safetensors_write(good, tensors, 2, NULL) == 0, "%s", err_msg());
    char *bytes;
    size_t size;
    EXPECT(fs_read_file(good, 1 << 20, &bytes, &size) == 0, "%s", err_msg());
    if (!bytes) return;
    uint64_t header_length;
    memcpy(&header_length, bytes, 8);
    size_t cuts[] = {0, 4, 7, 8, 12, 8 + header_length - 1, 8 + header_length, 8 + header_length + 3, size - 1};
    const char *cut_path = tmp_path("cut.safetensors");
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        CHECK(fs_write_file_atomic(cut_path, bytes, cuts[i]) == 0, "%s", err_msg());
        EXPECT_ERROR(open_fails(cut_path), "truncated", cut_path);
        if (cuts[i] > 8 + header_length) EXPECT(strstr(err_msg(), ".weight'"), "cut %zu: %s", cuts[i], err_msg());
    }
    free(bytes);

    const char *path = tmp_path("bad.safetensors");
    const char *entry = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    write_raw(path, entry, x, 8, 1ll << 40);
    EXPECT_ERROR(open_fails(path), "truncated", path);
    // Header length above the 100 MB limit, in a (sparse) file big enough to hold it.
    write_raw(path, entry, x, 8, 150000000);
    CHECK(truncate(path, 200000000) == 0, "truncate");
    EXPECT_ERROR(open_fails(path), "limit", path);

    const float zeros[16] = {0};
    const struct {
        const char *header;
        size_t data_size;
        const char *pieces[2];
    } cases[] = {
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", 8, {"bad JSON", "line 1 column"}},
        {"[1, 2]  ", 0, {"'{'", ""}},
        {"{\"w\":{\"dtype\":\"Q9\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, {"'w'", "'Q9'"}},
        {"{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, {"'w'", "dtype"}},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,400]}}", 8, {"'w'", "bytes"}},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[0,400]}}", 8, {"'w'", "truncated"}},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, {"'w'", "end before"}},
        {"{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[0,10]}}", 10,
         {"safetensors tensor 'model.norm.weight' has 10 bytes but shape [64] of F32 needs 256 (", ""}},
        {"{\"u\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, {"overlap", "'v'"}},
        {"{\"u\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         12, {"unused bytes", "'v'"}},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16, {"after the last tensor", ""}},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         8, {"duplicate", "bad JSON"}},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, {"'w'", "shape"}},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, {"'w'", "shape"}},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, {"'w'", "shape"}},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,8]}}", 8,
         {"'w'", "too large"}},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,16]}}", 8, {"'w'", "data_offsets"}},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, {"'w'", "data_offsets"}},
        {"{\"w\":[1]}", 0, {"'w'", "object"}},
        {"{\"__metadata__\":{\"format\":1}}", 0, {"'format'", "metadata"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_raw(path, cases[i].header, zeros, cases[i].data_size, -1);
        EXPECT_ERROR(open_fails(path), cases[i].pieces[0], cases[i].pieces[1], path);
    }
    // Valid corner cases: no tensors at all; header padded with spaces.
    write_raw(path, "{}", NULL, 0, -1);
    EXPECT(open_fails(path) == 0, "empty file list: %s", err_msg());
    write_raw(path, "{\"__metadata__\":{\"k\":\"v\"}}      ", NULL, 0, -1);
    EXPECT(open_fails(path) == 0, "padded header: %s", err_msg());
    EXPECT_ERROR(open_fails(tmp_path("missing.safetensors")), "missing.safetensors");
    EXPECT_ERROR(open_fails(scratch), "neither", scratch);
}

// Copies the fixture shards into `folder` and writes `index` as its index.
static void make_shard_folder(const char *folder, const char *index) {
    CHECK(fs_mkdir_p(folder) == 0, "%s", err_msg());
    const char *shards[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *from = fs_join(FIXTURES "/sharded", shards[i]), *to = fs_join(folder, shards[i]);
        char *data;
        size_t size;
        CHECK(fs_read_file(from, 1 << 20, &data, &size) == 0, "%s", err_msg());
        CHECK(fs_write_file_atomic(to, data, size) == 0, "%s", err_msg());
        free(data);
        free(from);
        free(to);
    }
    char *index_path = fs_join(folder, "model.safetensors.index.json");
    CHECK(fs_write_file_atomic(index_path, index, strlen(index)) == 0, "%s", err_msg());
    free(index_path);
}

static void test_bad_sharded(void) {
    // The true map, with %s slots for tampering: the value of lm_head and one extra entry.
    const char *format = "{\"weight_map\": {\"lm_head.weight\": \"%s\", "
                         "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\", "
                         "\"model.layers.0.input_layernorm.weight\": \"model-00001-of-00002.safetensors\", "
                         "\"model.layers.0.mlp.up_proj.weight\": \"model-00002-of-00002.safetensors\", "
                         "\"model.layers.0.self_attn.q_proj.weight\": \"model-00001-of-00002.safetensors\"%s}}";
    const char *norm = ", \"model.norm.weight\": \"model-00002-of-00002.safetensors\"";
    const char *shard2 = "model-00002-of-00002.safetensors";
    const struct {
        const char *lm_head, *extra;
        const char *pieces[2];
    } cases[] = {
        {shard2, "", {"'model.norm.weight'", "does not list"}},
        {"model-00003-of-00002.safetensors", norm, {"'model-00003-of-00002.safetensors'", "missing"}},
        {"model-00001-of-00002.safetensors", norm, {"'lm_head.weight'", "model-00001-of-00002"}},
        {shard2, ", \"ghost\": \"model-00001-of-00002.safetensors\", \"model.norm.weight\": \"model-00002-of-00002.safetensors\"",
         {"'ghost'", "does not have it"}},
        {"../model-00002-of-00002.safetensors", norm, {"'lm_head.weight'", "not a file in its folder"}},
    };
    char index[2048];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char folder[64];
        snprintf(folder, sizeof folder, "shards%zu", i);
        snprintf(index, sizeof index, format, cases[i].lm_head, cases[i].extra);
        make_shard_folder(tmp_path(folder), index);
        EXPECT_ERROR(open_fails(tmp_path(folder)), cases[i].pieces[0], cases[i].pieces[1],
                     "model.safetensors.index.json");
    }
    // The untampered map opens (so the failures above are the tampering's).
    snprintf(index, sizeof index, format, shard2, norm);
    make_shard_folder(tmp_path("shards_ok"), index);
    EXPECT(open_fails(tmp_path("shards_ok")) == 0, "%s", err_msg());

    make_shard_folder(tmp_path("shards_json"), "{\"weight_map\": {\"a\": }");
    EXPECT_ERROR(open_fails(tmp_path("shards_json")), "bad JSON in safetensors index at line 1", "shards_json");
    make_shard_folder(tmp_path("shards_nomap"), "{\"metadata\": {}}");
    EXPECT_ERROR(open_fails(tmp_path("shards_nomap")), "weight_map", "shards_nomap");
    make_shard_folder(tmp_path("shards_type"), "{\"weight_map\": {\"a\": 3}}");
    EXPECT_ERROR(open_fails(tmp_path("shards_type")), "'a'", "shards_type");
}

int main(void) {
    const char *tmp = getenv("MARLHF_TEST_TMP");
    snprintf(scratch, sizeof scratch, "%s/test_safetensors", tmp && tmp[0] ? tmp : "/tmp");
    CHECK(fs_remove_tree(scratch) == 0 && fs_mkdir_p(scratch) == 0, "%s", err_msg());
    RUN(test_dtypes_read_exactly);
    RUN(test_f16_all_patterns);
    RUN(test_sharded_set);
    RUN(test_write_read_roundtrip);
    RUN(test_write_with_fill);
    RUN(test_writer_rejects);
    RUN(test_atomic_file);
    RUN(test_atomic_dir);
    RUN(test_fs_helpers);
    RUN(test_bad_files);
    RUN(test_bad_sharded);
    TEST_EXIT();
}
