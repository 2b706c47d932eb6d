#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/bf16.h"
#include "core/check.h"
#include "io/fs.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian and is used without byte swapping");

static const struct {
    const char *name;
    size_t size;
} dtype_info[] = {
    [SAFETENSORS_F32] = {"F32", 4},         [SAFETENSORS_F16] = {"F16", 2},
    [SAFETENSORS_BF16] = {"BF16", 2},       [SAFETENSORS_F64] = {"F64", 8},
    [SAFETENSORS_I64] = {"I64", 8},         [SAFETENSORS_I32] = {"I32", 4},
    [SAFETENSORS_I16] = {"I16", 2},         [SAFETENSORS_I8] = {"I8", 1},
    [SAFETENSORS_U64] = {"U64", 8},         [SAFETENSORS_U32] = {"U32", 4},
    [SAFETENSORS_U16] = {"U16", 2},         [SAFETENSORS_U8] = {"U8", 1},
    [SAFETENSORS_BOOL] = {"BOOL", 1},       [SAFETENSORS_F8_E4M3] = {"F8_E4M3", 1},
    [SAFETENSORS_F8_E5M2] = {"F8_E5M2", 1},
};
enum { DTYPE_COUNT = sizeof dtype_info / sizeof dtype_info[0] };

const char *safetensors_dtype_name(SafetensorsDtype dtype) {
    CHECK((unsigned)dtype < DTYPE_COUNT, "bad safetensors dtype %d", (int)dtype);
    return dtype_info[dtype].name;
}

size_t safetensors_dtype_size(SafetensorsDtype dtype) {
    CHECK((unsigned)dtype < DTYPE_COUNT, "bad safetensors dtype %d", (int)dtype);
    return dtype_info[dtype].size;
}

int safetensors_dtype_from_name(const char *name, SafetensorsDtype *dtype) {
    for (int i = 0; i < DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *dtype = (SafetensorsDtype)i;
            return 0;
        }
    }
    return -1;
}

// "[2, 3]"; "[]" for a scalar.
static void format_shape(char *buf, size_t size, int ndim, const long long *dims) {
    size_t at = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%lld", i ? ", " : "", dims[i]);
    if (at < size) snprintf(buf + at, size - at, "]");
}

// Element count of a shape, or -1 when it (or count * element_size) does not fit in
// 63 bits: such a tensor cannot be in any file we can map.
static long long shape_count(int ndim, const long long *dims, size_t element_size) {
    long long count = 1;
    for (int i = 0; i < ndim; i++)
        if (dims[i] < 0 || __builtin_mul_overflow(count, dims[i], &count)) return -1;
    long long bytes;
    if (__builtin_mul_overflow(count, (long long)element_size, &bytes)) return -1;
    return count;
}

// --- the set ---------------------------------------------------------------------

typedef struct {
    char *path;
    unsigned char *map;
    size_t map_size;
    char **metadata; // key, value, key, value ...
    int metadata_count;
} MappedFile;

struct SafetensorsSet {
    char *path;
    MappedFile *files;
    int file_count;
    SafetensorsTensor *tensors;
    int tensor_count, tensor_capacity;
    SafetensorsTensor **by_name; // sorted by name, for lookup
};

void safetensors_close(SafetensorsSet *set) {
    if (!set) return;
    for (int i = 0; i < set->file_count; i++) {
        MappedFile *file = &set->files[i];
        if (file->map) munmap(file->map, file->map_size);
        for (int k = 0; k < 2 * file->metadata_count; k++) free(file->metadata[k]);
        free(file->metadata);
        free(file->path);
    }
    for (int i = 0; i < set->tensor_count; i++) free((char *)set->tensors[i].name);
    free(set->files);
    free(set->tensors);
    free(set->by_name);
    free(set->path);
    free(set);
}

