#include "io/gguf_quantize.h"

#include <math.h>
#include <string.h>

#include "core/check.h"
#include "io/gguf_dequant.h"
#include "io/gguf_write.h"

enum { QK = 32, QK_K = 256 };

// f16 of x and the float it rounds to: the scale the reader will use.
static uint16_t store_f16(uint8_t *at, float x, float *rounded) {
    uint16_t h = gguf_f32_to_f16(x);
    memcpy(at, &h, 2);
    if (rounded) *rounded = gguf_f16_to_f32(h);
    return h;
}

static int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// lround's rounding (halves away from zero) of a value in a block's range of codes, without
// the library call, whose saving and restoring of registers around each value was most of the
// scale searches' time (fit_signed_scale, fit_scale_min). The conversion to int truncates,
// exactly, and v - whole is exact too, so any v of magnitude below 2^30 rounds as lround
// rounds it (a float as lroundf: widening it to a double is exact); one beyond is held at
// +-2^30 (the callers clamp to their codes: the same codes as lround's).
static inline int round_nearest(double v) {
    v = v > -1073741824.0 ? v : -1073741824.0;
    v = v < 1073741824.0 ? v : 1073741824.0;
    const int whole = (int)v;
    // Set-on-compare rather than a branch: whether a value rounds away is a coin flip.
    const int away = fabs(v - (double)whole) >= 0.5, sign = (v > 0) - (v < 0);
    return whole + away * sign;
}

// The element of largest magnitude, with its sign.
static float signed_max(const float *x, int n) {
    float best = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(best)) best = x[i];
    return best;
}

// Q8_0: d = max|x| / 127, q = round(x / d).
static void block_q8_0(const float *x, uint8_t *out) {
    float amax = 0;
    for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d;
    store_f16(out, amax / 127.0f, &d);
    const float inverse = d > 0 ? 1.0f / d : 0.0f;
    for (int i = 0; i < QK; i++) out[2 + i] = (uint8_t)(int8_t)clamp_int((int)lroundf(x[i] * inverse), -127, 127);
}

// Q4_0: d = m / -8 for the signed extreme m (which becomes q = 0), q = round(x / d) + 8.
static void block_q4_0(const float *x, uint8_t *out) {
    float d;
    store_f16(out, signed_max(x, QK) / -8.0f, &d);
    const float inverse = d != 0 ? 1.0f / d : 0.0f;
    uint8_t *qs = out + 2;
    for (int j = 0; j < 16; j++) {
        int low = clamp_int((int)lroundf(x[j] * inverse) + 8, 0, 15);
        int high = clamp_int((int)lroundf(x[j + 16] * inverse) + 8, 0, 15);
        qs[j] = (uint8_t)(low | high << 4);
    }
}

// IQ4_NL: a half scale d and 32 codes, each value d * gguf_iq4_levels[code] (16 levels from
// -127 to 113, closer together near zero). Two starting scales, the signed extreme m on the
// level -127 (d = m / -127) or on 113 (d = m / 113); for each, every value takes the nearest
// level to x / d, then the scale is fitted to those levels by least squares (d = sum x L /
// sum L L) and the codes chosen again. Of the four (d, codes) the one of least squared
// error is written. Each d is taken as its half float before the codes are chosen for it.
static int nearest_iq4_level(float v) {
    int best = 0;
    for (int k = 1; k < 16; k++)
        if (fabsf(v - (float)gguf_iq4_levels[k]) < fabsf(v - (float)gguf_iq4_levels[best])) best = k;
    return best;
}

// The codes for scale d (a half float's value) into codes[QK]; returns the squared error.
static double iq4_codes(const float *x, float d, int codes[QK]) {
    const float inverse = d != 0 ? 1.0f / d : 0.0f;
    double error = 0;
    for (int i = 0; i < QK; i++) {
        codes[i] = nearest_iq4_level(x[i] * inverse);
        const double e = (double)x[i] - (double)d * gguf_iq4_levels[codes[i]];
        error += e * e;
    }
    return error;
}

