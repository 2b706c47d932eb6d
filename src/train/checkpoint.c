#include "train/checkpoint.h"

#include <dirent.h>
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/check.h"
#include "dist/zero.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "model/weights_io.h"

char *checkpoint_model_dir(const char *checkpoint_dir, const char *name) {
    return name && *name ? fs_join(checkpoint_dir, name) : xstrdup(checkpoint_dir);
}

typedef struct {
    const AdamW *optimizer;
    int which; // 0: m, 1: v
} MomentsPiece;

// SafetensorsWriteTensor.fill for a sharded optimizer's moments (dist/zero.h): this rank's
// part copied, the other ranks' received, one piece at a time.
static void fill_moments(void *context, long long first, long long count, void *out) {
    const MomentsPiece *piece = context;
    dist_adamw_read_moments(piece->optimizer, piece->which, (long)first, (long)count, out);
}

static int save_optimizer(const char *dir, const Model *model, const AdamW *optimizer) {
    const size_t bytes = (size_t)optimizer->total * sizeof(float);
    // The file always holds every moment. A sharded optimizer's are read from the ranks (and
    // from their backends' memory) while the file is written; the CPU backend's moments are
    // host memory already and are written in place. Neither is copied whole (a copy would add
    // twice the trainable weights' size to the run's peak memory); a GPU's whole moments are.
    const bool sharded = !(optimizer->begin == 0 && optimizer->end == optimizer->total);
    const bool copied = model->ops != &ops_cpu && !sharded;
    float *m = optimizer->m, *v = optimizer->v;
    if (copied) {
        m = xmalloc(bytes), v = xmalloc(bytes);
        model->ops->copy_to_host(m, optimizer->m, bytes);
        model->ops->copy_to_host(v, optimizer->v, bytes);
    }
    int64_t step = optimizer->step;
    SafetensorsWriteTensor tensors[3] = {
        {.name = "adam.m", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {optimizer->total}, .data = m},
        {.name = "adam.v", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {optimizer->total}, .data = v},
        {.name = "adam.step", .dtype = SAFETENSORS_I64, .ndim = 1, .shape = {1}, .data = &step},
    };
    MomentsPiece pieces[2] = {{optimizer, 0}, {optimizer, 1}};
    if (sharded)
        for (int k = 0; k < 2; k++) tensors[k].data = NULL, tensors[k].fill = fill_moments, tensors[k].fill_context = &pieces[k];
    char *path = fs_join(dir, "optimizer.safetensors");
    int rc = safetensors_write(path, tensors, 3, NULL);
    free(path);
    if (copied) free(m), free(v);
    return rc;
}

static long checkpoint_step_of(const char *name) {
    long step;
    char tail;
    if (sscanf(name, "checkpoint-%ld%c", &step, &tail) == 1 && step >= 0) return step;
    return -1;
}

// Steps of RUN_DIR's checkpoints, ascending.
static int list_checkpoints(const char *run_dir, long **steps) {
    *steps = NULL;
    DIR *dir = opendir(run_dir);
    if (!dir) return 0;
    int count = 0, capacity = 0;
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        long step = checkpoint_step_of(entry->d_name);
        if (step < 0) continue;
        if (count == capacity) *steps = xrealloc(*steps, (capacity = capacity ? 2 * capacity : 16) * sizeof(long));
        (*steps)[count++] = step;
    }
    closedir(dir);
    for (int i = 1; i < count; i++)
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            long t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return count;
}

// A run killed while writing leaves its temporaries behind: a half-written
// checkpoint-<step>.tmp-<pid> folder (a model's worth of disk), or a metrics.jsonl.tmp-<pid>
// when the kill lands while metrics_open rewrites the log (fs.h: every atomic write names its
// temporary "<target>.tmp-<pid>"). Once a checkpoint has been saved, such entries of processes
// that no longer exist on this machine are removed. Kept: those of live processes, and a
// temporary whose process also left a <target>.old-<pid> (fs.h: the rename-aside fallback was
// interrupted; the two are the recovery material).
static void remove_stale_temporaries(const char *run_dir) {
    DIR *dir = opendir(run_dir);
    if (!dir) return;
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        const char *marker = NULL; // the last ".tmp-" of the name
        for (const char *at = strstr(entry->d_name, ".tmp-"); at; at = strstr(at + 1, ".tmp-")) marker = at;
        if (!marker || marker == entry->d_name) continue;
        long pid;
        int consumed = 0;
        if (sscanf(marker, ".tmp-%ld%n", &pid, &consumed) != 1 || marker[consumed] != '\0' || pid <= 0 ||
            pid == (long)getpid() || !isdigit((unsigned char)marker[5]))
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; // alive, or not ours to judge
        int target_length = (int)(marker - entry->d_name);
        char old_name[512];
        if (snprintf(old_name, sizeof old_name, "%.*s.old-%ld", target_length, entry->d_name, pid) >=
            (int)sizeof old_name)
            continue;
        char *old = fs_join(run_dir, old_name);
        bool recovery = fs_exists(old);
        free(old);
        if (recovery) continue;
        char *stale = fs_join(run_dir, entry->d_name);
        fs_remove_tree(stale); // a failure only leaves it behind
        free(stale);
    }
    closedir(dir);
}

