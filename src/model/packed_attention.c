#include "model/packed_attention.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

bool packed_attention_active(const Model *model) { return model->acts.packed.count > 0; }

void packed_attention_free(Model *model) {
    const OpsBackend *ops = model->ops;
    Activations *a = &model->acts;
    void *buffers[] = {a->packed.positions, a->packed.row_start, a->packed.qkv, a->packed.dqkv,
                       a->packed.out,       a->packed.dout,      a->packed.saved};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        if (buffers[i]) ops->free(buffers[i]);
    free(a->packed.segments);
    memset(&a->packed, 0, sizeof a->packed);
}

static void grow_buffers(Model *model, long slots, long saved) {
    const OpsBackend *ops = model->ops;
    const ModelConfig *cfg = &model->config;
    Activations *a = &model->acts;
    const long q_dim = (long)cfg->num_heads * cfg->head_dim, kv_dim = (long)cfg->num_kv_heads * cfg->head_dim;
    if (slots > a->packed.slots_capacity) {
        void *old[] = {a->packed.positions, a->packed.row_start, a->packed.qkv, a->packed.dqkv, a->packed.out,
                       a->packed.dout};
        for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
            if (old[i]) ops->free(old[i]);
        // Segments never outnumber the slots: row_start has room for as many.
        a->packed.positions = ops->alloc((size_t)slots * sizeof(int));
        a->packed.row_start = ops->alloc((size_t)slots * sizeof(int));
        a->packed.qkv = ops->alloc((size_t)slots * (q_dim + 2 * kv_dim) * sizeof(float));
        a->packed.dqkv = ops->alloc((size_t)slots * (q_dim + 2 * kv_dim) * sizeof(float));
        a->packed.out = ops->alloc((size_t)slots * q_dim * sizeof(float));
        a->packed.dout = ops->alloc((size_t)slots * q_dim * sizeof(float));
        a->packed.slots_capacity = slots;
    }
    if (saved > a->packed.saved_capacity) {
        if (a->packed.saved) ops->free(a->packed.saved);
        a->packed.saved = ops->alloc((size_t)saved * sizeof(float));
        a->packed.saved_capacity = saved;
    }
}

void packed_attention_begin(Model *model, const ModelBatch *batch, int *positions) {
    const ModelConfig *cfg = &model->config;
    const OpsBackend *ops = model->ops;
    Activations *a = &model->acts;
    a->packed.count = 0;
    a->packed.T = 0;
    if (!batch->segments) return;
    const int B = batch->B, T = batch->T, count = batch->segment_count;
    CHECK(count > 0, "a packed batch without segments");
    memset(positions, 0, (size_t)B * T * sizeof(int));
    int longest = 0;
    for (int s = 0; s < count; s++) {
        const ModelSegment *segment = &batch->segments[s];
        CHECK(segment->row >= 0 && segment->row < B && segment->start >= 0 && segment->length > 0 &&
                  segment->start + segment->length <= T,
              "segment %d (row %d, slots %d + %d) lies outside the %d x %d batch", s, segment->row, segment->start,
              segment->length, B, T);
        if (s > 0) {
            const ModelSegment *before = &batch->segments[s - 1];
            CHECK(segment->row > before->row ||
                      (segment->row == before->row && segment->start >= before->start + before->length),
                  "segment %d (row %d, slot %d) does not follow segment %d (row %d, slots %d + %d)", s, segment->row,
                  segment->start, s - 1, before->row, before->start, before->length);
        }
        CHECK(cfg->positions != POSITIONS_LEARNED || segment->length <= cfg->max_position_embeddings,
              "segment %d has %d tokens, past the model's %d positions", s, segment->length,
              cfg->max_position_embeddings);
        for (int t = 0; t < segment->length; t++) positions[(long)segment->row * T + segment->start + t] = t;
        if (segment->length > longest) longest = segment->length;
    }
    if (count > a->packed.capacity) {
        a->packed.segments = xrealloc(a->packed.segments, (size_t)count * sizeof(ModelSegment));
        a->packed.capacity = count;
    }
    memcpy(a->packed.segments, batch->segments, (size_t)count * sizeof(ModelSegment));
    a->packed.count = count;
    a->packed.T = longest;

    const long slots = (long)count * longest;
    grow_buffers(model, slots, model_attention_saved_floats(model, count, longest, 0, cfg->num_layers - 1));
    // In the attention's layout every row starts at its first slot, positions count from there.
    int *host = xmalloc((size_t)slots * sizeof(int));
    for (long i = 0; i < slots; i++) host[i] = (int)(i % longest);
    ops->copy_to_device(a->packed.positions, host, (size_t)slots * sizeof(int));
    memset(host, 0, (size_t)count * sizeof(int));
    ops->copy_to_device(a->packed.row_start, host, (size_t)count * sizeof(int));
    free(host);
    // The copies below write a segment's slots only: the rest of the layout stays zero, finite
    // keys and values that no real query reads (they follow it) and gradients of nothing.
    const long q_dim = (long)cfg->num_heads * cfg->head_dim, kv_dim = (long)cfg->num_kv_heads * cfg->head_dim;
    ops->fill_zero(a->packed.qkv, slots * (q_dim + 2 * kv_dim));
    ops->fill_zero(a->packed.dout, slots * q_dim);
}

