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
// Stage 3 (`--zero-stage 3`) shards the layers' weights as well, in the same shards: between
// its uses a rank holds its shard of each layer, and a layer's weights are gathered (an
// all-gather) just before it runs, forward or backward, and given back just after
// (Model.weight_hook). The global tensors -- embeddings, final norm, LM and value heads -- are
// sharded too, but read at both ends of a pass (the embeddings first, the heads after the
// model's forward returns), so they are gathered at a pass's start and kept until another
// sharded model's pass or an optimizer step (stage3_use): one model's at a time. Every pass is then collectives, so the
// ranks must run their passes in step: each forward and backward announces itself, and a rank
// that has finished its own work calls dist_weights_drain, which plays the collectives of
// the others' passes (with zero gradients) until every rank is draining. The training loops
// drain at the end of each round (dist_backward_round_end) and after evaluations, PPO also
// after generation, after each sharded model's experience forwards and after rank 0's
// evaluation (the other ranks play its passes). Rank 0 reads the other ranks' shards while it
// writes a checkpoint (below), and gathers the layers whole only for the final model
// (dist_weights_gather_to_main).
//
// Checkpoints hold all moments either way (written by rank 0, below), so a run can
// resume with the same process count. Stages 1 to 3 need host memory (`--device cpu`).
#pragma once
#include "model/model.h"
#include "train/adamw.h"

// The optimizer of a data-parallel model: all of the buffer (stage 0, or one process) or
// this rank's shard (stages 1 and 2). Stage 2 also installs the model's gradient hook; so do
// stages 0 and 1 for GPU ranks summing with NCCL (dist/backward_sums.h).
void dist_adamw_init(AdamW *opt, Model *model, AdamWConfig config, int zero_stage);
// adamw_free, and the hooks and buffers installed with it (dist_weights_free).
void dist_adamw_free(AdamW *opt, Model *model);
// Zeroes the gradients before a step's first backward (stage 2: gives their pages back).
void dist_zero_grad(Model *model);
// A round of the micro-steps: between begin and end each rank runs at most one backward of
// `model`; `last_before_step` on every rank for the round after which the optimizer steps
// (the sums of dist/backward_sums.h are taken in its backward). Under stage 2, and in the
// last round for those sums, a rank that ran none takes part in that backward's sums at end
// (so no rank waits forever); otherwise they do nothing.
void dist_backward_round_begin(Model *model, bool last_before_step);
void dist_backward_round_end(Model *model);
// Every rank starts from rank 0's weights (collective; after a resume's reload). Unsharded,
// they are broadcast whole (dist_broadcast_weights). Under stage 3 only the global tensors
// are (each rank then keeps its shard of them): each rank loaded its shard of the layers from
// the same files itself (dist_weights_load_range), and the layers are sharded from here (a
// model loaded whole gives back the pages of the parts other ranks own).
void dist_weights_start(Model *model);
// Stage 3, DeepSpeed-Chat's hybrid engine (`--enable-hybrid-engine`): every layer gathered
// whole on every rank at once (collective), so a stretch of forwards -- PPO's generation,
// whose decode steps would otherwise gather every layer once per token -- runs without
// collectives, each rank at its own pace, at the price of the whole model's memory meanwhile.
// dist_weights_reshard (collective) gives the other ranks' parts back; no optimizer step may
// run between the two. Nothing when the model is not sharded.
void dist_weights_gather_all(Model *model);
void dist_weights_reshard(Model *model);
// ModelLoadOptions.keep_range of a model that will train under stage 3: the part of a
// layer's parameter in this rank's shard, all of a global one (embeddings, final norm,
// heads). The shards are those dist_adamw_init(..., 3) plans for the loaded model.
void dist_weights_load_range(const Model *model, const ParamEntry *entry, long *first, long *count);
// Stage 3: plays the other ranks' passes, of whichever sharded model they announce, until
// every rank has called it (collective; nothing unless `model` is sharded). After any stretch
// in which the ranks may run different numbers of forwards and backwards of the model: a
// round of micro-steps (dist_backward_round_end does it), an evaluation. Two sharded models'
// stretches need a drain between them: ranks running passes of different models at once is
// an internal error.
void dist_weights_drain(Model *model);
// Stage 3: every layer's weights to rank 0 (collective), which then runs the model alone
// (its passes announce nothing): the end of a run, before its final write.
void dist_weights_gather_to_main(Model *model);
// Stage 3 for a model that does not train but follows one that does, PPO's EMA copy of the
// actor: the same shards as `trained` (after its dist_adamw_init; the same architecture,
// loaded with dist_weights_load_range), sharded from its dist_weights_start on. It is never
// run while sharded (an internal error); rank 0 reads the other ranks' shards as it writes it
// (dist_serve_shards), and dist_weights_gather_to_main gathers it. Nothing when `trained` is
// not sharded.
void dist_weights_shard_like(Model *follower, const Model *trained);
// Stage 3 for a frozen model that runs forwards, PPO's reference and reward models: each rank
// holds its shard of the layers (loaded with dist_weights_load_range) and gathers each layer
// while a forward runs it, as for a trained model; sharded from its dist_weights_start on.
// Its forwards are drained as a trained model's (dist_weights_drain). Float32 on the CPU,
// without adapters; nothing on one process.
void dist_weights_shard_frozen(Model *model);
// follower = beta follower + (1 - beta) trained, elementwise, over this rank's shard of a
// sharded follower, else over all of it.
void dist_moving_average(Model *follower, const Model *trained, float beta);
// Frees a model's sharding plan and hooks (a follower's; dist_adamw_free does a trained one's).
void dist_weights_free(Model *model);
// True when the model's layers are sharded across ranks (stage 3).
bool dist_weights_sharded(const Model *model);
// Sums the gradients across ranks (this rank's shard only when sharded) and returns the
// global gradient norm, the same on every rank.
double dist_reduce_gradients(Model *model, const AdamW *opt);
// AdamW on this rank's part of the weights; when sharded, every rank then receives the
// other shards' new weights.
void dist_adamw_step(AdamW *opt, Model *model, float lr, float grad_scale);
// Checkpoints. Rank 0 writes every moment into the checkpoint (train/checkpoint.c), and under
// ZeRO-3 every weight (model/weights_io.c, through Model.weight_hook.read), reading the other
// ranks' shards piece by piece while writing, so no rank ever holds more than its shard and
// one piece (a gathered copy would add twice the model's size to rank 0's peak). The other
// ranks answer in dist_serve_shards meanwhile:
//   if (dist_is_main()) failed = save(...) != 0, dist_serving_end();
//   else dist_serve_shards(optimizers, optimizer_count, models, model_count);
// On rank 0: moments `which` (0: m, 1: v) [first, first + count) of any optimizer, its own
// part copied, the others' received.
void dist_adamw_read_moments(const AdamW *opt, int which, long first, long count, float *out);
// On rank 0, once its checkpoint is written or has failed: the other ranks stop serving.
void dist_serving_end(void);
// On the other ranks: answers rank 0's reads of these optimizers' moments, and of these models'
// weights under ZeRO-3 (trained ones and followers), until dist_serving_end.
void dist_serve_shards(const AdamW *const *optimizers, int optimizer_count, const Model *const *models,
                       int model_count);
