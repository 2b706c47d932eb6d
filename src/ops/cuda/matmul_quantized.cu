// Linear layers and the token table with quantized weights (every ops/ops.h QuantType: Q8_0,
// Q4_0, Q5_0, Q4_1, Q5_1, NF4, the K-quants Q2_K to Q6_K) on the GPU. The blocks stay
// quantized in device memory; each product dequantizes the weight into a bf16 scratch tile of
// rows (dequantize.cuh) and multiplies it with
// cuBLASLt as a float weight's bf16 copy is multiplied (matmul.cu). Nothing is cached: no
// bf16 copy of a quantized weight outlives its product, and the model's float32 buffer has no
// slot for it (model/quantize.h quantized_unstore). The price is one
// dequantization per product, a pass over the weight that is small beside the product
// itself for a training batch or a prefill. A bf16 weight (--quantize bf16) is its own tile:
// cuBLASLt reads it where it is, and nothing is dequantized.
//
// Up to 8 input rows (a decode step, or a short training micro-batch's product alike) skip the
// tile: matvec_quantized.cuh reads the blocks directly and accumulates in fp32, inputs unrounded.
// matmul_forward_q8 (inference) is the same path as matmul_forward_dequantized: the GPU has no
// integer Q8_0 x Q8_0 kernel like the CPU's (ops/cpu/matmul_q8.c); its results are the
// dequantized weights' products whatever kernel_rows says.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/dequantize.cuh"
#include "ops/cuda/matvec_quantized.cuh"

// A tile holds at most this many weights (32 MiB of bf16): the LM head of a large vocabulary
// is dequantized in pieces instead of in one buffer the size of its float copy.
static const long TILE_VALUES = 1l << 24;

// bitsandbytes' dynamic map of the double-quantized NF4 scales, copied to the device once.
static const float *device_dynamic_map(void) {
    static float *map = NULL;
    if (!map) {
        map = (float *)cuda_device_alloc(256 * sizeof(float), "NF4's scale map");
        CUDA_CHECK(cudaMemcpy(map, nf4_dynamic_map(), 256 * sizeof(float), cudaMemcpyHostToDevice));
    }
    return map;
}

static dequantize::Weights weights_of(const Q8Matrix *matrix) {
    return dequantize::weights_for(matrix, matrix->type == QUANT_NF4 && !matrix->scales ? device_dynamic_map() : NULL);
}

static void check_shape(const Q8Matrix *weight, int IC, int OC) {
    const int block = weight->type == QUANT_NF4 ? NF4_BLOCK : quant_is_kquant(weight->type) ? KQ_BLOCK : Q8_BLOCK;
    CHECK(weight->rows == OC && weight->cols == IC && IC % block == 0,
          "quantized weight [%d, %d] used as [%d, %d]", weight->rows, weight->cols, OC, IC);
}

// The decode kernels read their input rows' floats, which a stored input (hold_stored) does
// not have.
static void check_float_rows(const float *x, long n) {
    CHECK(!cuda_stored_values(x, n), "the quantized decode kernel reads floats, which a stored input (hold_stored) "
                                     "does not have");
}

// Rows per tile: a multiple of 64 (so each tile's slice of the output and of the bf16 dout
// starts at least 128-byte aligned for cuBLASLt), at least 64.
static int tile_rows(int IC, int OC) {
    long rows = TILE_VALUES / IC / 64 * 64;
    if (rows < 64) rows = 64;
    return rows < OC ? (int)rows : OC;
}

// Rows [first, first + rows) of the weight as bf16 [rows, IC] in scratch.
static const __nv_bfloat16 *dequantized_tile(const dequantize::Weights &w, int first, int rows) {
    __nv_bfloat16 *tile = (__nv_bfloat16 *)cuda_scratch(SCRATCH_DEQUANTIZED, (size_t)rows * w.matrix.cols * 2);
    dequantize::rows_kernel<<<dequantize::rows_blocks(rows, w.matrix.cols), dequantize::THREADS>>>(tile, w, first,
                                                                                                     rows);
    CUDA_CHECK_LAUNCH();
    return tile;
}

