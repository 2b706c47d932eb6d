// Reading GGUF files (the llama.cpp model format), versions 2 and 3.
//
// A GGUF file is: a header ("GGUF", version, tensor count, key/value count), the
// metadata key/values, one info record per tensor (name, shape, type, offset), then
// the tensor data, each tensor at an offset (relative to the start of the data
// section) that is a multiple of the file's alignment. gguf_open() maps the file
// read-only and checks every count, length and offset against the file size before
// it uses it, so a damaged or hostile file gives an error, never a crash.
//
// Byte order: GGUF files are little-endian and so is every host marlhf supports
// (x86-64, AArch64); values are read with memcpy, without swapping. Big-endian GGUF
// files (an option of version 3) are rejected, since their version field reads as
// a huge number.
//
// Strings inside metadata values (GgufString) point into the mapping: they are NOT
// NUL-terminated and live as long as the GgufFile. Key and tensor names are
// NUL-terminated copies.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The type ids of metadata values, as stored in the file.
typedef enum {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
} GgufValueType;

// The type ids of tensors (ggml's), as stored in the file. Ids 4, 5 and 31-33 belong
// to formats ggml has removed; gguf_open() treats them, like any id not listed, as
// unknown. Which of these can be converted to f32 is up to io/gguf_dequant.h.
typedef enum {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ2_XXS = 16,
    GGML_TYPE_IQ2_XS = 17,
    GGML_TYPE_IQ3_XXS = 18,
    GGML_TYPE_IQ1_S = 19,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ3_S = 21,
    GGML_TYPE_IQ2_S = 22,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_IQ1_M = 29,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_TQ1_0 = 34,
    GGML_TYPE_TQ2_0 = 35,
    GGML_TYPE_MXFP4 = 39,
    GGML_TYPE_NVFP4 = 40,
    GGML_TYPE_Q1_0 = 41,
} GgmlType;

// A string inside the mapped file: `len` bytes at `ptr`, not NUL-terminated.
typedef struct {
    const char *ptr;
    size_t len;
} GgufString;

// One metadata value. Scalars are widened when read: unsigned integers into `u64`,
// signed ones into `i64`, f32 and f64 into `f64` (exactly). Arrays hold elements of
// one scalar type or strings; arrays of arrays are rejected by gguf_open().
typedef struct {
    GgufValueType type;
    union {
        uint64_t u64;   // UINT8, UINT16, UINT32, UINT64
        int64_t i64;    // INT8, INT16, INT32, INT64
        double f64;     // FLOAT32, FLOAT64
        bool b;         // BOOL
        GgufString str; // STRING
        struct {
            GgufValueType elem_type;
            uint64_t count;
            const uint8_t *data;  // elem_type != STRING: count packed little-endian elements
            GgufString *strings;  // elem_type == STRING: count strings (owned by the GgufFile)
        } arr;                    // ARRAY
    };
} GgufValue;

typedef struct {
    char *key;
    GgufValue value;
} GgufKeyValue;

typedef struct {
    char *name;
    GgmlType type;
    int n_dims;          // 0..4 (0: a single value)
    int64_t ne[4];       // ne[0] is the contiguous (innermost) dimension; unused ones are 1
    int64_t n_elements;  // product of ne[]
    uint64_t offset;     // from the start of the data section
    const void *data;    // inside the mapping
    size_t nbytes;
} GgufTensor;

typedef struct {
    char *path;        // copy of the path given to gguf_open(), for error messages
    const uint8_t *map;
    size_t size;
    uint32_t version;
    uint32_t alignment;   // general.alignment, or 32
    size_t data_offset;   // where the data section starts in the file
    uint64_t n_kv;
    GgufKeyValue *kv;
    uint64_t n_tensors;
    GgufTensor *tensors;
} GgufFile;

// Maps and parses `path`. Returns 0, or -1 with err_set() naming the file (and the
// key or tensor at fault); on error *f holds nothing that needs gguf_close().
int gguf_open(GgufFile *f, const char *path);
// Unmaps the file and frees everything; every pointer into it becomes invalid.
// Safe on a zeroed GgufFile and after a failed gguf_open().
void gguf_close(GgufFile *f);

const char *gguf_value_type_name(GgufValueType type);

// --- Metadata ---------------------------------------------------------------------
// The value of `key`, or NULL if the file has none. Never sets an error.
const GgufValue *gguf_find(const GgufFile *f, const char *key);

// Typed getters: 0 on success, or -1 with err_set() naming the key and the file when
// the key is missing, has another type, or its value does not fit.
// Any integer type, value in [0, UINT32_MAX].
int gguf_get_u32(const GgufFile *f, const char *key, uint32_t *out);
// Any integer type, value in [INT64_MIN, INT64_MAX].
int gguf_get_i64(const GgufFile *f, const char *key, int64_t *out);
// FLOAT32 or FLOAT64 (an f64 is rounded to f32).
int gguf_get_f32(const GgufFile *f, const char *key, float *out);
int gguf_get_bool(const GgufFile *f, const char *key, bool *out);
// A NUL-terminated copy of a STRING value (xmalloc'd; the caller frees it). A string
// holding a NUL byte is cut there.
int gguf_get_string(const GgufFile *f, const char *key, char **out);

// Array getters: *out is the ARRAY value, whose elements are of the kind named.
int gguf_get_array(const GgufFile *f, const char *key, const GgufValue **out);        // any
int gguf_get_string_array(const GgufFile *f, const char *key, const GgufValue **out); // strings
int gguf_get_int_array(const GgufFile *f, const char *key, const GgufValue **out);    // any integer
int gguf_get_float_array(const GgufFile *f, const char *key, const GgufValue **out);  // f32 or f64

// Elements of an ARRAY value. The index and the element kind are checked with CHECK():
// use the getters above (or look at arr.elem_type) to know the kind first.
uint64_t gguf_array_count(const GgufValue *array);
GgufString gguf_array_string(const GgufValue *array, uint64_t i);
// Integer or BOOL elements. A u64 above INT64_MAX is a CHECK failure; gguf_get_int_array()
// rules those out.
int64_t gguf_array_int(const GgufValue *array, uint64_t i);
double gguf_array_float(const GgufValue *array, uint64_t i);  // FLOAT32 or FLOAT64 elements

// --- Tensors ----------------------------------------------------------------------
// The tensors are f->tensors[0 .. f->n_tensors), in file order. Their bytes are
// converted to f32 by io/gguf_dequant.h.
// The tensor called `name`, or NULL. Never sets an error.
const GgufTensor *gguf_find_tensor(const GgufFile *f, const char *name);
