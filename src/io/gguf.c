#include "io/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/check.h"
#include "io/gguf_dequant.h"

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DIMS 4

// A cursor over the mapped bytes. Every read goes through reader_take(), which is the
// one place that compares a length with what is left of the file.
typedef struct {
    const uint8_t *base;
    size_t size;
    size_t pos;
    const char *path;
    // What the reader is inside, for "truncated" messages: "the header",
    // "the value of key 'x'", "the info of tensor 'y'" ...
    char context[256];
} Reader;

__attribute__((format(printf, 2, 3))) static void set_context(Reader *r, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(r->context, sizeof r->context, fmt, args);
    va_end(args);
}

static const uint8_t *reader_take(Reader *r, uint64_t n) {
    if (n > r->size - r->pos) {
        err_set("truncated GGUF file: it ends inside %s (needs %" PRIu64 " more bytes at offset %zu, %zu left) (%s)",
                r->context, n, r->pos, r->size - r->pos, r->path);
        return NULL;
    }
    const uint8_t *p = r->base + r->pos;
    r->pos += (size_t)n;
    return p;
}

static int read_u32(Reader *r, uint32_t *out) {
    const uint8_t *p = reader_take(r, 4);
    if (!p) return -1;
    memcpy(out, p, 4);
    return 0;
}

static int read_u64(Reader *r, uint64_t *out) {
    const uint8_t *p = reader_take(r, 8);
    if (!p) return -1;
    memcpy(out, p, 8);
    return 0;
}

static int read_string(Reader *r, GgufString *out) {
    uint64_t len;
    if (read_u64(r, &len) < 0) return -1;
    if (len > r->size - r->pos)
        return err_set("truncated GGUF file: a string of %" PRIu64 " bytes in %s runs past the end of the file (%s)",
                       len, r->context, r->path);
    out->ptr = (const char *)reader_take(r, len);
    out->len = (size_t)len;
    return 0;
}

static char *string_dup(GgufString s) {
    char *copy = xmalloc(s.len + 1);
    memcpy(copy, s.ptr, s.len);
    copy[s.len] = '\0';
    return copy;
}

const char *gguf_value_type_name(GgufValueType type) {
    static const char *names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    if ((unsigned)type < sizeof names / sizeof names[0]) return names[type];
    return "unknown";
}

// Bytes of one element of a scalar type; 0 for STRING and ARRAY (variable size) and
// for unknown ids.
static size_t scalar_size(uint32_t type) {
    switch (type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static bool is_integer_type(GgufValueType type) {
    switch (type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16:
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64:
        return true;
    default:
        return false;
    }
}

static bool is_float_type(GgufValueType type) {
    return type == GGUF_TYPE_FLOAT32 || type == GGUF_TYPE_FLOAT64;
}

// Decodes one scalar of `type` at p (which the caller has bounds-checked) into v.
static void decode_scalar(GgufValueType type, const uint8_t *p, GgufValue *v) {
    v->type = type;
    switch (type) {
    case GGUF_TYPE_UINT8: v->u64 = p[0]; break;
    case GGUF_TYPE_INT8: v->i64 = (int8_t)p[0]; break;
    case GGUF_TYPE_BOOL: v->b = p[0] != 0; break;
    case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); v->u64 = x; break; }
    case GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); v->i64 = x; break; }
    case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); v->u64 = x; break; }
    case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); v->i64 = x; break; }
    case GGUF_TYPE_FLOAT32: { float x; memcpy(&x, p, 4); v->f64 = x; break; }
    case GGUF_TYPE_UINT64: memcpy(&v->u64, p, 8); break;
    case GGUF_TYPE_INT64: memcpy(&v->i64, p, 8); break;
    case GGUF_TYPE_FLOAT64: memcpy(&v->f64, p, 8); break;
    default: CHECK(false, "decode_scalar called with non-scalar type %d", (int)type);
    }
}

