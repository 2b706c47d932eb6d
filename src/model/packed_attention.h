// Attention over packed rows (ModelBatch.segments, SFT's --packing): several sequences side
// by side in a row, each attending only to its own slots.
//
// The attention ops know one sequence a row (ops.h: causal from the row's first real slot),
// so the layer's q, k and v are copied into a layout of one sequence a row -- [count, T],
// T the longest segment, each sequence from the start of its row, zeros after it -- the op
// runs there, and its output is copied back into the batch's slots (zeros in the padding
// slots). Everything else in a layer works slot by slot and runs on the packed rows as they
// are: that is where packing saves the padding of a batch of unequal rows. The copies go
// through ops->copy_rows, so every backend runs them.
//
// The backward runs the forward again in that layout before the backward op (one set of
// buffers serves every layer, instead of a saved state per layer), then copies dq, dk and dv
// back. q, k and v arrive and dq, dk, dv leave in the layer's layout: three buffers, or the
// columns of one [slots, q | k | v] buffer (ops.h, attention_forward_rotary's row strides).
#pragma once
#include "model/model.h"

// Takes the batch's segments for the forwards and backwards that follow and grows the
// buffers; a batch without segments clears them (the layers then run the ops on the rows).
// Writes positions[B*T]: each slot's position in its segment, 0 outside every segment.
// Checks the segments (inside their rows, in order, no overlap) and the learned positions'
// limit.
void packed_attention_begin(Model *model, const ModelBatch *batch, int *positions);
// Whether the last forward's rows are packed.
bool packed_attention_active(const Model *model);
// The attention of layer l over the packed rows. q, k, v: the layer's, their row strides as
// ops.h's attention_forward_rotary takes them; inv_freq: the RoPE table when the op rotates q
// and k, NULL when they arrive rotated (or the model has no RoPE).
void packed_attention_forward(Model *model, int l, float *out, const float *q, const float *k, const float *v,
                              int q_row_stride, int kv_row_stride, const float *inv_freq);
// Its backward: dq, dk, dv written over, every slot (laid out as q, k, v); dout: the output's
// gradient in the batch's slots.
void packed_attention_backward(Model *model, int l, float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v, int q_row_stride, int kv_row_stride,
                               const float *inv_freq);
// Frees the buffers (activations_free).
void packed_attention_free(Model *model);