// The search above over one block of 32: its best scale, with its codes in best_codes. Each
// scale tried is taken as its half float where `half_scale` (IQ4_NL stores d so), else as
// it is (IQ4_XS's sub-block scales, which are quantized afterwards).
static float iq4_best_scale(const float *x, bool half_scale, int best_codes[QK]) {
    const float extreme = signed_max(x, QK);
    const float starts[2] = {extreme / -127.0f, extreme / 113.0f};
    float best_d = 0;
    int codes[QK];
    double best_error = iq4_codes(x, 0.0f, best_codes);
    for (int s = 0; s < 2; s++) {
        float d = half_scale ? gguf_f16_to_f32(gguf_f32_to_f16(starts[s])) : starts[s];
        for (int pass = 0; pass < 2; pass++) {
            const double error = iq4_codes(x, d, codes);
            if (error < best_error) best_error = error, best_d = d, memcpy(best_codes, codes, sizeof codes);
            double xl = 0, ll = 0; // the least-squares scale for these codes
            for (int i = 0; i < QK; i++) {
                xl += (double)x[i] * gguf_iq4_levels[codes[i]];
                ll += (double)gguf_iq4_levels[codes[i]] * gguf_iq4_levels[codes[i]];
            }
            d = ll > 0 ? (float)(xl / ll) : 0.0f;
            if (half_scale) d = gguf_f16_to_f32(gguf_f32_to_f16(d));
        }
    }
    return best_d;
}

// Block j's 32 codes as IQ4_NL's 16 bytes: value j in the low nibble of byte j, value j + 16
// in the high one.
static void store_iq4_codes(const int codes[QK], uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(codes[j] | codes[j + 16] << 4);
}

static void block_iq4_nl(const float *x, uint8_t *out) {
    int codes[QK];
    store_f16(out, iq4_best_scale(x, true, codes), NULL);
    store_iq4_codes(codes, out + 2);
}

// IQ4_XS, 256 values (gguf_dequant.c's block_iq4_xs reads it): eight sub-blocks of 32 with
// IQ4_NL's codes, sub-block j's scale d * (ls_j - 32) for a 6-bit ls_j and one half float d.
// Each sub-block's own scale is found as IQ4_NL's (iq4_best_scale, not rounded); d puts the
// one of largest magnitude, m, on -32 (d = m / -32, as Q4_0 puts its extreme value on its
// lowest code); each sub-block then keeps, of the ls nearest its scale / d and the two
// beside it, the one whose codes -- chosen again for that scale -- leave the least squared
// error (ls 32, scale 0, when d is 0).
static void block_iq4_xs(const float *x, uint8_t *out) {
    enum { SUB_BLOCKS = QK_K / QK };
    float scales[SUB_BLOCKS];
    int codes[QK], best_codes[QK];
    for (int sub = 0; sub < SUB_BLOCKS; sub++) scales[sub] = iq4_best_scale(x + QK * sub, false, codes);
    float d;
    store_f16(out, signed_max(scales, SUB_BLOCKS) / -32.0f, &d);
    uint16_t scales_high = 0;
    uint8_t *scales_low = out + 4, *qs = out + 8;
    memset(scales_low, 0, SUB_BLOCKS / 2);
    for (int sub = 0; sub < SUB_BLOCKS; sub++) {
        const float *xs = x + QK * sub;
        int best_ls = 32;
        double best_error = iq4_codes(xs, 0.0f, best_codes);
        if (d != 0) {
            const int nearest = (int)lroundf(scales[sub] / d) + 32;
            for (int ls = nearest - 1; ls <= nearest + 1; ls++) {
                if (ls < 0 || ls > 63) continue;
                const double error = iq4_codes(xs, d * (float)(ls - 32), codes);
                if (error < best_error) best_error = error, best_ls = ls, memcpy(best_codes, codes, sizeof codes);
            }
        }
        scales_low[sub / 2] |= (uint8_t)((best_ls & 0x0f) << (4 * (sub % 2)));
        scales_high |= (uint16_t)((best_ls >> 4) << (2 * sub));
        store_iq4_codes(best_codes, qs + 16 * sub);
    }
    memcpy(out + 2, &scales_high, 2);
}

// Q5_0: as Q4_0 with 5 bits (d = m / -16, q = round(x / d) + 16), the fifth bits in qh.
static void block_q5_0(const float *x, uint8_t *out) {
    float d;
    store_f16(out, signed_max(x, QK) / -16.0f, &d);
    const float inverse = d != 0 ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    uint8_t *qs = out + 6;
    for (int j = 0; j < 16; j++) {
        int low = clamp_int((int)lroundf(x[j] * inverse) + 16, 0, 31);
        int high = clamp_int((int)lroundf(x[j + 16] * inverse) + 16, 0, 31);
        qs[j] = (uint8_t)((low & 0x0f) | (high & 0x0f) << 4);
        qh |= (uint32_t)(low >> 4) << j | (uint32_t)(high >> 4) << (j + 16);
    }
    memcpy(out + 2, &qh, 4);
}