int checkpoint_save(const char *run_dir, long step, const CheckpointModel *models, int count,
                    const Tokenizer *tokenizer, json_t *state, int keep_last) {
    char name[64];
    snprintf(name, sizeof name, "checkpoint-%ld", step);
    char *final_path = fs_join(run_dir, name);
    FsAtomicDir out;
    int rc = fs_atomic_dir_begin(&out, final_path);
    free(final_path);
    if (rc != 0) return -1;
    for (int i = 0; i < count && rc == 0; i++) {
        char *dir = checkpoint_model_dir(out.tmp_path, models[i].name);
        rc = fs_mkdir_p(dir);
        if (rc == 0) rc = model_write_hf_files(models[i].model, dir);
        if (rc == 0 && models[i].optimizer) rc = save_optimizer(dir, models[i].model, models[i].optimizer);
        if (rc == 0 && tokenizer) rc = tokenizer_write_hf(tokenizer, dir);
        free(dir);
    }
    if (rc == 0) {
        json_object_set_new(state, "step", json_integer(step));
        char *text = json_dumps(state, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
        char *path = fs_join(out.tmp_path, "trainer_state.json");
        rc = fs_write_file_atomic(path, text, strlen(text));
        free(path), free(text);
    }
    if (rc != 0) {
        fs_atomic_dir_abort(&out);
        return -1;
    }
    if (fs_atomic_dir_commit(&out) != 0) return -1;
    remove_stale_temporaries(run_dir);
    if (keep_last > 0) {
        long *steps;
        int n = list_checkpoints(run_dir, &steps);
        for (int i = 0; i < n - keep_last; i++) {
            snprintf(name, sizeof name, "checkpoint-%ld", steps[i]);
            char *old = fs_join(run_dir, name);
            fs_remove_tree(old); // a failure here only leaves an extra checkpoint behind
            free(old);
        }
        free(steps);
    }
    return 0;
}

char *checkpoint_latest(const char *run_dir) {
    long *steps;
    int n = list_checkpoints(run_dir, &steps);
    char *path = NULL;
    for (int i = n - 1; i >= 0 && !path; i--) {
        char name[64];
        snprintf(name, sizeof name, "checkpoint-%ld", steps[i]);
        char *candidate = fs_join(run_dir, name);
        char *state = fs_join(candidate, "trainer_state.json");
        if (fs_is_file(state)) path = candidate; // written last: its presence means complete
        else free(candidate);
        free(state);
    }
    free(steps);
    return path;
}

int checkpoint_load_state(const char *checkpoint_dir, json_t **state) {
    char *path = fs_join(checkpoint_dir, "trainer_state.json");
    json_error_t error;
    *state = json_load_file(path, 0, &error);
    int rc = 0;
    if (!*state) rc = err_set("bad trainer state: %s (%s:%d:%d)", error.text, path, error.line, error.column);
    else if (!json_is_object(*state)) rc = err_set("trainer state must be a JSON object (%s)", path);
    free(path);
    return rc;
}

int checkpoint_load_optimizer(const char *checkpoint_dir, const char *name, const Model *model, AdamW *optimizer) {
    char *dir = checkpoint_model_dir(checkpoint_dir, name);
    char *path = fs_join(dir, "optimizer.safetensors");
    free(dir);
    SafetensorsSet *set;
    if (safetensors_open(path, &set) != 0) {
        free(path);
        return -1;
    }
    const size_t bytes = (size_t)optimizer->total * sizeof(float);
    float *m = xmalloc(bytes), *v = xmalloc(bytes);
    long long dims[1] = {optimizer->total};
    int rc = safetensors_load_f32(set, "adam.m", 1, dims, m);
    if (rc == 0) rc = safetensors_load_f32(set, "adam.v", 1, dims, v);
    const SafetensorsTensor *step = NULL;
    int64_t step_value = 0;
    if (rc == 0) rc = safetensors_require(set, "adam.step", &step);
    if (rc == 0) rc = safetensors_read_i64(step, &step_value, 1);
    if (rc == 0) { // this optimizer's part: all of it, or its shard (dist/zero.h)
        const size_t part = (size_t)(optimizer->end - optimizer->begin) * sizeof(float);
        model->ops->copy_to_device(optimizer->m, m + optimizer->begin, part);
        model->ops->copy_to_device(optimizer->v, v + optimizer->begin, part);
        optimizer->step = step_value;
    }
    safetensors_close(set);
    free(m), free(v), free(path);
    return rc;
}

void checkpoint_record_batch_invariant(json_t *state, const OpsBackend *ops) {
    json_object_set_new(state, "batch_invariant", json_boolean(ops_batch_invariant(ops)));
}

int checkpoint_check_batch_invariant(const json_t *state, const OpsBackend *ops, const char *checkpoint) {
    // A checkpoint from before the record: which kernel it ran on is not known (the
    // environment variable was not recorded), so it is not held against either.
    const json_t *record = json_object_get(state, "batch_invariant");
    if (!record) return 0;
    const bool saved = json_is_true(record), now = ops_batch_invariant(ops);
    // Another matmul kernel rounds the forward differently from the first step on, so the
    // resumed run would not be the run that was saved (loop.h's exact resume).
    if (saved != now)
        return err_set("checkpoint was made %s the row-invariant forward (--batch-invariant %s), this run is %s it (%s): "
                       "resume with the same setting",
                       saved ? "with" : "without", saved ? "true" : "false", now ? "with" : "without", checkpoint);
    return 0;
}
