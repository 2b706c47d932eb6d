// Reading and writing safetensors files, the weight format of Hugging Face.
//
// A file is: 8 bytes little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "value"}}, then the data section, which the tensors must
// cover exactly (no holes, no overlaps, no trailing bytes) as the reference
// implementation demands. The reader validates all of that, so a corrupt or
// truncated file is a clean user error naming the file and the tensor.
//
// A *set* is what a model folder holds: one file (model.safetensors) or several
// shards listed by model.safetensors.index.json ("weight_map": tensor -> shard).
// Files are mmapped read-only; tensor data pointers stay valid until close.
//
// Byte order: safetensors is little-endian and so is every host marlhf supports
// (x86-64, aarch64); data is used as stored, without swapping.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define SAFETENSORS_MAX_DIMS 8
// The reference implementation refuses headers above 100 MB; so do we.
#define SAFETENSORS_MAX_HEADER_BYTES 100000000ull

typedef enum {
    SAFETENSORS_F32,
    SAFETENSORS_F16,
    SAFETENSORS_BF16,
    SAFETENSORS_F64,
    SAFETENSORS_I64,
    SAFETENSORS_I32,
    SAFETENSORS_I16,
    SAFETENSORS_I8,
    SAFETENSORS_U64,
    SAFETENSORS_U32,
    SAFETENSORS_U16,
    SAFETENSORS_U8,
    SAFETENSORS_BOOL,
    // Known so that a file containing them opens, but neither read function converts them.
    SAFETENSORS_F8_E4M3,
    SAFETENSORS_F8_E5M2,
} SafetensorsDtype;

// "F32" ... as spelled in the header.
const char *safetensors_dtype_name(SafetensorsDtype dtype);
// Returns -1 (without err_set) for a name that is not a known dtype.
int safetensors_dtype_from_name(const char *name, SafetensorsDtype *dtype);
size_t safetensors_dtype_size(SafetensorsDtype dtype);

typedef struct {
    const char *name;
    const char *file; // path of the file that holds it (for messages)
    SafetensorsDtype dtype;
    int ndim; // 0 for a scalar
    long long shape[SAFETENSORS_MAX_DIMS];
    long long count; // product of shape (1 for a scalar)
    size_t nbytes;   // count * dtype size
    // Inside the mmapped file. Only as aligned as the file made it: use the read
    // functions, or safetensors_f32_data() which checks alignment.
    const void *data;
} SafetensorsTensor;

typedef struct SafetensorsSet SafetensorsSet;

// Opens `path`, which is one of:
//  - a .safetensors file;
//  - a folder holding model.safetensors, or else model.safetensors.index.json;
//  - an index .json file (shards are looked up next to it).
// For a sharded set every shard must exist and the index and the shards must agree
// exactly on which tensor lives where.
int safetensors_open(const char *path, SafetensorsSet **set);
void safetensors_close(SafetensorsSet *set); // NULL is fine

const char *safetensors_set_path(const SafetensorsSet *set); // as given to open
int safetensors_tensor_count(const SafetensorsSet *set);
// Tensors in storage order: file by file (shards by name), by offset inside a file.
const SafetensorsTensor *safetensors_tensor_at(const SafetensorsSet *set, int index);
// NULL when absent (no error recorded).
const SafetensorsTensor *safetensors_find(const SafetensorsSet *set, const char *name);
// Like find, but a missing tensor is an error naming the set's path.
int safetensors_require(const SafetensorsSet *set, const char *name, const SafetensorsTensor **tensor);
// A "__metadata__" value; the first file that has the key wins. NULL when absent.
const char *safetensors_metadata(const SafetensorsSet *set, const char *key);

// 0 if the tensor's shape is exactly dims[0..ndim), else -1 with
// "tensor 'name' has shape [a, b] but the model expects [c, d] (file)".
int safetensors_check_shape(const SafetensorsTensor *tensor, int ndim, const long long *dims);

// Converts F32/F16/BF16/F64 to float into dst[0..count); `count` must equal the
// tensor's element count. F16 and BF16 convert exactly (subnormals, infinities,
// NaN payloads, -0 included); F64 rounds to nearest.
int safetensors_read_f32(const SafetensorsTensor *tensor, float *dst, long long count);
// Converts I64/I32/I16/I8/U64/U32/U16/U8/BOOL to int64 into dst[0..count). A U64
// value above INT64_MAX is an error.
int safetensors_read_i64(const SafetensorsTensor *tensor, int64_t *dst, long long count);
// Zero-copy access for an F32 tensor whose data is 4-byte aligned in the mapping,
// else NULL (then use safetensors_read_f32).
const float *safetensors_f32_data(const SafetensorsTensor *tensor);

// find + check_shape + read_f32 in one: the usual way a model loads a weight.
int safetensors_load_f32(const SafetensorsSet *set, const char *name, int ndim, const long long *dims,
                         float *dst);

// IEEE binary16 / bfloat16 bit patterns to float, exactly.
float f16_bits_to_f32(uint16_t bits);
float bf16_bits_to_f32(uint16_t bits);

// --- writer --------------------------------------------------------------------

typedef struct {
    const char *name;
    SafetensorsDtype dtype; // usually F32; I64/I32 for ids and trainer state; any is accepted
    int ndim;
    long long shape[SAFETENSORS_MAX_DIMS];
    const void *data; // count * dtype size bytes, little-endian (may be NULL when empty)
    // Instead of `data` (NULL): called for consecutive pieces of the tensor, in order, to put
    // elements [first, first + count) into `out` -- for data that is made while the file is
    // written (a sharded optimizer's moments, read from other processes piece by piece), so
    // that it is never whole in memory. Called for every piece even after a write failed,
    // so a producer that other processes feed always reaches the end.
    void (*fill)(void *context, long long first, long long count, void *out);
    void *fill_context;
} SafetensorsWriteTensor;

// Writes the tensors, in the order given, to `path` through the atomic file helper
// (io/fs.h). `metadata_kv_pairs` is NULL or a NULL-terminated list of alternating
// keys and values for "__metadata__"; "format": "pt" is added unless a "format"
// key is given (transformers refuses files without it). The header is padded with
// spaces so that the data section starts 8-byte aligned; tensors follow each other
// without padding, so list 1- and 2-byte dtypes after the F32/I64 ones if readers
// should get aligned (zero-copy) data. Names must be unique, non-empty, valid UTF-8
// and not "__metadata__".
int safetensors_write(const char *path, const SafetensorsWriteTensor *tensors, int count,
                      const char *const *metadata_kv_pairs);