static int read_array(Reader *r, const char *key, GgufValue *v) {
    uint32_t elem_type;
    uint64_t count;
    if (read_u32(r, &elem_type) < 0 || read_u64(r, &count) < 0) return -1;
    v->type = GGUF_TYPE_ARRAY;
    v->arr.elem_type = (GgufValueType)elem_type;
    v->arr.count = 0;
    v->arr.data = NULL;
    v->arr.strings = NULL;
    size_t left = r->size - r->pos;
    if (elem_type == GGUF_TYPE_STRING) {
        // Each string takes at least its 8-byte length, which bounds the allocation.
        if (count > left / 8)
            return err_set("truncated GGUF file: array '%s' claims %" PRIu64
                           " strings, more than the file can hold (%s)",
                           key, count, r->path);
        v->arr.strings = xmalloc((size_t)count * sizeof(GgufString) + 1);
        for (uint64_t i = 0; i < count; i++) {
            if (read_string(r, &v->arr.strings[i]) < 0) return -1;
            v->arr.count = i + 1; // only what has been read, should this fail later
        }
        return 0;
    }
    size_t elem_size = scalar_size(elem_type);
    if (elem_type == GGUF_TYPE_ARRAY)
        return err_set("GGUF key '%s' is an array of arrays, which is not supported (%s)", key, r->path);
    if (elem_size == 0)
        return err_set("GGUF key '%s' is an array of unknown value type %" PRIu32 " (%s)", key, elem_type, r->path);
    if (count > left / elem_size)
        return err_set("truncated GGUF file: array '%s' claims %" PRIu64
                       " elements of %zu bytes, more than the file holds (%s)",
                       key, count, elem_size, r->path);
    v->arr.data = reader_take(r, count * elem_size);
    v->arr.count = count;
    return 0;
}

static int read_value(Reader *r, const char *key, uint32_t type, GgufValue *v) {
    if (type == GGUF_TYPE_STRING) {
        v->type = GGUF_TYPE_STRING;
        return read_string(r, &v->str);
    }
    if (type == GGUF_TYPE_ARRAY) return read_array(r, key, v);
    size_t size = scalar_size(type);
    if (size == 0) return err_set("GGUF key '%s' has unknown value type %" PRIu32 " (%s)", key, type, r->path);
    const uint8_t *p = reader_take(r, size);
    if (!p) return -1;
    decode_scalar((GgufValueType)type, p, v);
    return 0;
}

