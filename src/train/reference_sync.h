// A reference that follows the policy: TR-DPO (Gorbatovski et al. 2024, "Learn Your Reference
// Model for Real Good Alignment"; TRL's sync_ref_model in its DPO and KTO trainers). The
// reference is a model of the policy's shape held beside it through training; after every
// `steps`-th optimizer step it becomes mixup_alpha x policy + (1 - mixup_alpha) x itself, as
// TRL's SyncRefModelCallback makes it at the end of such a step. The task that owns it
// (train/dpo.c, train/kto.c) then scores its rows with it again, so each step's loss is
// against the reference of the last update, and saves it in every checkpoint
// (TrainTask.checkpoint_model, REFERENCE_SYNC_FOLDER), from which its command loads it on
// --resume.
#pragma once
#include <jansson.h>
#include <stdbool.h>

#include "model/model.h"

#define REFERENCE_SYNC_FOLDER "reference"

typedef struct {
    Model *model;       // the reference; NULL: a fixed one (no updates)
    double mixup_alpha; // the policy's share of each update, in (0, 1]
    long steps;         // optimizer steps between updates
    long updates;       // updates made so far by this process
} ReferenceSync;

// Makes `reference` follow `policy` (sync->model set, no update yet): 0, or -1 with err_set()
// when it cannot -- a quantized reference or one with adapters, or one not shaped as the policy
// (the mix is of whole float weights). The names are the two models' paths, for the message.
int reference_sync_start(ReferenceSync *sync, Model *reference, const Model *policy, double mixup_alpha, long steps,
                         const char *reference_name, const char *policy_name);
// After optimizer step `step` (the steps taken so far, this one included): whether it ends
// with an update, which is then made (every rank alike: the same weights, the same mix).
bool reference_sync_after_step(ReferenceSync *sync, const Model *policy, long step);
// The settings in a trainer state, and the check of a checkpoint's against this run's: 0, or
// -1 with err_set() naming `checkpoint` when one of the two follows the policy and the other
// does not, or they mix otherwise.
void reference_sync_save_state(const ReferenceSync *sync, json_t *state);
int reference_sync_check_state(const ReferenceSync *sync, const json_t *state, const char *checkpoint);
