// `--quantize q4_k_m`, `q5_k_m`, `q3_k_m`, `q2_k`, `iq4_nl` and `iq4_xs` (model/quantize.h):
// llama.cpp's mix of that name, each matrix in the type such a file holds it in, computed from
// that type's own bits.
//
// From a GGUF file, a tensor stored as Q4_K, Q5_K, Q6_K, Q3_K or Q2_K (ops/kquant.h) keeps the
// file's bytes as they are, on every backend (ops/cuda/dequantize.cuh has kernels for all five),
// and one stored as Q5_0, Q4_0, Q8_0, Q4_1 or Q5_1 (the mix's fallbacks for rows that 256 does
// not divide, or a Q4_0 / Q8_0 / Q4_1 / Q5_1 file's layers) keeps its blocks split into marlhf's layouts
// (ops/ops.h: the codes as they are, the half-float scales held as floats, 2 bytes a block
// more than the file). IQ4_NL (llama.cpp's Q2_K / Q3_K fallback for such rows) and IQ4_XS
// are held so too, as QUANT_IQ4_NL: an IQ4_XS super-block's eight sub-blocks each get the
// float scale its 6-bit scale gives (d * (s - 32)): 5 bits a weight in memory (4-bit codes,
// a float per 32) where the file has 4.5 (IQ4_NL) or 4.25 (IQ4_XS). Whatever quantizer wrote the file (llama.cpp's with an importance
// matrix included), the model computes from its bits, not from a re-quantization of their
// dequantized values.
//
// A matrix read as floats -- a float model, or a GGUF tensor of a type marlhf does not hold
// -- is quantized with the GGUF writer's block code (io/gguf_quantize.c) to the type `marlhf
// convert --outtype` of the mix would write for it (llama.cpp's per-tensor rule,
// gguf_mix_matrix_type: for q4_k_m Q6_K for the output and some attn_v / ffn_down, Q4_K
// otherwise, Q5_0 / Q8_0 for rows that 256 does not divide), or, for a GGUF tensor of another
// quantized type (MXFP4, the lattice IQ types...), to Q8_0: 8 bits of its coarser grid. Then it
// is held as a file's blocks are (an IQ4_XS matrix as IQ4_NL sub-blocks, above).
//
// `--quantize q4_1` and `q5_1` take a file's tensors the same way (quantized_take_gguf: a Q4_1
// file's Q4_1 matrices and Q8_0 token table as they are); a matrix read as floats is then
// quantized by model/quantize.c (Q4_1 / Q5_1 through quantized_hold_gguf_blocks, the token
// table and head Q8_0).
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "io/gguf_dequant.h"
#include "io/gguf_quantize.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "ops/kquant.h"

// The QuantType that holds GGUF type `type` as it is, or -1.
static int held_type(uint32_t type) {
    switch (type) {
    case GGML_TYPE_Q4_K: return QUANT_Q4_K;
    case GGML_TYPE_Q5_K: return QUANT_Q5_K;
    case GGML_TYPE_Q3_K: return QUANT_Q3_K;
    case GGML_TYPE_Q2_K: return QUANT_Q2_K;
    case GGML_TYPE_Q6_K: return QUANT_Q6_K;
    case GGML_TYPE_Q5_0: return QUANT_Q5_0;
    case GGML_TYPE_Q4_0: return QUANT_Q4_0;
    case GGML_TYPE_Q8_0: return QUANT_Q8_0;
    case GGML_TYPE_Q4_1: return QUANT_Q4_1;
    case GGML_TYPE_Q5_1: return QUANT_Q5_1;
    case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_IQ4_XS: return QUANT_IQ4_NL; // IQ4_XS's sub-blocks of 32, each with its own float scale
    default: return -1;
    }
}

static float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return gguf_f16_to_f32(h);
}