void gguf_close(GgufFile *f) {
    if (!f) return;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        free(f->kv[i].key);
        if (f->kv[i].value.type == GGUF_TYPE_ARRAY) free(f->kv[i].value.arr.strings);
    }
    free(f->kv);
    for (uint64_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (f->map) munmap((void *)f->map, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// Returns the first name that occurs twice among `count` names, or NULL.
static const char *find_duplicate(char **names, uint64_t count) {
    if (count < 2) return NULL;
    char **sorted = xmalloc((size_t)count * sizeof *sorted);
    memcpy(sorted, names, (size_t)count * sizeof *sorted);
    qsort(sorted, (size_t)count, sizeof *sorted, compare_names);
    const char *duplicate = NULL;
    for (uint64_t i = 1; i < count && !duplicate; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0) duplicate = sorted[i];
    free(sorted);
    return duplicate;
}

// f->n_kv counts the entries read so far, which own memory, for gguf_close() on failure.
static int parse_metadata(GgufFile *f, Reader *r, uint64_t n_kv) {
    // A key/value takes at least 8 (key length) + 4 (type) + 1 (smallest value) bytes.
    if (n_kv > (r->size - r->pos) / 13)
        return err_set("truncated GGUF file: the header claims %" PRIu64
                       " key/values, more than the file can hold (%s)",
                       n_kv, f->path);
    f->kv = xcalloc((size_t)n_kv + 1, sizeof *f->kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        set_context(r, "metadata key #%" PRIu64, i);
        GgufString key;
        uint32_t type;
        if (read_string(r, &key) < 0) return -1;
        GgufKeyValue *kv = &f->kv[i];
        kv->key = string_dup(key);
        kv->value.type = GGUF_TYPE_UINT8; // nothing to free until the value is read
        f->n_kv = i + 1;
        set_context(r, "the value of key '%s'", kv->key);
        if (read_u32(r, &type) < 0) return -1;
        if (read_value(r, kv->key, type, &kv->value) < 0) return -1;
    }
    char **keys = xmalloc((size_t)n_kv * sizeof *keys + 1);
    for (uint64_t i = 0; i < n_kv; i++) keys[i] = f->kv[i].key;
    const char *duplicate = find_duplicate(keys, n_kv);
    int rc = duplicate ? err_set("GGUF key '%s' appears more than once (%s)", duplicate, f->path) : 0;
    free(keys);
    return rc;
}

static int parse_tensor_info(GgufFile *f, Reader *r, GgufTensor *t) {
    uint32_t n_dims, type;
    if (read_u32(r, &n_dims) < 0) return -1;
    if (n_dims > GGUF_MAX_DIMS)
        return err_set("GGUF tensor '%s' has %" PRIu32 " dimensions, at most %d are supported (%s)", t->name,
                       n_dims, GGUF_MAX_DIMS, f->path);
    t->n_dims = (int)n_dims;
    t->n_elements = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        if (read_u64(r, &ne) < 0) return -1;
        if (ne > INT64_MAX || __builtin_mul_overflow(t->n_elements, (int64_t)ne, &t->n_elements))
            return err_set("GGUF tensor '%s' has an absurd size (dimension %" PRIu32 " is %" PRIu64 ") (%s)", t->name,
                           d, ne, f->path);
        t->ne[d] = (int64_t)ne;
    }
    if (read_u32(r, &type) < 0 || read_u64(r, &t->offset) < 0) return -1;
    const GgmlTypeInfo *info = gguf_type_info(type);
    if (!info) return err_set("GGUF tensor '%s' has unknown type id %" PRIu32 " (%s)", t->name, type, f->path);
    t->type = (GgmlType)type;
    if (t->ne[0] % info->block_size != 0)
        return err_set("GGUF tensor '%s' of type %s has rows of %" PRId64
                       " elements, not a multiple of its block size %d (%s)",
                       t->name, info->name, t->ne[0], info->block_size, f->path);
    uint64_t nbytes;
    if (__builtin_mul_overflow((uint64_t)(t->n_elements / info->block_size), (uint64_t)info->type_size, &nbytes))
        return err_set("GGUF tensor '%s' has an absurd size (%" PRId64 " elements) (%s)", t->name, t->n_elements,
                       f->path);
    t->nbytes = (size_t)nbytes;
    return 0;
}

// f->n_tensors counts the tensors read so far, as in parse_metadata().
static int parse_tensor_infos(GgufFile *f, Reader *r, uint64_t n_tensors) {
    // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
    if (n_tensors > (r->size - r->pos) / 24)
        return err_set("truncated GGUF file: the header claims %" PRIu64 " tensors, more than the file can hold (%s)",
                       n_tensors, f->path);
    f->tensors = xcalloc((size_t)n_tensors + 1, sizeof *f->tensors);
    for (uint64_t i = 0; i < n_tensors; i++) {
        set_context(r, "tensor info #%" PRIu64, i);
        GgufString name;
        if (read_string(r, &name) < 0) return -1;
        GgufTensor *t = &f->tensors[i];
        t->name = string_dup(name);
        f->n_tensors = i + 1;
        set_context(r, "the info of tensor '%s'", t->name);
        if (parse_tensor_info(f, r, t) < 0) return -1;
    }
    char **names = xmalloc((size_t)n_tensors * sizeof *names + 1);
    for (uint64_t i = 0; i < n_tensors; i++) names[i] = f->tensors[i].name;
    const char *duplicate = find_duplicate(names, n_tensors);
    int rc = duplicate ? err_set("GGUF tensor '%s' appears more than once (%s)", duplicate, f->path) : 0;
    free(names);
    return rc;
}

// Places every tensor in the data section, which starts at the first multiple of the
// alignment after the tensor infos.
static int locate_tensor_data(GgufFile *f, size_t infos_end) {
    uint64_t a = f->alignment;
    uint64_t data_offset = (infos_end + a - 1) / a * a; // infos_end <= size, so no overflow
    f->data_offset = (size_t)data_offset;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        GgufTensor *t = &f->tensors[i];
        if (t->offset % a != 0)
            return err_set("GGUF tensor '%s' has offset %" PRIu64 ", not a multiple of the alignment %" PRIu32 " (%s)",
                           t->name, t->offset, f->alignment, f->path);
        uint64_t begin, end;
        if (__builtin_add_overflow(data_offset, t->offset, &begin) ||
            __builtin_add_overflow(begin, (uint64_t)t->nbytes, &end) || end > f->size)
            return err_set("GGUF tensor '%s' data lies outside the file (offset %" PRIu64
                           ", %zu bytes, file %zu bytes) (%s)",
                           t->name, t->offset, t->nbytes, f->size, f->path);
        t->data = f->map + begin;
    }
    return 0;
}