// The d and m of a block of Q4_1 / Q5_1 (y = d * q + m, q in [0, levels]): m the block's
// smallest value, d its range / levels, both stored as the half floats the reader gets (at
// out, out + 2); *m gets m as stored, and the result is 1 / d as stored (0 for a flat block).
static float store_range_scale(const float *x, int levels, uint8_t *out, float *m) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < QK; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    float d;
    store_f16(out, (hi - lo) / (float)levels, &d);
    store_f16(out + 2, lo, m);
    return d > 0 ? 1.0f / d : 0.0f;
}

// Q5_1 (the Q5_K_M mix's type for rows that 256 does not divide): y = d * q + m with q in
// [0, 31], the fifth bits in qh as Q5_0's.
static void block_q5_1(const float *x, uint8_t *out) {
    float m;
    const float inverse = store_range_scale(x, 31, out, &m);
    uint32_t qh = 0;
    uint8_t *qs = out + 8;
    for (int j = 0; j < 16; j++) {
        int low = clamp_int((int)lroundf((x[j] - m) * inverse), 0, 31);
        int high = clamp_int((int)lroundf((x[j + 16] - m) * inverse), 0, 31);
        qs[j] = (uint8_t)((low & 0x0f) | (high & 0x0f) << 4);
        qh |= (uint32_t)(low >> 4) << j | (uint32_t)(high >> 4) << (j + 16);
    }
    memcpy(out + 4, &qh, 4);
}

// Q4_1 (--quantize q4_1): Q5_1 with 4 bits, d the block's range / 15, no qh.
static void block_q4_1(const float *x, uint8_t *out) {
    float m;
    const float inverse = store_range_scale(x, 15, out, &m);
    uint8_t *qs = out + 4;
    for (int j = 0; j < 16; j++) {
        int low = clamp_int((int)lroundf((x[j] - m) * inverse), 0, 15);
        int high = clamp_int((int)lroundf((x[j + 16] - m) * inverse), 0, 15);
        qs[j] = (uint8_t)(low | high << 4);
    }
}

// Fits x[0..n) ~ scale * q - min with q in [0, levels], scale > 0, min >= 0: candidate
// scales around (max - min) / levels, each with its rounding and a least-squares refit of
// scale and offset (offset clamped to <= 0), keeping the smallest squared error.
static void fit_scale_min(const float *x, int n, int levels, float *scale, float *min) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    if (lo > 0) lo = 0;
    if (hi <= lo) { // all equal (and <= 0): q = 0 everywhere reproduces them
        *scale = 0, *min = -lo;
        return;
    }
    double best_error = INFINITY;
    *scale = (hi - lo) / levels, *min = -lo;
    for (int step = -8; step <= 8; step++) {
        const double inverse = (levels + 0.1 * step) / (hi - lo);
        double sq = 0, sqq = 0, sx = 0, sqx = 0;
        int q[QK_K];
        for (int i = 0; i < n; i++) {
            q[i] = clamp_int(round_nearest(inverse * (x[i] - lo)), 0, levels);
            sq += q[i], sqq += (double)q[i] * q[i], sx += x[i], sqx += (double)q[i] * x[i];
        }
        const double det = n * sqq - sq * sq;
        if (det <= 0) continue;
        double s = (n * sqx - sq * sx) / det, offset = (sqq * sx - sq * sqx) / det;
        if (offset > 0) offset = 0, s = sqx / sqq;
        if (!(s > 0)) continue;
        double error = 0;
        for (int i = 0; i < n; i++) {
            const double e = s * q[i] + offset - x[i];
            error += e * e;
        }
        if (error < best_error) best_error = error, *scale = (float)s, *min = (float)-offset;
    }
}

