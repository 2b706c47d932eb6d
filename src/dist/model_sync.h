// Keeping one model identical on every rank (dist/dist.h): the gradient sum after each
// rank's micro-batches, the start-up broadcast of rank 0's weights, and a fingerprint that
// proves the ranks still agree at the end of a run.
#pragma once
#include "model/model.h"

// Whether the model's backend sums and broadcasts its device memory itself (NCCL) rather
// than through host buffers and MPI: decided once by every rank together at its first
// call (MARLHF_NCCL, dist/dist.h), which all ranks make at the same point.
bool dist_backend_collectives(const Model *model);
// Sums model->grads across ranks in place (host or device memory).
void dist_sum_gradients(Model *model);
// Every rank takes rank 0's weights (after loading or resuming), as torch DDP does at
// construction, so that ranks agree even if a file was read differently somewhere.
void dist_broadcast_weights(Model *model);
// FNV-1a over the bits of the weights (core/hash.h): equal on all ranks iff (almost surely) the weights are.
unsigned long long model_weights_fingerprint(const Model *model);