static int parse(GgufFile *f) {
    Reader r = {.base = f->map, .size = f->size, .pos = 0, .path = f->path};
    set_context(&r, "the header");
    const uint8_t *magic = reader_take(&r, 4);
    if (!magic) return -1;
    if (memcmp(magic, "GGUF", 4) != 0) return err_set("bad GGUF magic, this is not a GGUF file (%s)", f->path);
    if (read_u32(&r, &f->version) < 0) return -1;
    if (f->version != 2 && f->version != 3)
        return err_set("unsupported GGUF version %" PRIu32 ", expected 2 or 3 (%s)", f->version, f->path);
    uint64_t n_tensors, n_kv;
    if (read_u64(&r, &n_tensors) < 0 || read_u64(&r, &n_kv) < 0) return -1;
    if (parse_metadata(f, &r, n_kv) < 0) return -1;

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (gguf_find(f, "general.alignment")) {
        if (gguf_get_u32(f, "general.alignment", &f->alignment) < 0) return -1;
        if (f->alignment == 0 || (f->alignment & (f->alignment - 1)) != 0)
            return err_set("GGUF general.alignment %" PRIu32 " is not a power of two (%s)", f->alignment, f->path);
    }
    if (parse_tensor_infos(f, &r, n_tensors) < 0) return -1;
    return locate_tensor_data(f, r.pos);
}

int gguf_open(GgufFile *f, const char *path) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set("cannot open GGUF file: %s (%s)", strerror(errno), path);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set("not a regular file (%s)", path);
    }
    size_t size = (size_t)st.st_size;
    if (size < 24) { // magic, version, two counts: the smallest valid file
        close(fd);
        return err_set("truncated GGUF file: %zu bytes is shorter than the GGUF header (%s)", size, path);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); // the mapping stays valid without the descriptor
    if (map == MAP_FAILED) return err_set("cannot map GGUF file: %s (%s)", strerror(map_errno), path);
    f->path = xstrdup(path);
    f->map = map;
    f->size = size;
    if (parse(f) < 0) {
        gguf_close(f);
        return -1;
    }
    return 0;
}

// --- Metadata access ----------------------------------------------------------------

const GgufValue *gguf_find(const GgufFile *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, key) == 0) return &f->kv[i].value;
    return NULL;
}

static const GgufValue *find_required(const GgufFile *f, const char *key) {
    const GgufValue *v = gguf_find(f, key);
    if (!v) err_set("GGUF metadata key '%s' is missing (%s)", key, f->path);
    return v;
}

static int wrong_type(const GgufFile *f, const char *key, const GgufValue *v, const char *expected) {
    return err_set("GGUF metadata key '%s' has type %s, expected %s (%s)", key, gguf_value_type_name(v->type),
                   expected, f->path);
}

static bool is_unsigned_type(GgufValueType type) {
    return type == GGUF_TYPE_UINT8 || type == GGUF_TYPE_UINT16 || type == GGUF_TYPE_UINT32 ||
           type == GGUF_TYPE_UINT64;
}

int gguf_get_i64(const GgufFile *f, const char *key, int64_t *out) {
    const GgufValue *v = find_required(f, key);
    if (!v) return -1;
    if (!is_integer_type(v->type)) return wrong_type(f, key, v, "an integer");
    if (is_unsigned_type(v->type)) {
        if (v->u64 > INT64_MAX)
            return err_set("GGUF metadata key '%s' value %" PRIu64 " is too large (%s)", key, v->u64, f->path);
        *out = (int64_t)v->u64;
    } else {
        *out = v->i64;
    }
    return 0;
}

int gguf_get_u32(const GgufFile *f, const char *key, uint32_t *out) {
    int64_t value;
    if (gguf_get_i64(f, key, &value) < 0) return -1;
    if (value < 0 || value > UINT32_MAX)
        return err_set("GGUF metadata key '%s' value %" PRId64 " is out of range (%s)", key, value, f->path);
    *out = (uint32_t)value;
    return 0;
}

int gguf_get_f32(const GgufFile *f, const char *key, float *out) {
    const GgufValue *v = find_required(f, key);
    if (!v) return -1;
    if (!is_float_type(v->type)) return wrong_type(f, key, v, "a float");
    *out = (float)v->f64;
    return 0;
}

int gguf_get_bool(const GgufFile *f, const char *key, bool *out) {
    const GgufValue *v = find_required(f, key);
    if (!v) return -1;
    if (v->type != GGUF_TYPE_BOOL) return wrong_type(f, key, v, "bool");
    *out = v->b;
    return 0;
}

