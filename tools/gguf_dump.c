// A developer tool: shows what src/io/gguf.c reads from a GGUF file, or writes every
// tensor converted to f32 (for tools/check_gguf_dequant.py to compare with gguf-py).
//
//   gguf_dump FILE          header, metadata (arrays abbreviated) and tensor table
//   gguf_dump --f32 FILE    each tensor's values as raw little-endian f32 on stdout,
//                           in file order; tensors of types that cannot be converted
//                           are skipped (with a note on stderr)
//
// Build: gcc -std=c17 -O2 -D_GNU_SOURCE -Isrc src/core/check.c src/io/gguf.c
//        src/io/gguf_dequant.c tools/gguf_dump.c -o gguf_dump
#include <inttypes.h>
#include <string.h>

#include "core/check.h"
#include "io/gguf.h"
#include "io/gguf_dequant.h"

static void print_string(GgufString s, size_t max_len) {
    size_t n = s.len < max_len ? s.len : max_len;
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c < 32) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
    if (n < s.len) printf("...(%zu bytes)", s.len);
}

static void print_value(const GgufValue *v) {
    switch (v->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        printf("%" PRIu64, v->u64);
        break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        printf("%" PRId64, v->i64);
        break;
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: printf("%.9g", v->f64); break;
    case GGUF_TYPE_BOOL: fputs(v->b ? "true" : "false", stdout); break;
    case GGUF_TYPE_STRING: print_string(v->str, 60); break;
    case GGUF_TYPE_ARRAY: {
        uint64_t n = v->arr.count;
        printf("[%" PRIu64 " x %s]", n, gguf_value_type_name(v->arr.elem_type));
        for (uint64_t i = 0; i < n && i < 4; i++) {
            putchar(' ');
            if (v->arr.elem_type == GGUF_TYPE_STRING) print_string(gguf_array_string(v, i), 20);
            else if (v->arr.elem_type == GGUF_TYPE_FLOAT32 || v->arr.elem_type == GGUF_TYPE_FLOAT64)
                printf("%.6g", gguf_array_float(v, i));
            else printf("%" PRId64, gguf_array_int(v, i));
        }
        if (n > 4) fputs(" ...", stdout);
        break;
    }
    }
}

static int dump(const GgufFile *f) {
    printf("GGUF version %" PRIu32 ", alignment %" PRIu32 ", data at %zu, %zu bytes\n", f->version, f->alignment,
           f->data_offset, f->size);
    printf("%" PRIu64 " key/values:\n", f->n_kv);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const GgufValue *v = &f->kv[i].value;
        printf("  %-40s %-6s ", f->kv[i].key, gguf_value_type_name(v->type));
        // A u64 array element above INT64_MAX would trip gguf_array_int's CHECK.
        if (v->type == GGUF_TYPE_ARRAY && v->arr.elem_type == GGUF_TYPE_UINT64) {
            printf("[%" PRIu64 " x u64]", v->arr.count);
        } else {
            print_value(v);
        }
        putchar('\n');
    }
    printf("%" PRIu64 " tensors:\n", f->n_tensors);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const GgufTensor *t = &f->tensors[i];
        printf("  %-32s %-5s [", t->name, gguf_type_name(t->type));
        for (int d = 0; d < t->n_dims; d++) printf(d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
        printf("] offset %" PRIu64 ", %zu bytes\n", t->offset, t->nbytes);
    }
    return 0;
}

static int write_f32(const GgufFile *f) {
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const GgufTensor *t = &f->tensors[i];
        if (!gguf_type_info(t->type)->can_dequantize) {
            fprintf(stderr, "skipping %s: type %s\n", t->name, gguf_type_name(t->type));
            continue;
        }
        float *values = xmalloc((size_t)t->n_elements * sizeof(float));
        if (gguf_tensor_to_f32(f, t, values) < 0) {
            free(values);
            return -1;
        }
        size_t n = (size_t)t->n_elements;
        if (fwrite(values, sizeof(float), n, stdout) != n) {
            free(values);
            return err_set("cannot write to stdout");
        }
        free(values);
    }
    return fflush(stdout) == 0 ? 0 : err_set("cannot write to stdout");
}

int main(int argc, char **argv) {
    bool f32 = argc == 3 && strcmp(argv[1], "--f32") == 0;
    if (!(argc == 2 || f32)) {
        fprintf(stderr, "usage: gguf_dump [--f32] FILE.gguf\n");
        return 2;
    }
    GgufFile f;
    if (gguf_open(&f, argv[argc - 1]) < 0) die_from_err();
    int rc = f32 ? write_f32(&f) : dump(&f);
    gguf_close(&f);
    if (rc < 0) die_from_err();
    return 0;
}