// The scales and minimums of Q4_K and Q5_K (eight sub-blocks of 32 values, each
// y = d * sc * q - dmin * m with q in [0, levels] and 6-bit sc, m): fits each sub-block,
// writes d and dmin to out[0..4) and sc, m packed to out[4..16) (the inverse of
// gguf_dequant.c's gguf_unpack_k_scales), and gives each value's q in codes[256].
static void scale_min_blocks(const float *x, int levels, uint8_t *out, int codes[QK_K]) {
    float scales[8], mins[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        fit_scale_min(x + 32 * j, 32, levels, &scales[j], &mins[j]);
        max_scale = fmaxf(max_scale, scales[j]), max_min = fmaxf(max_min, mins[j]);
    }
    float d, dmin;
    store_f16(out, max_scale / 63.0f, &d);
    store_f16(out + 2, max_min / 63.0f, &dmin);
    int sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = d > 0 ? clamp_int((int)lroundf(scales[j] / d), 0, 63) : 0;
        m[j] = dmin > 0 ? clamp_int((int)lroundf(mins[j] / dmin), 0, 63) : 0;
    }
    uint8_t *packed = out + 4;
    for (int j = 0; j < 4; j++) {
        packed[j] = (uint8_t)((sc[j] & 0x3f) | (sc[j + 4] >> 4) << 6);
        packed[j + 4] = (uint8_t)((m[j] & 0x3f) | (m[j + 4] >> 4) << 6);
        packed[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | (m[j + 4] & 0x0f) << 4);
    }
    for (int i = 0; i < QK_K; i++) {
        const int sub = i / 32;
        const float step = d * (float)sc[sub], offset = dmin * (float)m[sub];
        codes[i] = step > 0 ? clamp_int((int)lroundf((x[i] + offset) / step), 0, levels) : 0;
    }
}

// Q4_K: q in [0, 15]; bytes [32k, 32k + 32) of qs hold sub-block 2k in their low nibbles,
// 2k + 1 in their high ones.
static void block_q4_k(const float *x, uint8_t *out) {
    int codes[QK_K];
    scale_min_blocks(x, 15, out, codes);
    uint8_t *qs = out + 16;
    memset(qs, 0, 128);
    for (int i = 0; i < QK_K; i++) qs[(i / 64) * 32 + i % 32] |= (uint8_t)(codes[i] << (4 * (i / 32 % 2)));
}

// Q5_K: q in [0, 31]; its low 4 bits placed as Q4_K's (after 32 bytes of qh), its fifth bit
// in bit i / 32 of qh byte i % 32 (gguf_dequant.c's block_q5_k).
static void block_q5_k(const float *x, uint8_t *out) {
    int codes[QK_K];
    scale_min_blocks(x, 31, out, codes);
    uint8_t *qh = out + 16, *qs = out + 48;
    memset(qh, 0, 32), memset(qs, 0, 128);
    for (int i = 0; i < QK_K; i++) {
        qs[(i / 64) * 32 + i % 32] |= (uint8_t)((codes[i] & 0x0f) << (4 * (i / 32 % 2)));
        qh[i % 32] |= (uint8_t)((codes[i] >> 4) << (i / 32));
    }
}

// Q6_K: sixteen sub-blocks of 16, y = d * sc * (q - 32) with q in [0, 63] and signed
// 8-bit sc; the low 4 bits of q in ql, the high 2 in qh (gguf_dequant.c's block_q6_k).
static void block_q6_k(const float *x, uint8_t *out) {
    float scales[16], extreme = 0;
    for (int j = 0; j < 16; j++) {
        scales[j] = signed_max(x + 16 * j, 16) / -32.0f;
        if (fabsf(scales[j]) > fabsf(extreme)) extreme = scales[j];
    }
    float d;
    store_f16(out + 208, extreme / -128.0f, &d);
    int8_t *sc = (int8_t *)(out + 192);
    for (int j = 0; j < 16; j++) sc[j] = (int8_t)(d != 0 ? clamp_int((int)lroundf(scales[j] / d), -128, 127) : 0);
    uint8_t *ql = out, *qh = out + 128;
    memset(ql, 0, 128), memset(qh, 0, 64);
    for (int i = 0; i < QK_K; i++) {
        const float step = d * (float)sc[i / 16];
        const int q = step != 0 ? clamp_int((int)lroundf(x[i] / step), -32, 31) + 32 : 32;
        const int half = i / 128, r = i % 128;
        ql[half * 64 + r % 64] |= (uint8_t)((q & 0x0f) << (4 * (r / 64)));
        qh[half * 32 + r % 32] |= (uint8_t)((q >> 4) << (2 * (r / 32)));
    }
}