const char *safetensors_set_path(const SafetensorsSet *set) { return set->path; }
int safetensors_tensor_count(const SafetensorsSet *set) { return set->tensor_count; }

const SafetensorsTensor *safetensors_tensor_at(const SafetensorsSet *set, int index) {
    CHECK(index >= 0 && index < set->tensor_count, "tensor index %d out of range", index);
    return &set->tensors[index];
}

static int compare_tensor_names(const void *a, const void *b) {
    const SafetensorsTensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static int compare_name_to_tensor(const void *key, const void *element) {
    const SafetensorsTensor *const *t = element;
    return strcmp(key, (*t)->name);
}

const SafetensorsTensor *safetensors_find(const SafetensorsSet *set, const char *name) {
    if (!set->by_name) return NULL;
    SafetensorsTensor **hit = bsearch(name, set->by_name, (size_t)set->tensor_count,
                                      sizeof *set->by_name, compare_name_to_tensor);
    return hit ? *hit : NULL;
}

int safetensors_require(const SafetensorsSet *set, const char *name, const SafetensorsTensor **tensor) {
    *tensor = safetensors_find(set, name);
    if (!*tensor) return err_set("safetensors has no tensor '%s' (%s)", name, set->path);
    return 0;
}

const char *safetensors_metadata(const SafetensorsSet *set, const char *key) {
    for (int i = 0; i < set->file_count; i++)
        for (int k = 0; k < set->files[i].metadata_count; k++)
            if (strcmp(set->files[i].metadata[2 * k], key) == 0) return set->files[i].metadata[2 * k + 1];
    return NULL;
}

// Sorts the lookup table; a name in two files is an error.
static int build_name_index(SafetensorsSet *set) {
    set->by_name = xmalloc((size_t)(set->tensor_count ? set->tensor_count : 1) * sizeof *set->by_name);
    for (int i = 0; i < set->tensor_count; i++) set->by_name[i] = &set->tensors[i];
    qsort(set->by_name, (size_t)set->tensor_count, sizeof *set->by_name, compare_tensor_names);
    for (int i = 1; i < set->tensor_count; i++)
        if (strcmp(set->by_name[i - 1]->name, set->by_name[i]->name) == 0)
            return err_set("safetensors tensor '%s' is in both %s and %s", set->by_name[i]->name,
                           set->by_name[i - 1]->file, set->by_name[i]->file);
    return 0;
}

// --- one file --------------------------------------------------------------------

typedef struct {
    unsigned long long begin, end;
    int tensor; // index in set->tensors
} Extent;

static int compare_extents(const void *a, const void *b) {
    const Extent *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->tensor - y->tensor;
}

static int parse_metadata(MappedFile *file, json_t *metadata) {
    if (json_is_null(metadata)) return 0;
    if (!json_is_object(metadata))
        return err_set("safetensors __metadata__ is not an object (%s)", file->path);
    file->metadata = xcalloc(2 * json_object_size(metadata) + 1, sizeof *file->metadata);
    const char *key;
    json_t *value;
    json_object_foreach(metadata, key, value) {
        if (!json_is_string(value))
            return err_set("safetensors __metadata__ value '%s' is not a string (%s)", key, file->path);
        file->metadata[2 * file->metadata_count] = xstrdup(key);
        file->metadata[2 * file->metadata_count + 1] = xstrdup(json_string_value(value));
        file->metadata_count++;
    }
    return 0;
}

// Reads a JSON array of non-negative integers into out[0..*n) (at most max_n).
static int read_int_array(json_t *array, long long *out, int max_n, int *n) {
    if (!json_is_array(array) || json_array_size(array) > (size_t)max_n) return -1;
    *n = (int)json_array_size(array);
    for (int i = 0; i < *n; i++) {
        json_t *item = json_array_get(array, (size_t)i);
        if (!json_is_integer(item) || json_integer_value(item) < 0) return -1;
        out[i] = json_integer_value(item);
    }
    return 0;
}

static int parse_tensor_entry(MappedFile *file, const char *name, json_t *entry,
                              unsigned long long data_size, SafetensorsTensor *t, Extent *extent) {
    const char *path = file->path;
    if (!json_is_object(entry)) return err_set("safetensors tensor '%s' is not an object (%s)", name, path);
    json_t *dtype = json_object_get(entry, "dtype");
    if (!json_is_string(dtype))
        return err_set("safetensors tensor '%s' has no string 'dtype' (%s)", name, path);
    if (safetensors_dtype_from_name(json_string_value(dtype), &t->dtype) != 0)
        return err_set("safetensors tensor '%s' has unknown dtype '%s' (%s)", name,
                       json_string_value(dtype), path);
    if (read_int_array(json_object_get(entry, "shape"), t->shape, SAFETENSORS_MAX_DIMS, &t->ndim) != 0)
        return err_set("safetensors tensor '%s' has no 'shape' list of at most %d non-negative integers (%s)",
                       name, SAFETENSORS_MAX_DIMS, path);
    long long offsets[2];
    int n_offsets;
    if (read_int_array(json_object_get(entry, "data_offsets"), offsets, 2, &n_offsets) != 0 ||
        n_offsets != 2)
        return err_set("safetensors tensor '%s' has no 'data_offsets' pair of non-negative integers (%s)",
                       name, path);
    if (offsets[1] < offsets[0])
        return err_set("safetensors tensor '%s' has data_offsets [%lld, %lld] that end before they begin (%s)",
                       name, offsets[0], offsets[1], path);
    char shape_text[256];
    format_shape(shape_text, sizeof shape_text, t->ndim, t->shape);
    size_t element_size = dtype_info[t->dtype].size;
    t->count = shape_count(t->ndim, t->shape, element_size);
    if (t->count < 0)
        return err_set("safetensors tensor '%s' has shape %s that is too large (%s)", name, shape_text, path);
    unsigned long long needed = (unsigned long long)t->count * element_size;
    unsigned long long have = (unsigned long long)(offsets[1] - offsets[0]);
    if (have != needed)
        return err_set("safetensors tensor '%s' has %llu bytes but shape %s of %s needs %llu (%s)", name,
                       have, shape_text, dtype_info[t->dtype].name, needed, path);
    if ((unsigned long long)offsets[1] > data_size)
        return err_set("truncated safetensors file: tensor '%s' ends at byte %lld of the data section, "
                       "which has only %llu bytes (%s)",
                       name, offsets[1], data_size, path);
    t->nbytes = (size_t)needed;
    extent->begin = (unsigned long long)offsets[0];
    extent->end = (unsigned long long)offsets[1];
    return 0;
}

// The reference implementation demands that the tensors tile the data section.
static int check_layout(const MappedFile *file, const SafetensorsTensor *tensors, Extent *extents,
                        int n, unsigned long long data_size) {
    qsort(extents, (size_t)n, sizeof *extents, compare_extents);
    unsigned long long at = 0;
    for (int i = 0; i < n; i++) {
        if (extents[i].begin < at)
            return err_set("safetensors tensors '%s' and '%s' overlap (%s)",
                           tensors[extents[i - 1].tensor].name, tensors[extents[i].tensor].name, file->path);
        if (extents[i].begin > at)
            return err_set("safetensors data section has unused bytes %llu..%llu before tensor '%s' (%s)", at,
                           extents[i].begin, tensors[extents[i].tensor].name, file->path);
        at = extents[i].end;
    }
    if (at != data_size)
        return err_set("safetensors data section has %llu bytes after the last tensor (%s)", data_size - at,
                       file->path);
    return 0;
}

static int parse_header(SafetensorsSet *set, MappedFile *file) {
    const char *path = file->path;
    unsigned long long header_size;
    memcpy(&header_size, file->map, 8);
    unsigned long long after = (unsigned long long)file->map_size - 8;
    if (header_size > after)
        return err_set("truncated safetensors file: header length %llu is more than the %llu bytes after it (%s)",
                       header_size, after, path);
    if (header_size > SAFETENSORS_MAX_HEADER_BYTES)
        return err_set("safetensors header length %llu exceeds the limit of %llu bytes (%s)", header_size,
                       SAFETENSORS_MAX_HEADER_BYTES, path);
    const char *header = (const char *)file->map + 8;
    if (header_size == 0 || header[0] != '{')
        return err_set("safetensors header does not start with '{' (%s)", path);
    json_error_t error;
    json_t *root = json_loadb(header, (size_t)header_size, JSON_REJECT_DUPLICATES, &error);
    if (!root)
        return err_set("bad JSON in safetensors header at line %d column %d: %s (%s)", error.line,
                       error.column, error.text, path);
    int rc = 0;
    if (!json_is_object(root)) rc = err_set("safetensors header is not a JSON object (%s)", path);
    unsigned long long data_size = after - header_size;
    const unsigned char *data = file->map + 8 + header_size;
    size_t max_new = json_object_size(root);
    if (rc == 0 && set->tensor_count + max_new > (size_t)set->tensor_capacity) {
        set->tensor_capacity = set->tensor_count + (int)max_new;
        set->tensors = xrealloc(set->tensors, (size_t)set->tensor_capacity * sizeof *set->tensors);
    }
    Extent *extents = xmalloc((max_new ? max_new : 1) * sizeof *extents);
    int n = 0;
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (rc != 0) break;
        if (strcmp(key, "__metadata__") == 0) {
            rc = parse_metadata(file, value);
            continue;
        }
        SafetensorsTensor *t = &set->tensors[set->tensor_count];
        memset(t, 0, sizeof *t);
        rc = parse_tensor_entry(file, key, value, data_size, t, &extents[n]);
        if (rc != 0) break;
        t->name = xstrdup(key);
        t->file = file->path;
        t->data = data + extents[n].begin;
        extents[n].tensor = set->tensor_count;
        set->tensor_count++;
        n++;
    }
    if (rc == 0) rc = check_layout(file, set->tensors, extents, n, data_size);
    // Storage order: by offset within the file.
    if (rc == 0 && n > 0) {
        int first = set->tensor_count - n;
        SafetensorsTensor *ordered = xmalloc((size_t)n * sizeof *ordered);
        for (int i = 0; i < n; i++) ordered[i] = set->tensors[extents[i].tensor];
        memcpy(&set->tensors[first], ordered, (size_t)n * sizeof *ordered);
        free(ordered);
    }
    free(extents);
    json_decref(root);
    return rc;
}