// Calls product(tile, o0, rows) for each tile of the weight's rows [o0, o0 + rows), in order.
template <typename Product> static void for_each_tile(const Q8Matrix *weight, int IC, int OC, Product product) {
    if (weight->type == QUANT_BF16) { // already what cuBLASLt multiplies: one tile of every row
        product(reinterpret_cast<const __nv_bfloat16 *>(weight->bf16), 0, OC);
        return;
    }
    const dequantize::Weights w = weights_of(weight);
    const int step = tile_rows(IC, OC);
    for (int o0 = 0; o0 < OC; o0 += step) {
        const int rows = OC - o0 < step ? OC - o0 : step;
        product(dequantized_tile(w, o0, rows), o0, rows);
    }
}

void cuda_matmul_forward_dequantized(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N,
                                     int IC, int OC) {
    check_shape(weight, IC, OC);
    if (N == 0) return;
    if (N <= matvec::MAX_ROWS) { // a decode step: the blocks read directly (matvec_quantized.cuh)
        check_float_rows(inp, (long)N * IC);
        const matvec::BlockWeights weights = {weights_of(weight)};
        matvec::kernel<<<matvec::blocks_for(OC), matvec::THREADS>>>(out, inp, weights, bias, N, IC, OC);
        CUDA_CHECK_LAUNCH();
        return;
    }
    const __nv_bfloat16 *x = cuda_activation_bf16(SCRATCH_MATMUL_A, inp, (long)N * IC);
    // out[:, o0 : o0 + rows] = x . tile^T:  D(rows x N, ldd OC) = op_T(tile stored IC x rows) * x stored (IC x N)
    for_each_tile(weight, IC, OC, [&](const __nv_bfloat16 *tile, int o0, int rows) {
        cuda_gemm_bf16(true, false, rows, N, IC, 1.0f, tile, IC, x, IC, 0.0f, out + o0, OC, 1, 0, 0, 0);
    });
    if (bias) cuda_add_bias(out, bias, N, OC);
}

// Grid: matvec::blocks_for(I) blocks of matvec::THREADS: matvec::glu_product over a gated
// MLP's two quantized matrices, each [I, IC] (here, not in matvec_quantized.cuh, whose other
// includer, the emulation test of the decode product, has no use for it).
static __global__ void __launch_bounds__(matvec::THREADS)
    glu_kernel(float *act, __nv_bfloat16 *act_copy, const float *inp, matvec::BlockWeights gate,
               matvec::BlockWeights up, int M, int IC, int I, bool use_gelu) {
    matvec::glu_product(act, act_copy, gate, up, matvec::FloatRows{inp}, M, IC, I, use_gelu);
}

// The same over an RMSNorm's input rows, normalised as they are read (matvec.cuh, RowNorm):
// the bits of the norm kernel then glu_kernel.
static __global__ void __launch_bounds__(matvec::THREADS)
    normed_glu_kernel(float *act, __nv_bfloat16 *act_copy, matvec::RowNorm norm, matvec::BlockWeights gate,
                      matvec::BlockWeights up, int M, int IC, int I, bool use_gelu) {
    STATIC_SHARED(float, scales, matvec::MAX_ROWS);
    STATIC_SHARED(double, slots, matvec::MAX_ROWS * matvec::NORM_WARPS);
    matvec::row_inverse_rms(scales, slots, norm, M, IC);
    matvec::glu_product(act, act_copy, gate, up, matvec::NormedRows<false>{norm, scales, IC}, M, IC, I, use_gelu);
}

// Up to 3 quantized matrices over the same input rows (ops.h's matmul_forward_parts_q8: a
// layer's q, k and v) in one launch: the first blocks_for(width0) blocks serve part 0, the
// next blocks_for(width1) part 1, the rest part 2, each column the bits of its part's own
// matvec_quantized.cuh kernel. Named fields, not arrays (matvec.cuh's PartsOutput says why);
// each part's weights a kernel parameter of its own, read by one branch.
struct QuantizedParts {
    float *out0, *out1, *out2;
    const float *bias0, *bias1, *bias2;
    int width0, width1, width2;
    int blocks0, blocks1; // part 1 starts at block blocks0, part 2 at blocks0 + blocks1
};

