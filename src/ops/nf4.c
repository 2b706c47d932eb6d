#include "ops/nf4.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/sanitizer.h"

// QLoRA's NormalFloat levels (Dettmers et al. 2023): quantiles of N(0, 1) scaled to [-1, 1],
// 8 positive and 7 negative ones and an exact zero, as bitsandbytes lists them.
const float nf4_levels[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

// Each one a float32 division by 12, as torch divides the float32 table by its max |value|.
// Code 8 (sign bit, zero) is +0: bitsandbytes lists it as the Python integer -0.
const float fp4_levels[16] = {
    0.0f / 12.0f, 0.0625f / 12.0f,  8.0f / 12.0f,  12.0f / 12.0f,  4.0f / 12.0f,  6.0f / 12.0f,  2.0f / 12.0f,  3.0f / 12.0f,
    0.0f / 12.0f, -0.0625f / 12.0f, -8.0f / 12.0f, -12.0f / 12.0f, -4.0f / 12.0f, -6.0f / 12.0f, -2.0f / 12.0f, -3.0f / 12.0f,
};

// Unchecked in the sanitizer build (core/sanitizer.h): it reads nf4_levels at constant
// indices only, and nf4_quantize calls it for every weight of a model.
SANITIZER_UNCHECKED int nf4_code(float v) {
    // bitsandbytes (CPU) buckets v by the float32 midpoints of neighbouring levels: the code
    // is the number of midpoints below v, so a value on a midpoint takes the lower level.
    int code = 0;
    for (int i = 0; i < 15; i++) code += (nf4_levels[i] + nf4_levels[i + 1]) / 2.0f < v;
    return code;
}

// ---- bitsandbytes' dynamic 8-bit map ----

static float dynamic_map[256];
static pthread_once_t dynamic_map_once = PTHREAD_ONCE_INIT;

static int ascending(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for each exponent
// e = 0..6, the 2^e midpoints of torch.linspace(0.1, 1, 2^e + 1) (float32) times 10^(e - 6),
// with both signs; then 0 and 1, sorted. torch's linspace computes its first half as
// start + step * i and its second as end - step * (steps - 1 - i), each one fused
// multiply-add (its float32 values, checked against bitsandbytes' map in the fixture).
static void build_dynamic_map(void) {
    static const double powers[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    int count = 0;
    for (int e = 0; e < 7; e++) {
        const int steps = (1 << e) + 1, halfway = steps / 2;
        const float start = 0.1f, end = 1.0f, step = (end - start) / (float)(steps - 1);
        float bounds[65];
        for (int i = 0; i < steps; i++)
            bounds[i] = i < halfway ? fmaf(step, (float)i, start) : fmaf(-step, (float)(steps - 1 - i), end);
        const float power = (float)powers[e];
        for (int i = 0; i + 1 < steps; i++) {
            const float mean = (bounds[i] + bounds[i + 1]) / 2.0f;
            dynamic_map[count++] = power * mean;
            dynamic_map[count++] = -power * mean;
        }
    }
    dynamic_map[count++] = 0.0f;
    dynamic_map[count++] = 1.0f;
    qsort(dynamic_map, 256, sizeof(float), ascending);
}

const float *nf4_dynamic_map(void) {
    pthread_once(&dynamic_map_once, build_dynamic_map);
    return dynamic_map;
}

// ---- 4-bit codes ----

// Every weight of a model passes here when it loads with --quantize nf4: the loop is
// unchecked in the sanitizer build (it was a fifth of test_quantize's time there), and
// nf4_quantize checks the three ranges it touches once instead (packed through the memset).
SANITIZER_UNCHECKED static void quantize_blocks(const float *x, long n, uint8_t *packed, float *absmax) {
    const long blocks = (n + NF4_BLOCK - 1) / NF4_BLOCK;
    for (long b = 0; b < blocks; b++) {
        const long first = b * NF4_BLOCK, end = first + NF4_BLOCK < n ? first + NF4_BLOCK : n;
        float m = 0.0f;
        for (long i = first; i < end; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
        absmax[b] = m;
        // A whole block multiplies by the reciprocal, a shorter last one divides (as
        // bitsandbytes' torch code does); both clamp m below at 1e-38, so a block of zeros
        // (m = 0) takes code 7 and dequantizes to zeros.
        const float clamped = m > 1e-38f ? m : 1e-38f, inverse = 1.0f / clamped;
        const int whole = end - first == NF4_BLOCK;
        for (long i = first; i < end; i++) {
            float v = whole ? x[i] * inverse : x[i] / clamped;
            v = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
            const int code = nf4_code(v);
            packed[i / 2] |= (uint8_t)(i % 2 ? code : code << 4);
        }
    }
    if (n % 2) packed[n / 2] |= (uint8_t)nf4_code(0.0f); // the padding value, 0
}

void nf4_quantize(const float *x, long n, uint8_t *packed, float *absmax) {
    const long blocks = (n + NF4_BLOCK - 1) / NF4_BLOCK;
    SANITIZER_CHECK_RANGE(x, (size_t)n * sizeof(float));
    SANITIZER_CHECK_RANGE(absmax, (size_t)blocks * sizeof(float));
    memset(packed, 0, (size_t)(n + 1) / 2);
    quantize_blocks(x, n, packed, absmax);
}

void nf4_dequantize(const uint8_t *packed, const float *absmax, long n, float *out) {
    for (long i = 0; i < n; i++) {
        const int code = i % 2 ? packed[i / 2] & 0x0F : packed[i / 2] >> 4;
        out[i] = nf4_levels[code] * absmax[i / NF4_BLOCK];
    }
}

// ---- double quantization of the scales ----

float nf4_scales_offset(const float *absmax, long count) {
    double sum = 0.0;
    for (long k = 0; k < count; k++) sum += absmax[k];
    return count ? (float)(sum / (double)count) : 0.0f;
}

// The code of v (= s / absmax2) in the dynamic map: the nearest map value, ties to the lower
// (the rule of bitsandbytes' pure-torch kernel, up to the last bit of its midpoints). Found as
// bitsandbytes' CPU quantize_block means to: the last map value at or below v (the map's
// -0.99297 read as -1 there, so that every v in [-1, 1] has one), then the next one if
// strictly nearer; its compiled search does not always land there (docs/quantization.md
// measures how often). NaN (a block of scales all equal to
// the offset: 0 / 0) takes code 0, as bitsandbytes gives it.
static int dynamic_code(const float *map, float v) {
    int low = 0, high = 255; // map[low] <= v (with map[0] = -1), map[high + 1] > v
    while (low < high) {
        const int mid = (low + high + 1) / 2;
        if (map[mid] <= v) low = mid;
        else high = mid - 1;
    }
    if (low < 255) {
        const float left = fabsf(v - (low == 0 ? -1.0f : map[low])), right = fabsf(v - map[low + 1]);
        if (right < left) low++;
    }
    return low;
}

void nf4_double_quantize(const float *absmax, long count, float offset, uint8_t *codes, float *absmax2) {
    const float *map = nf4_dynamic_map();
    for (long first = 0; first < count; first += NF4_SCALE_BLOCK) {
        const long end = first + NF4_SCALE_BLOCK < count ? first + NF4_SCALE_BLOCK : count;
        float m = 0.0f;
        for (long k = first; k < end; k++) {
            const float s = fabsf(absmax[k] - offset);
            m = s > m ? s : m;
        }
        absmax2[first / NF4_SCALE_BLOCK] = m;
        for (long k = first; k < end; k++) codes[k] = (uint8_t)dynamic_code(map, (absmax[k] - offset) / m);
    }
}

void nf4_double_dequantize(const uint8_t *codes, const float *absmax2, float offset, long count, float *scales) {
    const float *map = nf4_dynamic_map();
    for (long k = 0; k < count; k++) {
        const float scaled = map[codes[k]] * absmax2[k / NF4_SCALE_BLOCK]; // two roundings, as bitsandbytes
        scales[k] = scaled + offset;
    }
}

// ---- matrices ----

void nf4_quantize_matrix(Q8Matrix *matrix, const float *weight, long rows, long cols, int double_quant,
                         void *(*alloc)(size_t)) {
    const long n = rows * cols, blocks = n / NF4_BLOCK;
    matrix->rows = (int)rows;
    matrix->cols = (int)cols;
    matrix->type = QUANT_NF4;
    matrix->nibbles = alloc((size_t)n / 2);
    float *absmax = double_quant ? xmalloc((size_t)blocks * sizeof(float)) : alloc((size_t)blocks * sizeof(float));
    nf4_quantize(weight, n, matrix->nibbles, absmax);
    if (!double_quant) {
        matrix->scales = absmax;
        return;
    }
    matrix->scales = NULL;
    matrix->scale_offset = nf4_scales_offset(absmax, blocks);
    matrix->scale_codes = alloc((size_t)blocks);
    matrix->scale_absmax = alloc((size_t)((blocks + NF4_SCALE_BLOCK - 1) / NF4_SCALE_BLOCK) * sizeof(float));
    nf4_double_quantize(absmax, blocks, matrix->scale_offset, matrix->scale_codes, matrix->scale_absmax);
    free(absmax);
}

void nf4_row_scales(const Q8Matrix *matrix, long first, long count, float *scales) {
    const long per_row = matrix->cols / NF4_BLOCK, start = first * per_row, blocks = count * per_row;
    if (matrix->scales) {
        memcpy(scales, matrix->scales + start, (size_t)blocks * sizeof(float));
        return;
    }
    const float *map = nf4_dynamic_map();
    for (long k = 0; k < blocks; k++) {
        const float scaled = map[matrix->scale_codes[start + k]] * matrix->scale_absmax[(start + k) / NF4_SCALE_BLOCK];
        scales[k] = scaled + matrix->scale_offset;
    }
}

void nf4_dequantize_rows(const Q8Matrix *matrix, long first, long count, float *out) {
    const long cols = matrix->cols, per_row = cols / NF4_BLOCK;
    const float *levels = quant_levels(matrix);
    float scales[per_row];
    for (long i = 0; i < count; i++) {
        const uint8_t *codes = matrix->nibbles + (first + i) * cols / 2;
        float *row = out + i * cols;
        nf4_row_scales(matrix, first + i, 1, scales);
        for (long b = 0; b < per_row; b++)
            for (long j = b * NF4_BLOCK / 2; j < (b + 1) * NF4_BLOCK / 2; j++) {
                row[2 * j] = levels[codes[j] >> 4] * scales[b];
                row[2 * j + 1] = levels[codes[j] & 0x0F] * scales[b];
            }
    }
}

long nf4_matrix_bytes(const Q8Matrix *matrix) {
    const long n = (long)matrix->rows * matrix->cols, blocks = n / NF4_BLOCK;
    if (matrix->scales) return n / 2 + blocks * (long)sizeof(float);
    return n / 2 + blocks + (blocks + NF4_SCALE_BLOCK - 1) / NF4_SCALE_BLOCK * (long)sizeof(float) +
           (long)sizeof(float);
}