// Fills `matrix` [rows, cols] from GGUF blocks of `type` (a held type): row r from the row of
// `data` that tensor_map_file_row gives (`map` NULL: row r). Built in host memory, then moved
// to the backend's (quantized_to_backend: a GPU's; nothing on the CPU).
static void hold_blocks(const OpsBackend *ops, Q8Matrix *matrix, GgmlType type, const uint8_t *data, long rows,
                        long cols, const TensorMap *map, const ParamEntry *entry) {
    const QuantType held = (QuantType)held_type(type);
    // The row's bytes from the type's block size (gguf_quantized_size is for the types marlhf
    // writes; Q3_K and Q2_K are only read).
    const long block_bytes = gguf_type_info(type)->type_size;
    const long file_row_bytes = cols / gguf_type_info(type)->block_size * block_bytes;
    *matrix = (Q8Matrix){.rows = (int)rows, .cols = (int)cols, .type = held};
    const long blocks = cols / Q8_BLOCK; // of 32, for the types split into marlhf's layouts
    if (quant_is_kquant(held)) matrix->blocks = ops_cpu.alloc((size_t)(rows * file_row_bytes));
    else {
        matrix->values = ops_cpu.alloc((size_t)(held == QUANT_Q8_0 ? rows * cols : rows * cols / 2));
        matrix->scales = ops_cpu.alloc((size_t)(rows * blocks) * sizeof(float));
        if (held == QUANT_Q5_0 || held == QUANT_Q5_1)
            matrix->high_bits = ops_cpu.alloc((size_t)(rows * blocks) * sizeof(uint32_t));
        if (held == QUANT_Q4_1 || held == QUANT_Q5_1) matrix->mins = ops_cpu.alloc((size_t)(rows * blocks) * sizeof(float));
    }
    for (long r = 0; r < rows; r++) {
        const uint8_t *row = data + (map ? tensor_map_file_row(map, entry, r) : r) * file_row_bytes;
        if (quant_is_kquant(held)) {
            memcpy(matrix->blocks + r * file_row_bytes, row, (size_t)file_row_bytes);
            continue;
        }
        if (type == GGML_TYPE_IQ4_XS) { // super-blocks of 256: d, 6-bit sub-block scales, codes
            for (long s = 0; s < cols / KQ_BLOCK; s++) {
                const uint8_t *super = row + s * block_bytes, *scales_low = super + 4, *codes = super + 8;
                const float d = half_at(super);
                uint16_t scales_high;
                memcpy(&scales_high, super + 2, 2);
                for (int sub = 0; sub < KQ_BLOCK / Q8_BLOCK; sub++) {
                    const int low = (scales_low[sub / 2] >> (4 * (sub % 2))) & 0x0F, high = (scales_high >> (2 * sub)) & 3;
                    const long b = s * (KQ_BLOCK / Q8_BLOCK) + sub;
                    // The value io/gguf_dequant.c multiplies the levels by: d * (scale - 32), exact.
                    matrix->scales[r * blocks + b] = d * (float)((low | high << 4) - 32);
                    memcpy(matrix->nibbles + (r * cols + b * Q8_BLOCK) / 2, codes + sub * (Q8_BLOCK / 2), Q8_BLOCK / 2);
                }
            }
            continue;
        }
        for (long b = 0; b < blocks; b++) {
            const uint8_t *block = row + b * block_bytes;
            matrix->scales[r * blocks + b] = half_at(block);
            if (held == QUANT_Q8_0) memcpy(matrix->values + r * cols + b * Q8_BLOCK, block + 2, Q8_BLOCK);
            else if (held == QUANT_Q4_0 || held == QUANT_IQ4_NL) // d, then the 16 bytes of codes
                memcpy(matrix->nibbles + (r * cols + b * Q8_BLOCK) / 2, block + 2, Q8_BLOCK / 2);
            else if (held == QUANT_Q4_1 || held == QUANT_Q5_1) { // d, m, (Q5_1: qh), qs
                matrix->mins[r * blocks + b] = half_at(block + 2);
                if (held == QUANT_Q5_1) memcpy(&matrix->high_bits[r * blocks + b], block + 4, 4);
                memcpy(matrix->nibbles + (r * cols + b * Q8_BLOCK) / 2, block + (held == QUANT_Q5_1 ? 8 : 4), Q8_BLOCK / 2);
            } else {
                memcpy(&matrix->high_bits[r * blocks + b], block + 2, 4);
                memcpy(matrix->nibbles + (r * cols + b * Q8_BLOCK) / 2, block + 6, Q8_BLOCK / 2);
            }
        }
    }
    quantized_to_backend(ops, matrix);
}

void quantized_hold_gguf_blocks(const OpsBackend *ops, Q8Matrix *matrix, GgmlType type, const uint8_t *data, long rows,
                                long cols) {
    CHECK(held_type(type) >= 0, "%s blocks are not held", gguf_type_name(type));
    hold_blocks(ops, matrix, type, data, rows, cols, NULL, NULL);
}

int quantized_take_gguf(Model *model, const ParamEntry *entry, const GgufFile *file, const TensorMap *map) {
    Q8Matrix *matrix = quantized_slot(model, entry);
    const QuantType asked = model->quantized->type;
    if (!matrix || (model->quantized->gguf_mix < 0 && asked != QUANT_Q4_1 && asked != QUANT_Q5_1)) return 0;
    const GgufTensor *t = gguf_find_tensor(file, map->source);
    // Read as floats, quantized_take goes by the file's type (k_mix_take_floats).
    model->quantized->source_type = t ? (int)t->type : -1;
    if (!t || held_type(t->type) < 0 || tensor_map_file_row(map, entry, 0) < 0) return 0;
    const long rows = entry->shape[0], cols = entry->shape[1];
    const long file_rows = t->n_dims == 2 ? (long)t->ne[1] : 0;
    if (t->n_dims != 2 || t->ne[0] != cols || file_rows < rows)
        return err_set("tensor '%s' has shape [%ld, %lld] but the model expects [%ld, %ld] (%s)", map->source,
                       file_rows, (long long)t->ne[0], rows, cols, file->path);
    for (long r = 0; r < rows; r++)
        CHECK(tensor_map_file_row(map, entry, r) < file_rows, "row %ld of '%s' maps outside the file tensor", r,
              map->source);
    hold_blocks(model->ops, matrix, t->type, t->data, rows, cols, map, entry);
    quantized_share_tied_head(model, matrix);
    return 1;
}

void k_mix_take_floats(Model *model, const ParamEntry *entry, Q8Matrix *matrix, const float *weight) {
    const int source = model->quantized->source_type;
    model->quantized->source_type = -1;
    const long rows = entry->shape[0], cols = entry->shape[1];
    GgmlType type = GGML_TYPE_Q8_0;
    if (source < 0 || source == GGML_TYPE_F32 || source == GGML_TYPE_F16 || source == GGML_TYPE_BF16 ||
        held_type((uint32_t)source) >= 0) { // floats (a held type gets here only from a transposed layout)
        TensorMap map;
        tensor_map_gguf(&model->config, entry, &map);
        type = gguf_mix_matrix_type((GgufOutType)model->quantized->gguf_mix, &model->config, map.source, cols);
    }
    CHECK(held_type(type) >= 0, "%s: '%s' would be %s, which marlhf does not hold",
          model_quantize_name(model), entry->name, gguf_type_name(type));
    uint8_t *blocks = xmalloc(gguf_quantized_size(type, rows * cols));
    gguf_quantize(type, weight, blocks, rows * cols);
    hold_blocks(model->ops, matrix, type, blocks, rows, cols, NULL, NULL);
    free(blocks);
}
