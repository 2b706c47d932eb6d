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
// Stage 2 (`--zero-stage 2`) shards the gradients as well: the same shards, but the sums are
// taken during each backward (Model.gradient_hook), part by part as the backward completes
// them -- the head and final norm, then each layer, then the embeddings -- and of each part a
// rank keeps its shard's sums and gives the pages of the rest back to the system. A rank then
// holds one W-th of the gradients between backwards, and at most the embeddings plus the
// layer in progress beyond that during one. The price is a reduce-scatter per backward
// instead of per optimizer step (DeepSpeed's stage 2 does the same with accumulation), and
// every rank must run the same number of backwards: the loops go in rounds of at most one
// backward per rank (dist_backward_round_begin/_end), and a rank with nothing to do in a
// round takes part in the sums with its zeros. The owner's shard carries the sums of the
// earlier backwards of the step into the next sum, so the result is the same gradient sum
// as stage 1's, added in another order (equal to rounding).
//
// Checkpoints hold all moments either way (gathered on rank 0 when sharded), so a run can
// resume with the same process count. Stages 1 and 2 need host memory (`--device cpu`).
#pragma once
#include "model/model.h"
#include "train/adamw.h"

// The optimizer of a data-parallel model: all of the buffer (stage 0, or one process) or
// this rank's shard (stages 1 and 2). Stage 2 also installs the model's gradient hook.
void dist_adamw_init(AdamW *opt, Model *model, AdamWConfig config, int zero_stage);
// adamw_free, and stage 2's hook and buffers.
void dist_adamw_free(AdamW *opt, Model *model);
// Zeroes the gradients before a step's first backward (stage 2: gives their pages back).
void dist_zero_grad(Model *model);
// A round of the micro-steps: between begin and end each rank runs at most one backward of
// `model`. Under stage 2, a rank that ran none takes part in that backward's sums at end (so
// no rank waits forever); otherwise they do nothing.
void dist_backward_round_begin(Model *model);
void dist_backward_round_end(Model *model);
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
