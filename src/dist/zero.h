// The optimizer step of a data-parallel model, with the AdamW state optionally sharded
// across ranks: ZeRO stage 1 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models", 2020), `--zero-stage 1`.
//
// Stage 0: every rank holds all moments; gradients are summed everywhere (all-reduce) and
// every rank updates every weight. Stage 1: rank r holds the moments of one contiguous
// 1/W of the flat parameter buffer; the gradient sum is a reduce-scatter (each rank gets
// the sums of its shard only), each rank updates its shard's weights, and an all-gather
// gives every rank the new weights. The same traffic as stage 0's all-reduce, a W-th of
// the AdamW work and of the moments' memory per rank. Elementwise it is the same update;
// only the gradient norm is added up in another order (shard by shard).
//
// Checkpoints hold all moments either way (gathered on rank 0 when sharded), so a run can
// resume with the same process count. Stage 1 needs host memory (`--device cpu`).
#pragma once
#include "model/model.h"
#include "train/adamw.h"

// The optimizer of a data-parallel model: all of the buffer (stage 0, or one process) or
// this rank's shard (stage 1).
void dist_adamw_init(AdamW *opt, const Model *model, AdamWConfig config, int zero_stage);
// Sums the gradients across ranks (this rank's shard only when sharded) and returns the
// global gradient norm, the same on every rank.
double dist_reduce_gradients(Model *model, const AdamW *opt);
// AdamW on this rank's part of the weights; when sharded, every rank then receives the
// other shards' new weights.
void dist_adamw_step(AdamW *opt, Model *model, float lr, float grad_scale);
// Collective, for a checkpoint: on rank 0, *full is an optimizer with every moment (the
// optimizer itself when not sharded, else a gathered copy); unused on the other ranks.
// Release with dist_adamw_gathered_free.
void dist_adamw_gather(const AdamW *opt, AdamW *full);
void dist_adamw_gathered_free(const AdamW *opt, AdamW *full);
