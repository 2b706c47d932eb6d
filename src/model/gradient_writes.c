// Gradient tensors that no op has written since model_zero_grad. Zero-filling the whole
// gradient buffer before each accumulation, then adding every weight gradient product into
// it, moves the buffer twice for nothing (4.4 GB each way at a 1B model on a GPU); instead
// the first op to produce a tensor writes over it. The bookkeeping is one flag per table
// entry, found by the gradient view's address: every op is handed whole tensors (the views
// of Model.gradients), so the address is an entry's first float.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "model/model.h"

// The table entry whose gradient starts at `grad`.
static int entry_of_gradient(const Model *model, const float *grad) {
    CHECK(model->grads && grad >= model->grads && grad < model->grads + model_trainable_floats(model),
          "a gradient write outside the model's gradients");
    const long offset = (long)(grad - model->grads) + model->trainable_offset;
    const ParamEntry *entries = model->table.entries;
    int low = 0, high = model->table.count - 1; // the last entry that starts at or before offset
    while (low < high) {
        const int middle = (low + high + 1) / 2;
        if (entries[middle].offset <= offset) low = middle;
        else high = middle - 1;
    }
    CHECK(entries[low].offset == offset, "a gradient write into the middle of %s", entries[low].name);
    return low;
}

static void zero_fill_entry(const Model *model, int i) {
    const ParamEntry *e = &model->table.entries[i];
    model->ops->fill_zero(model->grads + (e->offset - model->trainable_offset), e->numel);
    model->gradient_unwritten[i] = false;
}

// MARLHF_CHECK_GRADIENT_WRITES: 1 on; unset, empty or 0 off; anything else a user error.
static bool checking_writes(void) {
    static int checking = -1;
    if (checking < 0 && (checking = env_switch("MARLHF_CHECK_GRADIENT_WRITES")) < 0) die_from_err();
    return checking;
}

// NaN in every float of every gradient tensor, through host memory a slice at a time (a test
// setting: the backends have no fill of their own for it). Not in the padding between
// tensors, which stays zero (grad_global_norm sums the whole buffer).
static void fill_with_nan(const Model *model) {
    enum { SLICE = 1 << 16 };
    static float nans[SLICE];
    if (!isnan(nans[0]))
        for (int i = 0; i < SLICE; i++) nans[i] = NAN;
    for (int i = 0; i < model->table.count; i++) {
        if (!model->gradient_unwritten[i]) continue;
        const ParamEntry *e = &model->table.entries[i];
        float *grad = model->grads + (e->offset - model->trainable_offset);
        for (long first = 0; first < e->numel; first += SLICE) {
            const long count = e->numel - first < SLICE ? e->numel - first : SLICE;
            model->ops->copy_to_device(grad + first, nans, (size_t)count * sizeof(float));
        }
    }
}

void model_zero_grad(Model *model) {
    CHECK(model->grads, "model_zero_grad on a model without gradients");
    for (int i = 0; i < model->table.count; i++)
        model->gradient_unwritten[i] = model->table.entries[i].offset >= model->trainable_offset;
    if (checking_writes()) fill_with_nan(model);
}

WriteMode model_gradients_write_mode(const Model *model, float *const *grads, int count) {
    enum { MOST = 6 };
    CHECK(count <= MOST, "model_gradients_write_mode: %d gradients at once (at most %d)", count, MOST);
    int entries[MOST];
    bool any = false, all_unwritten = true;
    for (int k = 0; k < count; k++) {
        entries[k] = grads[k] ? entry_of_gradient(model, grads[k]) : -1;
        if (entries[k] < 0) continue;
        any = true;
        all_unwritten = all_unwritten && model->gradient_unwritten[entries[k]];
    }
    all_unwritten = all_unwritten && any;
    for (int k = 0; k < count; k++) {
        if (entries[k] < 0 || !model->gradient_unwritten[entries[k]]) continue;
        if (all_unwritten) model->gradient_unwritten[entries[k]] = false;
        else zero_fill_entry(model, entries[k]);
    }
    return all_unwritten ? WRITE_OVERWRITE : WRITE_ADD;
}

WriteMode model_gradient_write_mode(const Model *model, float *weight_grad, float *bias_grad) {
    float *const grads[2] = {weight_grad, bias_grad};
    return model_gradients_write_mode(model, grads, 2);
}

float *model_gradient_to_add(const Model *model, float *grad) {
    if (!grad) return NULL;
    const int i = entry_of_gradient(model, grad);
    if (model->gradient_unwritten[i]) zero_fill_entry(model, i);
    return grad;
}

void model_settle_gradient_point(const Model *model, int point) {
    for (int i = 0; i < model->table.count; i++)
        if (model->gradient_unwritten[i] && model_gradient_point(model, &model->table.entries[i]) == point)
            zero_fill_entry(model, i);
}

void model_settle_gradients(const Model *model) {
    if (!model->grads) return;
    for (int i = 0; i < model->table.count; i++)
        if (model->gradient_unwritten[i]) zero_fill_entry(model, i);
}
