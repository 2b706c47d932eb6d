// DeepSpeed-Chat's deterministic train-phase splits (dschat/utils/data/data_utils.py,
// get_raw_dataset_split_index; spec section 3.1), reproduced index for index:
//
//   1. `--data-split "2,4,4"`: each comma-separated weight is a float; they are divided
//      by their sum (in that order, in double precision): [0.2, 0.4, 0.4].
//   2. boundaries b = [0, b1, b2, ...] with b[k+1] = b[k] + round(w[k] * N), where round
//      is Python's round(): to the nearest integer, halves to even (round(2.5) = 2).
//   3. the rounding error d = b[last] - N is subtracted from EVERY boundary but the
//      first (not only the last), so the extra or missing items land in part 1:
//      N = 10, "1,1,1": [0, 3, 6, 9] -> d = -1 -> [0, 4, 7, 10]. A boundary can even go
//      negative (N = 5, "1,3,3,3": [0, -1, 1, 3, 5]).
//   4. the permutation is numpy.random.RandomState(seed).shuffle(arange(N)) (mt19937.h).
//   5. phase k (1-based: 1 SFT, 2 reward model, 3 PPO) is the Python slice
//      perm[b[k-1]:b[k]]. Python's slice rules are applied as DS-Chat gets them: a
//      negative bound counts from the end (so "1,3,3,3" at N = 5 gives part 1 four items
//      and part 2 none). Such overlapping parts are DS-Chat's behaviour, kept for
//      exactness; they only arise for tiny N.
//
// The same procedure runs separately on a dataset's train split and on its eval split.
// WebGPT has only a train split: DS-Chat (as MA-RLHF configures it) first splits it
// "95,5" into train and eval with the same seed, then applies --data-split inside the
// chosen part (data_split_indices_nested).
//
// Deviations, all on input DS-Chat would not run sensibly: negative, NaN or infinite
// weights and an all-zero split are refused; seeds must be in numpy's [0, 2^32).
// Errors name the option: --data-split or --seed.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#define DATA_WEBGPT_TRAIN_EVAL_SPLIT "95,5"

// The raw DS-Chat boundaries (parts + 1 values, possibly negative, see step 3).
// *boundaries is xmalloc'd (free() it).
int data_split_boundaries(long n, const char *split_spec, long **boundaries, int *parts);

// numpy.random.RandomState(seed).shuffle(numpy.arange(n)). *permutation is xmalloc'd
// (free() it; never NULL).
int data_shuffle_permutation(long n, uint64_t seed, long **permutation);

// The indices (into the n rows) of phase `phase` (1-based) of `split_spec`, in
// permutation order. *indices is xmalloc'd (free() it; never NULL, even when empty).
int data_split_indices(long n, const char *split_spec, int phase, uint64_t seed, long **indices, long *count);

// Two levels, as DS-Chat's WebGPT loader: part `outer_part` (1-based) of `outer_spec`
// (DATA_WEBGPT_TRAIN_EVAL_SPLIT: 1 = train, 2 = eval), then phase `phase` of
// `split_spec` inside it, composed back into indices of the n rows.
int data_split_indices_nested(long n, const char *outer_spec, int outer_part, const char *split_spec, int phase,
                              uint64_t seed, long **indices, long *count);