// Block `block` of one part's own grid: its warps' columns of out[M, width].
template <typename Rows>
DEVICE_INLINE void part_columns(float *out, int width, const matvec::BlockWeights &w, const float *bias, Rows rows,
                                int block, int M, int IC) {
    const int o = block * matvec::WARPS + (int)threadIdx.x / 32;
    if (o < width) matvec::product_column(matvec::Output{out, width}, w, rows, bias, nullptr, M, IC, width, o);
}

template <typename Rows>
DEVICE_INLINE void parts_columns(const QuantizedParts &parts, Rows rows, const matvec::BlockWeights &w0,
                                 const matvec::BlockWeights &w1, const matvec::BlockWeights &w2, int M, int IC) {
    int block = (int)blockIdx.x;
    if (block < parts.blocks0) return part_columns(parts.out0, parts.width0, w0, parts.bias0, rows, block, M, IC);
    block -= parts.blocks0;
    if (block < parts.blocks1) return part_columns(parts.out1, parts.width1, w1, parts.bias1, rows, block, M, IC);
    part_columns(parts.out2, parts.width2, w2, parts.bias2, rows, block - parts.blocks1, M, IC);
}

static __global__ void __launch_bounds__(matvec::THREADS)
    parts_kernel(QuantizedParts parts, const float *inp, matvec::BlockWeights w0, matvec::BlockWeights w1,
                 matvec::BlockWeights w2, int M, int IC) {
    parts_columns(parts, matvec::FloatRows{inp}, w0, w1, w2, M, IC);
}

// The same over an RMSNorm's input rows, normalised as they are read (matvec.cuh, RowNorm).
static __global__ void __launch_bounds__(matvec::THREADS)
    normed_parts_kernel(QuantizedParts parts, matvec::RowNorm norm, matvec::BlockWeights w0, matvec::BlockWeights w1,
                        matvec::BlockWeights w2, int M, int IC) {
    STATIC_SHARED(float, scales, matvec::MAX_ROWS);
    STATIC_SHARED(double, slots, matvec::MAX_ROWS * matvec::NORM_WARPS);
    matvec::row_inverse_rms(scales, slots, norm, M, IC);
    parts_columns(parts, matvec::NormedRows<false>{norm, scales, IC}, w0, w1, w2, M, IC);
}

// A decode step's parts in one launch (parts_kernel, or normed_parts_kernel where the
// input's norm is given: the norm's output never written); otherwise the norm and a
// matmul_forward_q8 per part.
void cuda_matmul_forward_parts_q8(float *const *outs, const Q8Matrix *const *weights, const float *const *biases,
                                  int parts, const float *inp, int N, int IC, int kernel_rows,
                                  const InputRmsNorm *norm) {
    CHECK(parts >= 1 && parts <= 3, "matmul_forward_parts_q8: %d parts", parts);
    if (N == 0 || N > matvec::MAX_ROWS) {
        ops_matmul_forward_parts_q8_in_calls(&ops_cuda, outs, weights, biases, parts, inp, N, IC, kernel_rows, norm);
        return;
    }
    for (int p = 0; p < parts; p++) check_shape(weights[p], IC, weights[p]->rows);
    check_float_rows(norm ? norm->x : inp, (long)N * IC);
    QuantizedParts out = {outs[0], parts > 1 ? outs[1] : NULL, parts > 2 ? outs[2] : NULL,
                          biases[0], parts > 1 ? biases[1] : NULL, parts > 2 ? biases[2] : NULL,
                          weights[0]->rows, parts > 1 ? weights[1]->rows : 0, parts > 2 ? weights[2]->rows : 0,
                          (int)matvec::blocks_for(weights[0]->rows),
                          parts > 1 ? (int)matvec::blocks_for(weights[1]->rows) : 0};
    // A part that is not there: no blocks, weights of part 0 never read.
    const matvec::BlockWeights w0 = {weights_of(weights[0])};
    const matvec::BlockWeights w1 = {parts > 1 ? weights_of(weights[1]) : w0.w};
    const matvec::BlockWeights w2 = {parts > 2 ? weights_of(weights[2]) : w0.w};
    const unsigned blocks = (unsigned)(out.blocks0 + out.blocks1) + (parts > 2 ? matvec::blocks_for(out.width2) : 0);
    if (norm) {
        normed_parts_kernel<<<blocks, matvec::THREADS>>>(out, matvec::row_norm(norm, IC), w0, w1, w2, N, IC);
    } else {
        parts_kernel<<<blocks, matvec::THREADS>>>(out, inp, w0, w1, w2, N, IC);
    }
    CUDA_CHECK_LAUNCH();
}

