// Block layouts follow ggml (ggml-common.h); the arithmetic follows the order of
// gguf-py's quants.py so that results are bit-identical to it (see the header).
// All multi-byte fields are little-endian and possibly unaligned: read with memcpy.
#include "io/gguf_dequant.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "core/bf16.h"
#include "core/check.h"

#define QK_K 256 // elements in a K-quant super-block

static const GgmlTypeInfo type_table[] = {
    [GGML_TYPE_F32] = {"F32", 1, 4, true},
    [GGML_TYPE_F16] = {"F16", 1, 2, true},
    [GGML_TYPE_Q4_0] = {"Q4_0", 32, 18, true},
    [GGML_TYPE_Q4_1] = {"Q4_1", 32, 20, true},
    [GGML_TYPE_Q5_0] = {"Q5_0", 32, 22, true},
    [GGML_TYPE_Q5_1] = {"Q5_1", 32, 24, true},
    [GGML_TYPE_Q8_0] = {"Q8_0", 32, 34, true},
    [GGML_TYPE_Q8_1] = {"Q8_1", 32, 40, false},
    [GGML_TYPE_Q2_K] = {"Q2_K", QK_K, 84, true},
    [GGML_TYPE_Q3_K] = {"Q3_K", QK_K, 110, true},
    [GGML_TYPE_Q4_K] = {"Q4_K", QK_K, 144, true},
    [GGML_TYPE_Q5_K] = {"Q5_K", QK_K, 176, true},
    [GGML_TYPE_Q6_K] = {"Q6_K", QK_K, 210, true},
    // Q8_K only ever holds activations inside ggml, and gguf-py has no reference
    // conversion to check one against, so it is left unconverted.
    [GGML_TYPE_Q8_K] = {"Q8_K", QK_K, 292, false},
    [GGML_TYPE_IQ2_XXS] = {"IQ2_XXS", QK_K, 66, false},
    [GGML_TYPE_IQ2_XS] = {"IQ2_XS", QK_K, 74, false},
    [GGML_TYPE_IQ3_XXS] = {"IQ3_XXS", QK_K, 98, false},
    [GGML_TYPE_IQ1_S] = {"IQ1_S", QK_K, 50, false},
    [GGML_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18, true},
    [GGML_TYPE_IQ3_S] = {"IQ3_S", QK_K, 110, false},
    [GGML_TYPE_IQ2_S] = {"IQ2_S", QK_K, 82, false},
    [GGML_TYPE_IQ4_XS] = {"IQ4_XS", QK_K, 136, true},
    [GGML_TYPE_I8] = {"I8", 1, 1, false},
    [GGML_TYPE_I16] = {"I16", 1, 2, false},
    [GGML_TYPE_I32] = {"I32", 1, 4, false},
    [GGML_TYPE_I64] = {"I64", 1, 8, false},
    [GGML_TYPE_F64] = {"F64", 1, 8, false},
    [GGML_TYPE_IQ1_M] = {"IQ1_M", QK_K, 56, false},
    [GGML_TYPE_BF16] = {"BF16", 1, 2, true},
    [GGML_TYPE_TQ1_0] = {"TQ1_0", QK_K, 54, true},
    [GGML_TYPE_TQ2_0] = {"TQ2_0", QK_K, 66, true},
    [GGML_TYPE_MXFP4] = {"MXFP4", 32, 17, true},
    [GGML_TYPE_NVFP4] = {"NVFP4", 64, 36, true},
    [GGML_TYPE_Q1_0] = {"Q1_0", 128, 18, false},
};

const GgmlTypeInfo *gguf_type_info(uint32_t type) {
    if (type >= sizeof type_table / sizeof type_table[0] || !type_table[type].name) return NULL;
    return &type_table[type];
}

const char *gguf_type_name(uint32_t type) {
    const GgmlTypeInfo *info = gguf_type_info(type);
    return info ? info->name : "unknown";
}

