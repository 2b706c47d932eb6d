// How the data-parallel code cuts a model's flat gradient (and weight) buffer: into one
// contiguous shard per rank (ZeRO, dist/zero.h), and into spans whose gradients a backward
// completes together (Model.gradient_hook's points), which are summed while the rest of the
// backward runs (dist/zero.h stage 2, dist/backward_sums.h).
#pragma once
#include <stdbool.h>

#include "model/model.h"

// Rank r's shard of `total` floats: [displs[r], displs[r] + counts[r]), contiguous,
// 16-float aligned, the last one shorter (or empty). counts and displs: one per rank.
void shard_layout(long total, long *counts, long *displs);
// The part of [from, to) in rank r's shard, [*lo, *hi) (empty when *hi <= *lo).
void shard_overlap(const long *counts, const long *displs, int r, long from, long to, long *lo, long *hi);

typedef struct {
    long begin, end; // in trainable floats (a frozen base's: in its floats from 0)
    int point;       // model_gradient_point of its entries
} GradientSpan;

// The model's trainable floats -- or, `frozen_base`, a LoRA model's frozen base before them
// -- as spans of table entries with the same backward point: a run of neighbours in table
// order is one span (the padding between them included, which is always zero). Sorted in
// the order a backward completes them (point num_layers, then the layers downwards, then
// -1), by offset within a point. Returns them (free()) and their count in *count.
GradientSpan *gradient_spans(const Model *model, bool frozen_base, int *count);