// Whether the segments cover every slot of the batch (no padding to zero-fill).
static bool covers_every_slot(const Activations *a) {
    long covered = 0;
    for (int s = 0; s < a->packed.count; s++) covered += a->packed.segments[s].length;
    return covered == (long)a->B * a->T;
}

// Copies `width` floats of every segment slot between the batch's rows (`slots`: rows of
// slot_stride floats, B x T of them) and the attention's layout (`rows`: row_stride floats a
// slot, [count, T]).
static void move_slots(const Model *model, float *slots, long slot_stride, float *rows, long row_stride, int width,
                       bool to_rows) {
    const Activations *a = &model->acts;
    for (int s = 0; s < a->packed.count; s++) {
        const ModelSegment *segment = &a->packed.segments[s];
        float *at_slot = slots + ((long)segment->row * a->T + segment->start) * slot_stride;
        float *at_row = rows + (long)s * a->packed.T * row_stride;
        if (to_rows) model->ops->copy_rows(at_row, row_stride, at_slot, slot_stride, segment->length, width);
        else model->ops->copy_rows(at_slot, slot_stride, at_row, row_stride, segment->length, width);
    }
}

// q, k, v (or their gradients) in one of the two layouts: the batch's or the attention's.
typedef struct {
    float *q, *k, *v;
    int q_row_stride, kv_row_stride;
} Qkv;

// Whether q, k and v are the columns of one [slots, q | k | v] buffer.
static bool qkv_side_by_side(const Qkv *x, int q_dim, int kv_dim) {
    const int width = q_dim + 2 * kv_dim;
    return x->q_row_stride == width && x->kv_row_stride == width && x->k == x->q + q_dim && x->v == x->k + kv_dim;
}

// The attention's layout of `batch_layout` in `buffer` (slots * (q_dim + 2 kv_dim) floats): the
// same columns of one buffer when they are side by side, else three buffers of their own.
static Qkv rows_layout(const Model *model, const Qkv *batch_layout, float *buffer) {
    const ModelConfig *cfg = &model->config;
    const int q_dim = cfg->num_heads * cfg->head_dim, kv_dim = cfg->num_kv_heads * cfg->head_dim;
    const long slots = (long)model->acts.packed.count * model->acts.packed.T;
    if (qkv_side_by_side(batch_layout, q_dim, kv_dim))
        return (Qkv){buffer, buffer + q_dim, buffer + q_dim + kv_dim, batch_layout->q_row_stride,
                     batch_layout->kv_row_stride};
    return (Qkv){buffer, buffer + slots * q_dim, buffer + slots * (q_dim + kv_dim), q_dim, kv_dim};
}

static void move_qkv(const Model *model, const Qkv *batch_layout, const Qkv *rows, bool to_rows) {
    const ModelConfig *cfg = &model->config;
    const int q_dim = cfg->num_heads * cfg->head_dim, kv_dim = cfg->num_kv_heads * cfg->head_dim;
    if (qkv_side_by_side(batch_layout, q_dim, kv_dim)) { // one copy a segment
        move_slots(model, batch_layout->q, batch_layout->q_row_stride, rows->q, rows->q_row_stride, q_dim + 2 * kv_dim,
                   to_rows);
        return;
    }
    move_slots(model, batch_layout->q, batch_layout->q_row_stride, rows->q, rows->q_row_stride, q_dim, to_rows);
    move_slots(model, batch_layout->k, batch_layout->kv_row_stride, rows->k, rows->kv_row_stride, kv_dim, to_rows);
    move_slots(model, batch_layout->v, batch_layout->kv_row_stride, rows->v, rows->kv_row_stride, kv_dim, to_rows);
}