float gguf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exponent = (h >> 10) & 0x1f;
    uint32_t mantissa = h & 0x3ff;
    uint32_t bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13); // inf, or NaN with its payload
    } else if (exponent != 0) {
        bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
    } else {
        // Zero or subnormal: mantissa * 2^-24, exact in f32 (a power-of-two scale of
        // an integer below 2^10).
        float magnitude = (float)mantissa * 0x1p-24f;
        memcpy(&bits, &magnitude, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float gguf_bf16_to_f32(uint16_t h) { return bf16_value(h); }

static float load_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return gguf_f16_to_f32(h);
}

// --- Plain float types ----------------------------------------------------------

static void convert_f32(const uint8_t *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

static void convert_f16(const uint8_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = load_f16(src + 2 * i);
}

static void convert_bf16(const uint8_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = gguf_bf16_to_f32(h);
    }
}

// --- Blocks of 32: scale d (f16), optional minimum m (f16), 4 or 8-bit values ----
// In the 4-bit and 5-bit types, byte j holds element j in its low nibble and element
// j + 16 in its high nibble; the 5-bit types keep the fifth bit of element j in bit j
// of a 32-bit word qh.

static void block_q4_0(const uint8_t *block, float *y) {
    float d = load_f16(block);
    const uint8_t *qs = block + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 0x0f) - 8);
        y[j + 16] = d * (float)((qs[j] >> 4) - 8);
    }
}

static void block_q4_1(const uint8_t *block, float *y) {
    float d = load_f16(block), m = load_f16(block + 2);
    const uint8_t *qs = block + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 0x0f) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

static void block_q5_0(const uint8_t *block, float *y) {
    float d = load_f16(block);
    uint32_t qh;
    memcpy(&qh, block + 2, 4);
    const uint8_t *qs = block + 6;
    for (int j = 0; j < 16; j++) {
        int low = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
        int high = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)(low - 16);
        y[j + 16] = d * (float)(high - 16);
    }
}

static void block_q5_1(const uint8_t *block, float *y) {
    float d = load_f16(block), m = load_f16(block + 2);
    uint32_t qh;
    memcpy(&qh, block + 4, 4);
    const uint8_t *qs = block + 8;
    for (int j = 0; j < 16; j++) {
        int low = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
        int high = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)low + m;
        y[j + 16] = d * (float)high + m;
    }
}

