// AdamW over a model's parameter table, with global gradient-norm clipping.
//
// Moments live in two buffers laid out like the weights (model/params.h); the decay flag
// of each table entry decides whether it is decayed. Arithmetic follows torch.optim.AdamW
// and torch.nn.utils.clip_grad_norm_.
#pragma once
#include "model/model.h"

typedef struct {
    float beta1, beta2, eps, weight_decay;
} AdamWConfig;

typedef struct {
    AdamWConfig config;
    float *m, *v; // first and second moments of [begin, end), backend memory
    long step;    // optimizer steps taken
    const OpsBackend *ops;
    long total;   // floats in the model's trainable part (model_trainable_floats)
    // The part of the trainable floats this optimizer holds moments for and updates: all
    // of them, or one rank's shard when the optimizer state is sharded across ranks
    // (dist/zero.h). Offsets count from the model's trainable_offset.
    long begin, end;
    // A sharded optimizer's number, the same on every rank (dist/zero.c: how rank 0 names the
    // moments it reads from another rank for a checkpoint); 0 when not sharded.
    int shard_id;
} AdamW;

// Defaults of the MA-RLHF / DeepSpeed-Chat scripts: betas (0.9, 0.95), eps 1e-8.
AdamWConfig adamw_default_config(float weight_decay);
void adamw_init(AdamW *opt, const Model *model, AdamWConfig config);
// The same for the part [begin, end) of the flat buffer only (a ZeRO-1 shard).
void adamw_init_range(AdamW *opt, const Model *model, AdamWConfig config, long begin, long end);
void adamw_free(AdamW *opt);
// One update with learning rate lr of the weights in [begin, end). Gradients are
// multiplied by grad_scale first (the clipping coefficient, or 1).
void adamw_step(AdamW *opt, Model *model, float lr, float grad_scale);

// L2 norm of all gradients (double accumulation, fixed order).
double grad_global_norm(const Model *model);
// The coefficient clip_grad_norm_ would multiply gradients by: min(1, max / (norm + 1e-6)).
// A max_norm <= 0 disables clipping (returns 1).
float grad_clip_coefficient(double norm, float max_norm);
