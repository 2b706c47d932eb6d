// Checkpoints and exact resume.
//
// RUN_DIR/checkpoint-<step>/ holds, for each model of the run, a Hugging Face folder (at
// the root when the run has one model, e.g. SFT; in a subfolder per model, e.g. actor/
// and critic/ for PPO) plus optimizer.safetensors (AdamW moments and step), the tokenizer
// files, and trainer_state.json (step, data cursor, seeds, and whatever else the trainer
// needs to continue). The folder is written to a temporary name, fsynced and renamed, so
// a crash while saving leaves the previous checkpoints intact and no half checkpoint.
#pragma once
#include <jansson.h>

#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "train/adamw.h"

typedef struct {
    const char *name;       // subfolder, or "" for the checkpoint root
    const Model *model;
    const AdamW *optimizer; // NULL for a model that is not trained
} CheckpointModel;

// Writes RUN_DIR/checkpoint-<step>, then removes the oldest checkpoints beyond keep_last
// (keep_last <= 0 keeps all) and the temporaries that killed runs left in RUN_DIR
// (<name>.tmp-<pid> of a process that is gone: half-written checkpoints, metrics.jsonl). `state` is stored as
// trainer_state.json.
int checkpoint_save(const char *run_dir, long step, const CheckpointModel *models, int count,
                    const Tokenizer *tokenizer, json_t *state, int keep_last);

// The newest complete checkpoint of RUN_DIR (xmalloc'd path), or NULL when there is none.
char *checkpoint_latest(const char *run_dir);
// trainer_state.json of a checkpoint (caller json_decref()s it).
int checkpoint_load_state(const char *checkpoint_dir, json_t **state);
// Restores the AdamW moments and step of model `name` (moments sized for `model`).
int checkpoint_load_optimizer(const char *checkpoint_dir, const char *name, const Model *model, AdamW *optimizer);
// The folder holding model `name` of a checkpoint (xmalloc'd).
char *checkpoint_model_dir(const char *checkpoint_dir, const char *name);

// Exact resume needs the kernels the run was saved with: a checkpoint's trainer state
// records "batch_invariant" (ops_batch_invariant: the row-invariant forward of
// --batch-invariant), and a run on `ops` that differs is refused (-1, err_set() naming
// `checkpoint`). A state without the key (checkpoints from before it) is not checked.
int checkpoint_check_batch_invariant(const json_t *state, const OpsBackend *ops, const char *checkpoint);
// Records in a trainer state which forward `ops` runs ("batch_invariant"), for the check above.
void checkpoint_record_batch_invariant(json_t *state, const OpsBackend *ops);