static void block_q8_0(const uint8_t *block, float *y) {
    float d = load_f16(block);
    const int8_t *qs = (const int8_t *)(block + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

// --- K-quants: super-blocks of 256 elements in sub-blocks of 16 or 32 -------------
// The 2-bit fields (Q2_K, Q3_K low bits, Q6_K high bits): each half of the block
// (128 elements) uses 32 bytes; element 32*s + l of the half sits in bits 2s..2s+1 of
// byte l. The 4-bit fields (Q4_K, Q5_K): each 64 elements use 32 bytes, element l in
// the low nibble of byte l, element 32 + l in the high nibble.

static void block_q2_k(const uint8_t *block, float *y) {
    const uint8_t *scales = block;     // 16 sub-blocks: scale in low nibble, min in high
    const uint8_t *qs = block + 16;    // 64 bytes of 2-bit values
    float d = load_f16(block + 80), dmin = load_f16(block + 82);
    for (int i = 0; i < QK_K; i++) {
        int half = i / 128, shift = 2 * ((i % 128) / 32), l = i % 32;
        int q = (qs[half * 32 + l] >> shift) & 3;
        float dl = d * (float)(scales[i / 16] & 0x0f);
        float ml = dmin * (float)(scales[i / 16] >> 4);
        y[i] = dl * (float)q - ml;
    }
}

static void block_q3_k(const uint8_t *block, float *y) {
    const uint8_t *hmask = block;      // 32 bytes: bit b of byte l is the high bit of element 32b + l
    const uint8_t *qs = block + 32;    // 64 bytes of low 2-bit values
    const uint8_t *packed = block + 96; // 16 6-bit scales in 12 bytes
    float d = load_f16(block + 108);
    int scale[16];
    for (int k = 0; k < 16; k++) {
        int low = k < 8 ? packed[k] & 0x0f : packed[k - 8] >> 4;
        int high = (packed[8 + k % 4] >> (2 * (k / 4))) & 3;
        scale[k] = (low | high << 4) - 32;
    }
    for (int i = 0; i < QK_K; i++) {
        int half = i / 128, shift = 2 * ((i % 128) / 32), l = i % 32;
        int low = (qs[half * 32 + l] >> shift) & 3;
        // A clear high bit means "subtract 4": the stored values are offset by 4.
        int high_set = (hmask[l] >> (i / 32)) & 1;
        int q = low - (high_set ? 0 : 4);
        float dl = d * (float)scale[i / 16];
        y[i] = dl * (float)q;
    }
}

// The eight 6-bit scales and minimums of Q4_K and Q5_K, packed in 12 bytes (also read by
// ops/cpu/matmul_kquant.c): sub-blocks
// 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (minimums); sub-blocks 4-7 in the
// nibbles of bytes 8-11 plus the top 2 bits of bytes 0-7.
void gguf_unpack_k_scales(const uint8_t *packed, int scale[8], int min[8]) {
    for (int j = 0; j < 4; j++) {
        scale[j] = packed[j] & 0x3f;
        min[j] = packed[j + 4] & 0x3f;
        scale[j + 4] = (packed[j + 8] & 0x0f) | ((packed[j] >> 2) & 0x30);
        min[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 2) & 0x30);
    }
}

static void block_q4_k(const uint8_t *block, float *y) {
    float d = load_f16(block), dmin = load_f16(block + 2);
    int scale[8], min[8];
    gguf_unpack_k_scales(block + 4, scale, min);
    const uint8_t *qs = block + 16; // 128 bytes of 4-bit values
    for (int i = 0; i < QK_K; i++) {
        int sub = i / 32, shift = 4 * (sub % 2), l = i % 32;
        int q = (qs[(sub / 2) * 32 + l] >> shift) & 0x0f;
        float dl = d * (float)scale[sub];
        float ml = dmin * (float)min[sub];
        y[i] = dl * (float)q - ml;
    }
}

static void block_q5_k(const uint8_t *block, float *y) {
    float d = load_f16(block), dmin = load_f16(block + 2);
    int scale[8], min[8];
    gguf_unpack_k_scales(block + 4, scale, min);
    const uint8_t *qh = block + 16; // 32 bytes: bit b of byte l is the fifth bit of element 32b + l
    const uint8_t *qs = block + 48; // 128 bytes of low 4-bit values
    for (int i = 0; i < QK_K; i++) {
        int sub = i / 32, shift = 4 * (sub % 2), l = i % 32;
        int q = ((qs[(sub / 2) * 32 + l] >> shift) & 0x0f) | ((qh[l] >> sub) & 1) << 4;
        float dl = d * (float)scale[sub];
        float ml = dmin * (float)min[sub];
        y[i] = dl * (float)q - ml;
    }
}

static void block_q6_k(const uint8_t *block, float *y) {
    const uint8_t *ql = block;        // 128 bytes: low 4 bits; per half, element 64s + j in nibble s of byte j
    const uint8_t *qh = block + 128;  // 64 bytes: high 2 bits, the 2-bit layout above
    const int8_t *scales = (const int8_t *)(block + 192); // 16 signed 8-bit scales
    float d = load_f16(block + 208);
    for (int i = 0; i < QK_K; i++) {
        int half = i / 128, r = i % 128;
        int low = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 0x0f;
        int high = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
        float dl = d * (float)scales[i / 16];
        y[i] = dl * (float)((low | high << 4) - 32);
    }
}

// --- Non-linear 4-bit, microscaling and ternary types ------------------------------

const int8_t gguf_iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// The 4-bit table types' code layout: `half` bytes of codes give 2 * half elements, element
// j in the low nibble of byte j and element j + half in its high nibble (as Q4_0), each the
// scale d times the code's entry in `levels`.
static void table_codes(const int8_t levels[16], float d, const uint8_t *codes, int half, float *y) {
    for (int j = 0; j < half; j++) {
        y[j] = d * (float)levels[codes[j] & 0x0f];
        y[j + half] = d * (float)levels[codes[j] >> 4];
    }
}

// IQ4_NL, 32 elements: a half scale d, then 16 bytes of codes.
static void block_iq4_nl(const uint8_t *block, float *y) { table_codes(gguf_iq4_levels, load_f16(block), block + 2, 16, y); }

// IQ4_XS, 256 elements: a half scale d, eight 6-bit sub-block scales offset by 32 (low 4
// bits in the nibbles of 4 bytes, high 2 bits in a 16-bit word), then each sub-block's 32
// codes laid out as IQ4_NL's.
static void block_iq4_xs(const uint8_t *block, float *y) {
    float d = load_f16(block);
    uint16_t scales_high;
    memcpy(&scales_high, block + 2, 2);
    const uint8_t *scales_low = block + 4;
    const uint8_t *qs = block + 8;
    for (int sub = 0; sub < 8; sub++) {
        int low = (scales_low[sub / 2] >> (4 * (sub % 2))) & 0x0f;
        int high = (scales_high >> (2 * sub)) & 3;
        float dl = d * (float)((low | high << 4) - 32);
        table_codes(gguf_iq4_levels, dl, qs + 16 * sub, 16, y + 32 * sub);
    }
}

// MXFP4 (the OCP microscaling format), 32 elements: a shared power-of-two scale as an
// E8M0 exponent byte, then 16 bytes of FP4 (E2M1) codes. The table
// holds the E2M1 values doubled, so the scale is taken halved: 2^(e - 128), built from its
// bits (below e = 2 that is a float32 subnormal).
static const int8_t e2m1_doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void block_mxfp4(const uint8_t *block, float *y) {
    table_codes(e2m1_doubled, e8m0_half(block[0]), block + 1, 16, y);
}

// NVFP4, 64 elements: four sub-blocks of 16, each with its own scale, an unsigned E4M3
// byte (4 exponent bits biased by 7, 3 mantissa bits; 0x7F, E4M3's NaN, and 0 are read as
// zero), then 32 bytes of E2M1 codes, 8 for each sub-block (table_codes). The
// scale is halved for the doubled E2M1 table. Every step is exact in float32.
static float ue4m3_half(uint8_t byte) {
    if (byte == 0 || byte == 0x7f) return 0.0f;
    int exponent = (byte >> 3) & 0x0f, mantissa = byte & 7;
    float value = exponent == 0 ? (float)mantissa * 0x1p-9f
                                : (1.0f + (float)mantissa / 8.0f) * ldexpf(1.0f, exponent - 7);
    return value * 0.5f;
}

static void block_nvfp4(const uint8_t *block, float *y) {
    for (int sub = 0; sub < 4; sub++)
        table_codes(e2m1_doubled, ue4m3_half(block[sub]), block + 4 + 8 * sub, 8, y + 16 * sub);
}

// TQ2_0 (ternary), 256 elements: 64 bytes of 2-bit codes c (value c - 1: -1, 0, 1; code 3
// gives 2, as ggml's decoder does), then a half scale. Each half of 128 elements takes 32
// bytes, element 32s + l in bits 2s..2s+1 of byte l.
static void block_tq2_0(const uint8_t *block, float *y) {
    float d = load_f16(block + 64);
    for (int i = 0; i < QK_K; i++) {
        int half = i / 128, shift = 2 * ((i % 128) / 32), l = i % 32;
        int q = ((block[32 * half + l] >> shift) & 3) - 1;
        y[i] = d * (float)q;
    }
}

// TQ1_0 (ternary, 1.6 bits), 256 elements: 48 bytes holding five base-3 digits each and
// 4 bytes holding four, then a half scale. A byte stores its digits as a fixed-point
// fraction of 243 (3^5), so multiplying it by 3^k (mod 256) brings digit k to the top and
// (byte * 3) >> 8 reads it. Elements 0-159 come from bytes 0-31 (digit k of byte l is
// element 32k + l), 160-239 from bytes 32-47 (160 + 16k + l), 240-255 from bytes 48-51
// (240 + 4k + l).
static int tq1_digit(uint8_t byte, int k) {
    static const uint8_t powers_of_3[5] = {1, 3, 9, 27, 81};
    uint8_t shifted = (uint8_t)(byte * powers_of_3[k]);
    return (((uint16_t)shifted * 3) >> 8) - 1;
}

static void block_tq1_0(const uint8_t *block, float *y) {
    float d = load_f16(block + 52);
    for (int k = 0; k < 5; k++)
        for (int l = 0; l < 32; l++) y[32 * k + l] = d * (float)tq1_digit(block[l], k);
    for (int k = 0; k < 5; k++)
        for (int l = 0; l < 16; l++) y[160 + 16 * k + l] = d * (float)tq1_digit(block[32 + l], k);
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 4; l++) y[240 + 4 * k + l] = d * (float)tq1_digit(block[48 + l], k);
}