static int map_file(SafetensorsSet *set, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set("cannot open safetensors file: %s (%s)", strerror(errno), path);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set("not a regular file (%s)", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return err_set("truncated safetensors file: %lld bytes cannot hold the 8-byte header length (%s)",
                       (long long)st.st_size, path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) return err_set("cannot map safetensors file: %s (%s)", strerror(map_errno), path);
    set->files = xrealloc(set->files, (size_t)(set->file_count + 1) * sizeof *set->files);
    MappedFile *file = &set->files[set->file_count++];
    memset(file, 0, sizeof *file);
    file->path = xstrdup(path);
    file->map = map;
    file->map_size = (size_t)st.st_size;
    return parse_header(set, file);
}

static int open_single(SafetensorsSet *set, const char *path) {
    if (map_file(set, path) != 0) return -1;
    return build_name_index(set);
}

// --- sharded set -----------------------------------------------------------------

// A shard must be a plain relative name inside the index's folder.
static bool is_safe_relative_path(const char *name) {
    if (name[0] == '\0' || name[0] == '/') return false;
    for (const char *p = name; *p;) {
        size_t len = strcspn(p, "/");
        if (len == 2 && p[0] == '.' && p[1] == '.') return false;
        p += len;
        if (*p == '/') p++;
    }
    return true;
}

static int compare_strings(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int open_index_json(SafetensorsSet *set, const char *index_path, json_t *root) {
    json_t *weight_map = json_object_get(root, "weight_map");
    if (!json_is_object(weight_map))
        return err_set("safetensors index has no 'weight_map' object (%s)", index_path);
    // Distinct shard names, sorted so that storage order does not depend on hashing.
    size_t entries = json_object_size(weight_map);
    const char **shards = xmalloc((entries ? entries : 1) * sizeof *shards);
    int shard_count = 0;
    const char *name;
    json_t *value;
    int rc = 0;
    json_object_foreach(weight_map, name, value) {
        if (!json_is_string(value)) {
            rc = err_set("safetensors index maps tensor '%s' to something that is not a file name (%s)", name,
                         index_path);
            break;
        }
        const char *shard = json_string_value(value);
        if (!is_safe_relative_path(shard)) {
            rc = err_set("safetensors index puts tensor '%s' in '%s', which is not a file in its folder (%s)",
                         name, shard, index_path);
            break;
        }
        bool seen = false;
        for (int i = 0; i < shard_count && !seen; i++) seen = strcmp(shards[i], shard) == 0;
        if (!seen) shards[shard_count++] = shard;
    }
    if (rc == 0 && shard_count == 0) rc = err_set("safetensors index lists no tensors (%s)", index_path);
    if (rc != 0) {
        free(shards);
        return -1;
    }
    qsort(shards, (size_t)shard_count, sizeof *shards, compare_strings);
    char *folder = fs_dirname(index_path);
    for (int i = 0; i < shard_count && rc == 0; i++) {
        char *shard_path = fs_join(folder, shards[i]);
        if (!fs_exists(shard_path))
            rc = err_set("safetensors shard '%s' named in the index is missing (%s)", shards[i], index_path);
        else
            rc = map_file(set, shard_path);
        free(shard_path);
    }
    free(folder);
    if (rc == 0) rc = build_name_index(set);
    // Index and shards must agree both ways.
    for (int i = 0; i < set->tensor_count && rc == 0; i++) {
        const SafetensorsTensor *t = &set->tensors[i];
        int file_index = 0;
        while (set->files[file_index].path != t->file) file_index++;
        json_t *listed = json_object_get(weight_map, t->name);
        if (!listed)
            rc = err_set("safetensors shard '%s' has tensor '%s', which the index does not list (%s)",
                         shards[file_index], t->name, index_path);
        else if (strcmp(json_string_value(listed), shards[file_index]) != 0)
            rc = err_set("safetensors index puts tensor '%s' in '%s' but it is in '%s' (%s)", t->name,
                         json_string_value(listed), shards[file_index], index_path);
    }
    if (rc == 0) {
        json_object_foreach(weight_map, name, value) {
            if (!safetensors_find(set, name)) {
                rc = err_set("safetensors index lists tensor '%s' in '%s', which does not have it (%s)", name,
                             json_string_value(value), index_path);
                break;
            }
        }
    }
    free(shards);
    return rc;
}

static int open_index(SafetensorsSet *set, const char *index_path) {
    char *text;
    size_t size;
    if (fs_read_file(index_path, SAFETENSORS_MAX_HEADER_BYTES, &text, &size) != 0) return -1;
    json_error_t error;
    json_t *root = json_loadb(text, size, JSON_REJECT_DUPLICATES, &error);
    free(text);
    if (!root)
        return err_set("bad JSON in safetensors index at line %d column %d: %s (%s)", error.line, error.column,
                       error.text, index_path);
    int rc = json_is_object(root) ? open_index_json(set, index_path, root)
                                  : err_set("safetensors index is not a JSON object (%s)", index_path);
    json_decref(root);
    return rc;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int safetensors_open(const char *path, SafetensorsSet **out) {
    *out = NULL;
    SafetensorsSet *set = xcalloc(1, sizeof *set);
    set->path = xstrdup(path);
    int rc;
    if (fs_is_dir(path)) {
        char *single = fs_join(path, "model.safetensors");
        char *index = fs_join(path, "model.safetensors.index.json");
        // transformers looks for the single file first, and so do we.
        if (fs_exists(single))
            rc = open_single(set, single);
        else if (fs_exists(index))
            rc = open_index(set, index);
        else
            rc = err_set("folder has neither model.safetensors nor model.safetensors.index.json (%s)", path);
        free(single);
        free(index);
    } else if (ends_with(path, ".json")) {
        rc = open_index(set, path);
    } else {
        rc = open_single(set, path);
    }
    if (rc != 0) {
        safetensors_close(set);
        return -1;
    }
    *out = set;
    return 0;
}

// --- conversion ------------------------------------------------------------------

float f16_bits_to_f32(uint16_t bits) {
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1fu;
    uint32_t mantissa = bits & 0x3ffu;
    uint32_t out;
    if (exponent == 0x1f) {
        out = sign | 0x7f800000u | (mantissa << 13); // inf, NaN with its payload
    } else if (exponent != 0) {
        out = sign | ((exponent + 112) << 23) | (mantissa << 13); // rebias 15 -> 127
    } else if (mantissa == 0) {
        out = sign; // +-0
    } else {
        // Subnormal half: every one is a normal float. Shift the leading 1 into the
        // implicit position, lowering the exponent once per shift.
        uint32_t e = 113;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            e--;
        }
        out = sign | (e << 23) | ((mantissa & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &out, 4);
    return f;
}

float bf16_bits_to_f32(uint16_t bits) { return bf16_value(bits); }

static int check_count(const SafetensorsTensor *t, long long count) {
    if (count != t->count)
        return err_set("tensor '%s' has %lld elements but %lld were expected (%s)", t->name, t->count, count,
                       t->file);
    return 0;
}

int safetensors_read_f32(const SafetensorsTensor *t, float *dst, long long count) {
    if (check_count(t, count) != 0) return -1;
    const unsigned char *src = t->data;
    switch (t->dtype) {
    case SAFETENSORS_F32:
        if (t->nbytes) memcpy(dst, src, t->nbytes);
        return 0;
    case SAFETENSORS_F16:
    case SAFETENSORS_BF16: {
        float (*convert)(uint16_t) = t->dtype == SAFETENSORS_F16 ? f16_bits_to_f32 : bf16_bits_to_f32;
        for (long long i = 0; i < count; i++) {
            uint16_t bits;
            memcpy(&bits, src + 2 * i, 2);
            dst[i] = convert(bits);
        }
        return 0;
    }
    case SAFETENSORS_F64:
        for (long long i = 0; i < count; i++) {
            double value;
            memcpy(&value, src + 8 * i, 8);
            dst[i] = (float)value;
        }
        return 0;
    default:
        return err_set("tensor '%s' has dtype %s, which does not convert to F32 (%s)", t->name,
                       dtype_info[t->dtype].name, t->file);
    }
}

int safetensors_read_i64(const SafetensorsTensor *t, int64_t *dst, long long count) {
    if (check_count(t, count) != 0) return -1;
    switch (t->dtype) {
    case SAFETENSORS_I64: case SAFETENSORS_I32: case SAFETENSORS_I16: case SAFETENSORS_I8:
    case SAFETENSORS_U64: case SAFETENSORS_U32: case SAFETENSORS_U16: case SAFETENSORS_U8:
    case SAFETENSORS_BOOL:
        break;
    default:
        return err_set("tensor '%s' has dtype %s, which does not convert to I64 (%s)", t->name,
                       dtype_info[t->dtype].name, t->file);
    }
    const unsigned char *src = t->data;
    size_t size = dtype_info[t->dtype].size;
    for (long long i = 0; i < count; i++) {
        const unsigned char *p = src + size * (size_t)i;
        int64_t value = 0;
        switch (t->dtype) {
        case SAFETENSORS_I64: memcpy(&value, p, 8); break;
        case SAFETENSORS_I32: { int32_t v; memcpy(&v, p, 4); value = v; } break;
        case SAFETENSORS_I16: { int16_t v; memcpy(&v, p, 2); value = v; } break;
        case SAFETENSORS_I8: value = (int8_t)*p; break;
        case SAFETENSORS_U32: { uint32_t v; memcpy(&v, p, 4); value = v; } break;
        case SAFETENSORS_U16: { uint16_t v; memcpy(&v, p, 2); value = v; } break;
        case SAFETENSORS_U64: {
            uint64_t v;
            memcpy(&v, p, 8);
            if (v > (uint64_t)INT64_MAX)
                return err_set("tensor '%s' element %lld is %llu, too large for I64 (%s)", t->name, i,
                               (unsigned long long)v, t->file);
            value = (int64_t)v;
        } break;
        default: value = *p; break; // U8, BOOL
        }
        dst[i] = value;
    }
    return 0;
}

const float *safetensors_f32_data(const SafetensorsTensor *t) {
    if (t->dtype != SAFETENSORS_F32 || ((uintptr_t)t->data & 3u) != 0) return NULL;
    return t->data;
}

int safetensors_check_shape(const SafetensorsTensor *t, int ndim, const long long *dims) {
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == dims[i];
    if (same) return 0;
    char have[256], want[256];
    format_shape(have, sizeof have, t->ndim, t->shape);
    format_shape(want, sizeof want, ndim, dims);
    return err_set("tensor '%s' has shape %s but the model expects %s (%s)", t->name, have, want, t->file);
}

int safetensors_load_f32(const SafetensorsSet *set, const char *name, int ndim, const long long *dims,
                         float *dst) {
    const SafetensorsTensor *t;
    if (safetensors_require(set, name, &t) != 0) return -1;
    if (safetensors_check_shape(t, ndim, dims) != 0) return -1;
    return safetensors_read_f32(t, dst, t->count);
}

// --- writer ----------------------------------------------------------------------

static json_t *build_metadata(const char *const *pairs, const char *path) {
    json_t *metadata = json_object();
    bool has_format = false;
    for (int i = 0; pairs && pairs[i]; i += 2)
        if (strcmp(pairs[i], "format") == 0) has_format = true;
    // transformers refuses a file whose metadata has no "format".
    if (!has_format) json_object_set_new(metadata, "format", json_string("pt"));
    for (int i = 0; pairs && pairs[i]; i += 2) {
        json_t *value = pairs[i + 1] ? json_string(pairs[i + 1]) : NULL;
        if (!value || json_object_set_new(metadata, pairs[i], value) != 0) {
            err_set("safetensors metadata '%s' has no value or is not valid UTF-8 (%s)", pairs[i], path);
            json_decref(metadata);
            return NULL;
        }
    }
    return metadata;
}

// Header text padded with spaces to a multiple of 8, preceded by its length.
static int build_header(const char *path, const SafetensorsWriteTensor *tensors, int count,
                        const char *const *metadata_pairs, char **out, size_t *out_size) {
    json_t *metadata = build_metadata(metadata_pairs, path);
    if (!metadata) return -1;
    json_t *header = json_object();
    json_object_set_new(header, "__metadata__", metadata);
    long long offset = 0;
    int rc = 0;
    for (int i = 0; i < count && rc == 0; i++) {
        const SafetensorsWriteTensor *t = &tensors[i];
        const char *name = t->name ? t->name : "";
        if (name[0] == '\0' || strcmp(name, "__metadata__") == 0) {
            rc = err_set("cannot write safetensors tensor %d: bad name '%s' (%s)", i, name, path);
            break;
        }
        if (json_object_get(header, name)) {
            rc = err_set("cannot write safetensors: tensor '%s' appears twice (%s)", name, path);
            break;
        }
        if ((unsigned)t->dtype >= DTYPE_COUNT || t->ndim < 0 || t->ndim > SAFETENSORS_MAX_DIMS) {
            rc = err_set("cannot write safetensors tensor '%s': bad dtype or ndim %d (%s)", name, t->ndim, path);
            break;
        }
        long long n = shape_count(t->ndim, t->shape, dtype_info[t->dtype].size);
        long long bytes = n * (long long)dtype_info[t->dtype].size;
        if (n < 0 || __builtin_add_overflow(offset, bytes, &(long long){0})) {
            rc = err_set("cannot write safetensors tensor '%s': bad or too large shape (%s)", name, path);
            break;
        }
        if (bytes > 0 && !t->data && !t->fill) {
            rc = err_set("cannot write safetensors tensor '%s': no data (%s)", name, path);
            break;
        }
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *entry = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtype_info[t->dtype].name, "shape", shape,
                                  "data_offsets", (json_int_t)offset, (json_int_t)(offset + bytes));
        CHECK(entry, "json_pack failed");
        if (json_object_set_new(header, name, entry) != 0)
            rc = err_set("cannot write safetensors tensor '%s': name is not valid UTF-8 (%s)", name, path);
        offset += bytes;
    }
    char *text = rc == 0 ? json_dumps(header, JSON_COMPACT) : NULL;
    json_decref(header);
    if (rc != 0) return -1;
    CHECK(text, "json_dumps failed");
    size_t text_size = strlen(text);
    size_t padded = (text_size + 7) / 8 * 8;
    char *buffer = xmalloc(8 + padded);
    uint64_t length = padded;
    memcpy(buffer, &length, 8);
    memcpy(buffer + 8, text, text_size);
    memset(buffer + 8 + text_size, ' ', padded - text_size);
    free(text);
    *out = buffer;
    *out_size = 8 + padded;
    return 0;
}

int safetensors_write(const char *path, const SafetensorsWriteTensor *tensors, int count,
                      const char *const *metadata_kv_pairs) {
    CHECK(count >= 0 && (count == 0 || tensors), "bad tensor list");
    char *header = NULL;
    size_t header_size;
    FsAtomicFile file;
    int rc = build_header(path, tensors, count, metadata_kv_pairs, &header, &header_size);
    if (rc == 0) rc = fs_atomic_file_begin(&file, path);
    if (rc == 0) rc = fs_atomic_file_write(&file, header, header_size);
    free(header);
    for (int i = 0; i < count; i++) {
        const SafetensorsWriteTensor *t = &tensors[i];
        if (!t->fill && rc != 0) continue; // (the header was checked: dtype and shape are valid when rc is 0)
        const long long elements = shape_count(t->ndim, t->shape, 1);
        const size_t element_size = dtype_info[t->dtype].size;
        if (!t->fill) {
            if (elements) rc = fs_atomic_file_write(&file, t->data, (size_t)elements * element_size);
            continue;
        }
        // Pieces of 2^20 elements through one buffer. After a failure (a bad header, a file
        // that could not be made, a write: the file is released already) the pieces are
        // still filled, and not written.
        const long long piece = 1LL << 20;
        void *buffer = xmalloc((size_t)(elements < piece ? elements + 1 : piece) * element_size);
        for (long long first = 0; first < elements; first += piece) {
            const long long n = elements - first < piece ? elements - first : piece;
            t->fill(t->fill_context, first, n, buffer);
            if (rc == 0) rc = fs_atomic_file_write(&file, buffer, (size_t)n * element_size);
        }
        free(buffer);
    }
    return rc == 0 ? fs_atomic_file_commit(&file) : -1;
}
