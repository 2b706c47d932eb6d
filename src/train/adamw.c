#include "train/adamw.h"

#include <math.h>
#include <string.h>

AdamWConfig adamw_default_config(float weight_decay) {
    return (AdamWConfig){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = weight_decay};
}

void adamw_init_range(AdamW *opt, const Model *model, AdamWConfig config, long begin, long end) {
    memset(opt, 0, sizeof *opt);
    opt->config = config;
    opt->ops = model->ops;
    opt->total = model_trainable_floats(model);
    opt->begin = begin;
    opt->end = end;
    // One float more than the range so that an empty shard still has a buffer.
    opt->m = model->ops->alloc((size_t)(end - begin + 1) * sizeof(float));
    opt->v = model->ops->alloc((size_t)(end - begin + 1) * sizeof(float));
}

void adamw_init(AdamW *opt, const Model *model, AdamWConfig config) {
    adamw_init_range(opt, model, config, 0, model_trainable_floats(model));
}

void adamw_free(AdamW *opt) {
    if (opt->m) opt->ops->free(opt->m);
    if (opt->v) opt->ops->free(opt->v);
    memset(opt, 0, sizeof *opt);
}

void adamw_step(AdamW *opt, Model *model, float lr, float grad_scale) {
    const AdamWConfig *c = &opt->config;
    opt->step++;
    float bias_correction1 = 1.0f - powf(c->beta1, (float)opt->step);
    float bias_correction2 = 1.0f - powf(c->beta2, (float)opt->step);
    float *params = model_trainable_params(model);
    model_settle_gradients(model);
    for (int i = 0; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (e->offset < model->trainable_offset) continue; // frozen
        // The part of this tensor inside [begin, end) (offsets into the trainable part):
        // all of it without sharding.
        const long offset = e->offset - model->trainable_offset;
        long first = offset > opt->begin ? offset : opt->begin;
        long last = offset + e->numel < opt->end ? offset + e->numel : opt->end;
        if (first >= last) continue;
        model->ops->adamw_update(params + first, model->grads + first, opt->m + (first - opt->begin),
                                 opt->v + (first - opt->begin), last - first, lr, c->beta1, c->beta2, c->eps,
                                 e->decay ? c->weight_decay : 0.0f, bias_correction1,
                                 bias_correction2, grad_scale);
    }
}

double grad_global_norm(const Model *model) {
    // Padding between table entries is always zero, so one pass over the buffer is exact.
    model_settle_gradients(model);
    return sqrt(model->ops->sum_squares(model->grads, model_trainable_floats(model)));
}

float grad_clip_coefficient(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    double coefficient = max_norm / (norm + 1e-6);
    return coefficient < 1.0 ? (float)coefficient : 1.0f;
}