// Q2_K: sixteen sub-blocks of 16, y = d * sc * q - dmin * m with q in [0, 3] and 4-bit sc, m
// (scales[16] hold sc in the low nibble, m in the high one; then 64 bytes of codes, d, dmin:
// gguf_dequant.c's block_q2_k). Each sub-block's scale and minimum fitted as Q4_K's
// (fit_scale_min), then quantized to 4 bits against d = the largest scale / 15 and dmin = the
// largest minimum / 15, and each value's code chosen for the quantized pair.
static void block_q2_k(const float *x, uint8_t *out) {
    float scales[16], mins[16], max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; j++) {
        fit_scale_min(x + 16 * j, 16, 3, &scales[j], &mins[j]);
        max_scale = fmaxf(max_scale, scales[j]), max_min = fmaxf(max_min, mins[j]);
    }
    float d, dmin;
    store_f16(out + 80, max_scale / 15.0f, &d);
    store_f16(out + 82, max_min / 15.0f, &dmin);
    int sc[16], m[16];
    for (int j = 0; j < 16; j++) {
        sc[j] = d > 0 ? clamp_int((int)lroundf(scales[j] / d), 0, 15) : 0;
        m[j] = dmin > 0 ? clamp_int((int)lroundf(mins[j] / dmin), 0, 15) : 0;
        out[j] = (uint8_t)(sc[j] | m[j] << 4);
    }
    uint8_t *qs = out + 16;
    memset(qs, 0, 64);
    for (int i = 0; i < QK_K; i++) {
        const float step = d * (float)sc[i / 16], offset = dmin * (float)m[i / 16];
        const int q = step > 0 ? clamp_int((int)lroundf((x[i] + offset) / step), 0, 3) : 0;
        qs[(i / 128) * 32 + i % 32] |= (uint8_t)(q << (2 * ((i % 128) / 32)));
    }
}

// The scale s of n values that are s * q with integer q in [lowest, highest] (lowest < 0 <
// highest): starts that put the signed extreme at `lowest` (give or take 0.1, 0.3 or 0.5 of
// a step) or at `highest` (give or take 0, 0.2 or 0.4 of a step), each with the nearest q
// per value and then two least-squares refits of s to those q; the s of least squared error.
// (Starts a tenth of a step apart, twice as many, left the error on Gaussian sub-blocks of 16
// within 0.01% of this for twice the time; the starts themselves never won: a refit always
// did better.)
//
// A trial's sums are a function of its scale alone, and about half the 66 trials repeat a
// scale tried before (starts whose nearest codes agree refit to the same s), so each scale's
// sums are kept and a repeat takes them instead of going over the values again: the same
// scales, errors and refits in the same order, so the same result, in about half the time.
typedef struct {
    float scale;
    double error, xq, qq;
} ScaleTrial;

static float fit_signed_scale(const float *x, int n, int lowest, int highest) {
    enum { STARTS = 22, PASSES = 3 };
    ScaleTrial tried[STARTS / 2 * PASSES];
    int tried_count = 0;
    const float extreme = signed_max(x, n);
    float best = 0;
    double best_error = 0;
    for (int i = 0; i < n; i++) best_error += (double)x[i] * x[i];
    for (int s = 0; s < STARTS; s += 2) { // every other start: s % 11 - 5 even below 11, odd above
        const float level = (float)(s < 11 ? lowest : highest) + 0.1f * (float)(s % 11 - 5);
        float scale = extreme / level;
        for (int pass = 0; pass < PASSES && scale != 0; pass++) {
            const ScaleTrial *trial = NULL;
            for (int k = 0; k < tried_count && !trial; k++)
                if (tried[k].scale == scale) trial = &tried[k];
            if (!trial) {
                double error = 0, xq = 0, qq = 0;
                for (int i = 0; i < n; i++) {
                    const int q = clamp_int(round_nearest(x[i] / scale), lowest, highest);
                    const double e = (double)x[i] - (double)scale * q;
                    error += e * e, xq += (double)x[i] * q, qq += (double)q * q;
                }
                tried[tried_count] = (ScaleTrial){scale, error, xq, qq};
                trial = &tried[tried_count++];
            }
            if (trial->error < best_error) best_error = trial->error, best = scale;
            if (trial->qq == 0) break;
            scale = (float)(trial->xq / trial->qq);
        }
    }
    return best;
}