// A gated MLP's two quantized products and its activation (ops.h's matmul_forward_glu_q8):
// a decode step in one launch (glu_kernel, or normed_glu_kernel where the input's norm is
// given: gate and up never written, nor the norm's output), else the norm, the two products
// and the GLU kernel.
void cuda_matmul_forward_glu_q8(float *act, float *gate, float *up, const float *inp, const Q8Matrix *gate_weight,
                                const Q8Matrix *up_weight, int N, int IC, int width, bool use_gelu,
                                int kernel_rows, const InputRmsNorm *norm) {
    if (N == 0 || N > matvec::MAX_ROWS) {
        ops_matmul_forward_glu_q8_in_calls(&ops_cuda, act, gate, up, inp, gate_weight, up_weight, N, IC, width,
                                           use_gelu, kernel_rows, norm);
        return;
    }
    check_shape(gate_weight, IC, width);
    check_shape(up_weight, IC, width);
    check_float_rows(norm ? norm->x : inp, (long)N * IC);
    __nv_bfloat16 *act_copy = cuda_held_output(&act, (long)N * width);
    const matvec::BlockWeights gate_blocks = {weights_of(gate_weight)}, up_blocks = {weights_of(up_weight)};
    if (norm) {
        normed_glu_kernel<<<matvec::blocks_for(width), matvec::THREADS>>>(act, act_copy, matvec::row_norm(norm, IC),
                                                                           gate_blocks, up_blocks, N, IC, width,
                                                                           use_gelu);
    } else {
        glu_kernel<<<matvec::blocks_for(width), matvec::THREADS>>>(act, act_copy, inp, gate_blocks, up_blocks, N, IC,
                                                                    width, use_gelu);
    }
    CUDA_CHECK_LAUNCH();
}

void cuda_matmul_forward_q8(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC,
                            int OC, int kernel_rows) {
    (void)kernel_rows; // one kernel for every row count (above)
    cuda_matmul_forward_dequantized(out, inp, weight, bias, N, IC, OC);
}

void cuda_matmul_backward_input_q8(float *dinp, const float *dout, const Q8Matrix *weight, int N, int IC, int OC) {
    check_shape(weight, IC, OC);
    if (N == 0) return;
    const __nv_bfloat16 *g = cuda_activation_bf16(SCRATCH_MATMUL_A, dout, (long)N * OC);
    // dinp[N, IC] += dout[:, o0 : o0 + rows] . tile:  D(IC x N) += tile stored (IC x rows) * dout slice stored (rows x N, ld OC)
    for_each_tile(weight, IC, OC, [&](const __nv_bfloat16 *tile, int o0, int rows) {
        cuda_gemm_bf16(false, false, IC, N, rows, 1.0f, tile, IC, g + o0, OC, 1.0f, dinp, IC, 1, 0, 0, 0);
    });
}

void cuda_embedding_forward_q8(float *out, const int *tokens, const int *positions, const Q8Matrix *tok_emb,
                               const float *pos_emb, int N, int C, float scale) {
    CHECK(tok_emb->cols == C && C % dequantize::VALUES_PER_THREAD == 0, "quantized token table [%d, %d] used with C = %d",
          tok_emb->rows, tok_emb->cols, C);
    if (N == 0) return;
    const dequantize::Weights table = weights_of(tok_emb);
    dequantize::embedding_kernel<<<dequantize::rows_blocks(N, C), dequantize::THREADS>>>(out, tokens, positions, table,
                                                                                          pos_emb, N, scale);
    CUDA_CHECK_LAUNCH();
}

void cuda_dequantize_rows(float *out, const Q8Matrix *weight, int first, int count) {
    CHECK(first >= 0 && count >= 0 && first + count <= weight->rows, "rows [%d, %d) of a quantized matrix of %d rows",
          first, first + count, weight->rows);
    if (count == 0) return;
    dequantize::float_rows_kernel<<<dequantize::rows_blocks(count, weight->cols), dequantize::THREADS>>>(
        out, weights_of(weight), first, count);
    CUDA_CHECK_LAUNCH();
}