// The forward op in the attention's layout, into packed.out and packed.saved.
static void forward_in_rows(Model *model, int l, const Qkv *rows, const float *inv_freq) {
    const ModelConfig *cfg = &model->config;
    const Activations *a = &model->acts;
    const int window = config_layer_window(cfg, l);
    if (inv_freq)
        model->ops->attention_forward_rotary(a->packed.out, a->packed.saved, rows->q, rows->k, rows->v,
                                             rows->q_row_stride, rows->kv_row_stride, a->packed.row_start,
                                             a->packed.positions, inv_freq, a->packed.count, a->packed.T,
                                             cfg->num_heads, cfg->num_kv_heads, cfg->head_dim,
                                             cfg->attn_logit_softcap, window);
    else
        model->ops->attention_forward(a->packed.out, a->packed.saved, rows->q, rows->k, rows->v, a->packed.row_start,
                                      a->packed.count, a->packed.T, cfg->num_heads, cfg->num_kv_heads, cfg->head_dim,
                                      cfg->attn_logit_softcap, window);
}

// The batch's q, k, v gathered into packed.qkv.
static Qkv gather_qkv(Model *model, const float *q, const float *k, const float *v, int q_row_stride,
                      int kv_row_stride, const float *inv_freq) {
    const ModelConfig *cfg = &model->config;
    const Qkv batch_layout = {(float *)q, (float *)k, (float *)v, q_row_stride, kv_row_stride};
    const Qkv rows = rows_layout(model, &batch_layout, model->acts.packed.qkv);
    // The op without rotation (attention_forward) takes three buffers of their own.
    CHECK(inv_freq || !qkv_side_by_side(&batch_layout, cfg->num_heads * cfg->head_dim,
                                        cfg->num_kv_heads * cfg->head_dim),
          "packed attention: q, k and v side by side need the rotating op");
    move_qkv(model, &batch_layout, &rows, true);
    return rows;
}

void packed_attention_forward(Model *model, int l, float *out, const float *q, const float *k, const float *v,
                              int q_row_stride, int kv_row_stride, const float *inv_freq) {
    const ModelConfig *cfg = &model->config;
    const Activations *a = &model->acts;
    const int q_dim = cfg->num_heads * cfg->head_dim;
    const Qkv rows = gather_qkv(model, q, k, v, q_row_stride, kv_row_stride, inv_freq);
    forward_in_rows(model, l, &rows, inv_freq);
    if (!covers_every_slot(a)) model->ops->fill_zero(out, (long)a->B * a->T * q_dim);
    move_slots(model, out, q_dim, a->packed.out, q_dim, q_dim, false);
}

void packed_attention_backward(Model *model, int l, float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v, int q_row_stride, int kv_row_stride,
                               const float *inv_freq) {
    const ModelConfig *cfg = &model->config;
    const OpsBackend *ops = model->ops;
    const Activations *a = &model->acts;
    const int q_dim = cfg->num_heads * cfg->head_dim, kv_dim = cfg->num_kv_heads * cfg->head_dim;
    const int window = config_layer_window(cfg, l);
    const Qkv rows = gather_qkv(model, q, k, v, q_row_stride, kv_row_stride, inv_freq);
    forward_in_rows(model, l, &rows, inv_freq); // the saved state, and the output the backward reads
    move_slots(model, (float *)dout, q_dim, a->packed.dout, q_dim, q_dim, true);
    const Qkv batch_gradients = {dq, dk, dv, q_row_stride, kv_row_stride};
    const Qkv row_gradients = rows_layout(model, &batch_gradients, a->packed.dqkv);
    if (inv_freq)
        ops->attention_backward_rotary(row_gradients.q, row_gradients.k, row_gradients.v, a->packed.dout,
                                       a->packed.out, a->packed.saved, rows.q, rows.k, rows.v, rows.q_row_stride,
                                       rows.kv_row_stride, a->packed.row_start, a->packed.positions, inv_freq,
                                       a->packed.count, a->packed.T, cfg->num_heads, cfg->num_kv_heads, cfg->head_dim,
                                       cfg->attn_logit_softcap, window);
    else
        ops->attention_backward(row_gradients.q, row_gradients.k, row_gradients.v, a->packed.dout, a->packed.out,
                                a->packed.saved, rows.q, rows.k, rows.v, a->packed.row_start, a->packed.count,
                                a->packed.T, cfg->num_heads, cfg->num_kv_heads, cfg->head_dim, cfg->attn_logit_softcap,
                                window);
    if (!covers_every_slot(a)) { // the ops write every slot: so do these
        const long N = (long)a->B * a->T;
        if (qkv_side_by_side(&batch_gradients, q_dim, kv_dim)) ops->fill_zero(dq, N * (q_dim + 2 * kv_dim));
        else {
            ops->fill_zero(dq, N * q_dim);
            ops->fill_zero(dk, N * kv_dim);
            ops->fill_zero(dv, N * kv_dim);
        }
    }
    move_qkv(model, &batch_gradients, &row_gradients, false);
}