// Q3_K: sixteen sub-blocks of 16, y = d * (sc - 32) * q with q in [-4, 3] and 6-bit sc
// (gguf_dequant.c's block_q3_k: 32 bytes of high bits, 64 of low 2-bit codes, the 12 bytes of
// packed scales, d). Each sub-block's scale is fitted (fit_signed_scale), d puts the one of
// largest magnitude on -32, and each value's code is chosen for its quantized scale. A
// value's code u = q + 4 in [0, 7] is stored as its low 2 bits and its high bit (set: q >= 0).
static void block_q3_k(const float *x, uint8_t *out) {
    float scales[16];
    for (int j = 0; j < 16; j++) scales[j] = fit_signed_scale(x + 16 * j, 16, -4, 3);
    float d;
    store_f16(out + 108, signed_max(scales, 16) / -32.0f, &d);
    int sc[16];
    uint8_t *packed = out + 96;
    memset(packed, 0, 12);
    for (int k = 0; k < 16; k++) {
        sc[k] = d != 0 ? clamp_int((int)lroundf(scales[k] / d), -32, 31) + 32 : 32;
        packed[k % 8] |= (uint8_t)((sc[k] & 0x0f) << (4 * (k / 8)));
        packed[8 + k % 4] |= (uint8_t)((sc[k] >> 4) << (2 * (k / 4)));
    }
    uint8_t *hmask = out, *qs = out + 32;
    memset(hmask, 0, 32), memset(qs, 0, 64);
    for (int i = 0; i < QK_K; i++) {
        const float step = d * (float)(sc[i / 16] - 32);
        const int u = (step != 0 ? clamp_int((int)lroundf(x[i] / step), -4, 3) : 0) + 4;
        qs[(i / 128) * 32 + i % 32] |= (uint8_t)((u & 3) << (2 * ((i % 128) / 32)));
        hmask[i % 32] |= (uint8_t)((u >> 2) << (i / 32));
    }
}

bool gguf_can_quantize(GgmlType type) {
    return type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1 ||
           type == GGML_TYPE_Q4_1 || type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_IQ4_XS ||
           type == GGML_TYPE_Q2_K || type == GGML_TYPE_Q3_K ||
           type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K;
}

size_t gguf_quantized_size(GgmlType type, int64_t n) {
    const GgmlTypeInfo *info = gguf_type_info(type);
    CHECK(info && gguf_can_quantize(type) && n % info->block_size == 0, "%lld values as %s", (long long)n,
          gguf_type_name(type));
    return (size_t)(n / info->block_size) * info->type_size;
}

void gguf_quantize(GgmlType type, const float *x, void *out, int64_t n) {
    const GgmlTypeInfo *info = gguf_type_info(type);
    CHECK(info && gguf_can_quantize(type) && n % info->block_size == 0, "%lld values as %s", (long long)n,
          gguf_type_name(type));
    void (*block)(const float *, uint8_t *) = type == GGML_TYPE_Q8_0   ? block_q8_0
                                              : type == GGML_TYPE_Q4_0 ? block_q4_0
                                              : type == GGML_TYPE_Q5_0 ? block_q5_0
                                              : type == GGML_TYPE_Q5_1 ? block_q5_1
                                              : type == GGML_TYPE_Q4_1 ? block_q4_1
                                              : type == GGML_TYPE_IQ4_NL ? block_iq4_nl
                                              : type == GGML_TYPE_IQ4_XS ? block_iq4_xs
                                              : type == GGML_TYPE_Q2_K ? block_q2_k
                                              : type == GGML_TYPE_Q3_K ? block_q3_k
                                              : type == GGML_TYPE_Q4_K ? block_q4_k
                                              : type == GGML_TYPE_Q5_K ? block_q5_k
                                                                       : block_q6_k;
    uint8_t *bytes = out;
    // Each block is found from its own values alone, so the threads' split changes no byte. The
    // searches of IQ4_NL, IQ4_XS, Q3_K and Q2_K take most of a model's quantization time.
    const int64_t blocks = n / info->block_size;
#pragma omp parallel for schedule(static) if (blocks >= 256)
    for (int64_t b = 0; b < blocks; b++) block(x + b * info->block_size, bytes + b * info->type_size);
}
