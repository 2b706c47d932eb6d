// The gradient sums of GPU ranks taken while the last backward before an optimizer step
// goes on, as torch DDP's buckets and DeepSpeed's overlap_comm do: the head's and final
// norm's gradients are summed while the layers' backward runs, each layer's while the
// layers below it run, the embeddings' last. Without it every sum waits for the whole
// backward, and a 1B model's 4.4 GB of float32 gradients cross the ranks' links after it.
//
// For data-parallel models whose backend sums in its own memory (NCCL:
// dist_backend_collectives) under ZeRO stage 0 or 1 (dist/zero.h, which installs it): each
// span of gradients a backward completes together (dist/shards.h, Model.gradient_hook's
// points) is summed as the point is reached -- an all-reduce (stage 0), or one reduce onto
// each rank that owns a part of the span (stage 1) -- on the collectives' own stream
// (OpsCollectives.sum_floats_beside). Only in the last round of micro-batches of a step
// (dist_backward_round_begin's last_before_step): earlier backwards only add into the
// gradients, and a sum taken before the last would be summed again. A rank that runs no
// backward in that round issues every span's sum at the round's end, in the same order,
// so the ranks' collectives match. The step's first reader of the gradients
// (dist_reduce_gradients) joins the sums first.
//
// Each element is added across ranks once, as by the sum at the step's end; NCCL's order of
// addition within a message may differ with the message's length (its ring), so with more
// than two ranks the bits may differ from one whole-buffer sum (equal to rounding).
#pragma once
#include <stdbool.h>

#include "model/model.h"

// Installs the sums on `model` (its gradient hook, which must be free). shard_counts and
// shard_displs (one per rank, copied) are ZeRO-1's shards, whose sums go to their owner
// only; NULL: every rank gets every sum.
void backward_sums_install(Model *model, const long *shard_counts, const long *shard_displs);
// Whether `model` has them installed.
bool backward_sums_installed(const Model *model);
void backward_sums_free(Model *model);
// A round of micro-batches begins: its backward (at most one a rank) sums the gradients as
// it goes when the round is the last before the optimizer step.
void backward_sums_round_begin(Model *model, bool last_before_step);
// A rank that ran no backward in the last round issues its (settled) gradients' sums here.
void backward_sums_round_end(Model *model);
// Makes the backend's next ops wait for this step's sums, if they were issued; returns
// whether they were (else the caller sums at the step's end, as without the hook).
bool backward_sums_join(Model *model);