int gguf_get_string(const GgufFile *f, const char *key, char **out) {
    const GgufValue *v = find_required(f, key);
    if (!v) return -1;
    if (v->type != GGUF_TYPE_STRING) return wrong_type(f, key, v, "string");
    *out = string_dup(v->str);
    return 0;
}

int gguf_get_array(const GgufFile *f, const char *key, const GgufValue **out) {
    const GgufValue *v = find_required(f, key);
    if (!v) return -1;
    if (v->type != GGUF_TYPE_ARRAY) return wrong_type(f, key, v, "array");
    *out = v;
    return 0;
}

static int wrong_elem_type(const GgufFile *f, const char *key, const GgufValue *v, const char *expected) {
    return err_set("GGUF metadata key '%s' is an array of %s, expected an array of %s (%s)", key,
                   gguf_value_type_name(v->arr.elem_type), expected, f->path);
}

int gguf_get_string_array(const GgufFile *f, const char *key, const GgufValue **out) {
    if (gguf_get_array(f, key, out) < 0) return -1;
    if ((*out)->arr.elem_type != GGUF_TYPE_STRING) return wrong_elem_type(f, key, *out, "strings");
    return 0;
}

int gguf_get_int_array(const GgufFile *f, const char *key, const GgufValue **out) {
    if (gguf_get_array(f, key, out) < 0) return -1;
    const GgufValue *v = *out;
    if (!is_integer_type(v->arr.elem_type)) return wrong_elem_type(f, key, v, "integers");
    // gguf_array_int() returns int64_t, so a u64 element must fit in one.
    if (v->arr.elem_type == GGUF_TYPE_UINT64) {
        for (uint64_t i = 0; i < v->arr.count; i++) {
            uint64_t x;
            memcpy(&x, v->arr.data + i * 8, 8);
            if (x > INT64_MAX)
                return err_set("GGUF metadata array '%s' element %" PRIu64 " value %" PRIu64 " is too large (%s)", key,
                               i, x, f->path);
        }
    }
    return 0;
}

int gguf_get_float_array(const GgufFile *f, const char *key, const GgufValue **out) {
    if (gguf_get_array(f, key, out) < 0) return -1;
    if (!is_float_type((*out)->arr.elem_type)) return wrong_elem_type(f, key, *out, "floats");
    return 0;
}

uint64_t gguf_array_count(const GgufValue *array) {
    CHECK(array->type == GGUF_TYPE_ARRAY, "gguf_array_count on a %s value", gguf_value_type_name(array->type));
    return array->arr.count;
}

GgufString gguf_array_string(const GgufValue *array, uint64_t i) {
    CHECK(array->type == GGUF_TYPE_ARRAY && array->arr.elem_type == GGUF_TYPE_STRING,
          "gguf_array_string on a value that is not an array of strings");
    CHECK(i < array->arr.count, "array index %" PRIu64 " out of range %" PRIu64, i, array->arr.count);
    return array->arr.strings[i];
}

static GgufValue array_element(const GgufValue *array, uint64_t i) {
    CHECK(array->type == GGUF_TYPE_ARRAY, "array access on a %s value", gguf_value_type_name(array->type));
    CHECK(i < array->arr.count, "array index %" PRIu64 " out of range %" PRIu64, i, array->arr.count);
    size_t size = scalar_size(array->arr.elem_type);
    CHECK(size > 0, "array of %s accessed as numbers", gguf_value_type_name(array->arr.elem_type));
    GgufValue v;
    decode_scalar(array->arr.elem_type, array->arr.data + i * size, &v);
    return v;
}

int64_t gguf_array_int(const GgufValue *array, uint64_t i) {
    GgufValue v = array_element(array, i);
    if (v.type == GGUF_TYPE_BOOL) return v.b;
    CHECK(is_integer_type(v.type), "array of %s accessed as integers", gguf_value_type_name(v.type));
    if (!is_unsigned_type(v.type)) return v.i64;
    CHECK(v.u64 <= INT64_MAX, "array element %" PRIu64 " does not fit in int64", v.u64);
    return (int64_t)v.u64;
}

double gguf_array_float(const GgufValue *array, uint64_t i) {
    GgufValue v = array_element(array, i);
    CHECK(is_float_type(v.type), "array of %s accessed as floats", gguf_value_type_name(v.type));
    return v.f64;
}

const GgufTensor *gguf_find_tensor(const GgufFile *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}