void gguf_dequantize(GgmlType type, const void *src, float *dst, int64_t n) {
    const GgmlTypeInfo *info = gguf_type_info(type);
    CHECK(info && info->can_dequantize, "gguf_dequantize: type %s cannot be converted", gguf_type_name(type));
    CHECK(n >= 0 && n % info->block_size == 0, "gguf_dequantize: %" PRId64 " elements is not whole %s blocks", n,
          info->name);
    const uint8_t *bytes = src;
    void (*block_fn)(const uint8_t *, float *) = NULL;
    switch (type) {
    case GGML_TYPE_F32: convert_f32(bytes, dst, n); return;
    case GGML_TYPE_F16: convert_f16(bytes, dst, n); return;
    case GGML_TYPE_BF16: convert_bf16(bytes, dst, n); return;
    case GGML_TYPE_Q4_0: block_fn = block_q4_0; break;
    case GGML_TYPE_Q4_1: block_fn = block_q4_1; break;
    case GGML_TYPE_Q5_0: block_fn = block_q5_0; break;
    case GGML_TYPE_Q5_1: block_fn = block_q5_1; break;
    case GGML_TYPE_Q8_0: block_fn = block_q8_0; break;
    case GGML_TYPE_Q2_K: block_fn = block_q2_k; break;
    case GGML_TYPE_Q3_K: block_fn = block_q3_k; break;
    case GGML_TYPE_Q4_K: block_fn = block_q4_k; break;
    case GGML_TYPE_Q5_K: block_fn = block_q5_k; break;
    case GGML_TYPE_Q6_K: block_fn = block_q6_k; break;
    case GGML_TYPE_IQ4_NL: block_fn = block_iq4_nl; break;
    case GGML_TYPE_IQ4_XS: block_fn = block_iq4_xs; break;
    case GGML_TYPE_MXFP4: block_fn = block_mxfp4; break;
    case GGML_TYPE_NVFP4: block_fn = block_nvfp4; break;
    case GGML_TYPE_TQ1_0: block_fn = block_tq1_0; break;
    case GGML_TYPE_TQ2_0: block_fn = block_tq2_0; break;
    default: CHECK(false, "gguf_dequantize: no converter for %s", info->name);
    }
    int64_t n_blocks = n / info->block_size;
    for (int64_t b = 0; b < n_blocks; b++) block_fn(bytes + b * info->type_size, dst + b * info->block_size);
}

