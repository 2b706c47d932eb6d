#include "ops/cpu/ops_cpu.h"
#include "ops/q4.h"

void cpu_embedding_forward(float *out, const int *tokens, const int *positions,
                           const float *tok_emb, const float *pos_emb, int N, int C,
                           float scale) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *tok_row = tok_emb + (long)tokens[i] * C;
        float *out_row = out + (long)i * C;
        for (int c = 0; c < C; c++) out_row[c] = scale * tok_row[c];
        if (pos_emb) {
            const float *pos_row = pos_emb + (long)positions[i] * C;
            for (int c = 0; c < C; c++) out_row[c] += pos_row[c];
        }
    }
}

void cpu_embedding_forward_q8(float *out, const int *tokens, const int *positions, const Q8Matrix *tok_emb,
                              const float *pos_emb, int N, int C, float scale) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *out_row = out + (long)i * C;
        quant_dequantize_rows(tok_emb, tokens[i], 1, out_row); // Q8_0 or Q4_0
        for (int c = 0; c < C; c++) out_row[c] *= scale;
        if (pos_emb) {
            const float *pos_row = pos_emb + (long)positions[i] * C;
            for (int c = 0; c < C; c++) out_row[c] += pos_row[c];
        }
    }
}

// Several rows may share a token, so rows cannot be split between threads without a
// race; instead each thread owns a block of columns and walks all rows in order.
void cpu_embedding_backward(float *d_tok_emb, float *d_pos_emb, const float *dout,
                            const int *tokens, const int *positions, int N, int C,
                            float scale) {
    const int block = 16;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += block) {
        int c1 = c0 + block < C ? c0 + block : C;
        for (int i = 0; i < N; i++) {
            const float *dout_row = dout + (long)i * C;
            if (d_tok_emb) {
                float *d_tok_row = d_tok_emb + (long)tokens[i] * C;
                for (int c = c0; c < c1; c++) d_tok_row[c] += scale * dout_row[c];
            }
            if (d_pos_emb) {
                float *d_pos_row = d_pos_emb + (long)positions[i] * C;
                for (int c = c0; c < c1; c++) d_pos_row[c] += dout_row[c];
            }
        }
    }
}