int gguf_tensor_rows_to_f32(const GgufFile *f, const GgufTensor *t, int64_t first_row, int64_t n_rows,
                            float *dst) {
    const GgmlTypeInfo *info = gguf_type_info(t->type);
    CHECK(info, "tensor '%s' has an unknown type after gguf_open", t->name);
    if (!info->can_dequantize)
        return err_set("GGUF tensor '%s' has unsupported type %d (%s) (%s)", t->name, (int)t->type, info->name,
                       f->path);
    int64_t row_len = t->ne[0];
    int64_t total_rows = row_len > 0 ? t->n_elements / row_len : 0;
    CHECK(first_row >= 0 && n_rows >= 0 && first_row <= total_rows && n_rows <= total_rows - first_row,
          "rows %" PRId64 "+%" PRId64 " out of range for tensor '%s' with %" PRId64 " rows", first_row, n_rows,
          t->name, total_rows);
    // gguf_open() checked that rows are whole blocks and that the bytes are in the file.
    size_t row_bytes = (size_t)(row_len / info->block_size) * (size_t)info->type_size;
    const uint8_t *src = (const uint8_t *)t->data + (size_t)first_row * row_bytes;
    gguf_dequantize(t->type, src, dst, n_rows * row_len);
    return 0;
}

int gguf_tensor_to_f32(const GgufFile *f, const GgufTensor *t, float *dst) {
    int64_t rows = t->ne[0] > 0 ? t->n_elements / t->ne[0] : 0;
    return gguf_tensor_rows_to_f32(f, t, 0, rows, dst);
}
