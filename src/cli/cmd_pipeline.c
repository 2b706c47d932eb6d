// marlhf pipeline: SFT -> reward model -> PPO (or SFT -> DPO, or SFT -> KTO) from one config file, like
// DeepSpeed-Chat's e2e_rlhf.py, resumable at any step.
//
// The file is a JSON object:
//   {"output": "runs/austen", "model": "models/base.gguf",        (required)
//    "device": "cpu", "threads": 2, "seed": 1234, "quiet": false,  (optional, given to every stage)
//    "batch-invariant": true,                                      (optional, every stage: cli/batch_invariant.h)
//    "chat-template": "smollm2",                                   (optional, every stage: conversational data)
//    "launcher": ["mpirun", "-np", "4"],                           (optional, see below)
//    "sft": {...}, "rm": {...}, "ppo": {...}}                      (each stage's own options)
// or, for DPO instead of the reward model and PPO, "sft": {...}, "dpo": {...} (KTO: "kto").
// A stage object holds the options of `marlhf sft|rm|ppo|dpo|kto` under their --long names. The
// pipeline wires the stages together: sft trains `model` into OUTPUT/sft, rm starts from
// OUTPUT/sft/final into OUTPUT/rm, ppo takes OUTPUT/sft/final as actor and reference and
// OUTPUT/rm/final as reward model (and critic) into OUTPUT/ppo; dpo starts from
// OUTPUT/sft/final (also its reference) into OUTPUT/dpo, and kto likewise into OUTPUT/kto.
// A stage object may set "model",
// "actor-model", "reward-model" or "output" itself; later stages then follow it.
//
// Each stage runs as its own process (this binary, `marlhf <stage> --config
// OUTPUT/<stage>.json --resume ...`). A stage whose final/ folder exists is finished and
// skipped; an interrupted stage resumes from its newest checkpoint (give it --save-every in
// its options for that); a failed stage stops the pipeline, which exits 2 when the stage
// did (bad input), 3 when ppo's --stop-on-alarm stopped it, else 1.
// With "launcher", each stage's command is run behind that command prefix (found on PATH),
// e.g. ["mpirun", "-np", "4"] trains every stage data parallel on 4 processes
// (dist/dist.h), as DeepSpeed-Chat's scripts start each step with `deepspeed`.
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "io/fs.h"
#include "rl/ppo.h"

static const char *rlhf_stages[] = {"sft", "rm", "ppo", NULL}, *dpo_stages[] = {"sft", "dpo", NULL},
                  *kto_stages[] = {"sft", "kto", NULL};
static const char *all_stage_names[] = {"sft", "rm", "ppo", "dpo", "kto"};
// chat-template: conversational data (lists of messages) rendered with that template in every stage.
static const char *shared_keys[] = {"device", "threads", "seed", "quiet", "batch-invariant", "chat-template"};

// The string value of `key` in `object`, or `fallback` when absent. A present non-string
// value is a user error naming the file.
static const char *string_or(json_t *object, const char *key, const char *fallback, const char *where,
                             const char *file) {
    json_t *value = json_object_get(object, key);
    if (!value) return fallback;
    if (!json_is_string(value)) die_user("\"%s\" in %s must be a string (%s)", key, where, file);
    return json_string_value(value);
}

// Checks the file's keys and returns its stages: sft, rm, ppo, or sft, dpo, or sft, kto.
static const char *const *check_top_level(json_t *root, const char *file) {
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        bool known = !strcmp(key, "output") || !strcmp(key, "model") || !strcmp(key, "launcher");
        for (size_t i = 0; i < sizeof all_stage_names / sizeof all_stage_names[0]; i++)
            known |= !strcmp(key, all_stage_names[i]);
        for (size_t i = 0; i < sizeof shared_keys / sizeof shared_keys[0]; i++) known |= !strcmp(key, shared_keys[i]);
        if (!known)
            die_user("unknown key \"%s\" in %s (output, model, launcher, device, threads, seed, quiet, batch-invariant, chat-template, sft, rm, ppo, dpo, kto)",
                     key, file);
    }
    const bool dpo = json_object_get(root, "dpo") != NULL, kto = json_object_get(root, "kto") != NULL;
    const bool rlhf = json_object_get(root, "rm") || json_object_get(root, "ppo");
    if (dpo + kto + rlhf > 1)
        die_user("%s mixes the \"%s\" stage with \"%s\"; a pipeline runs sft, rm and ppo, or sft and dpo, or sft and kto",
                 file, dpo ? "dpo" : "kto", rlhf ? "rm\"/\"ppo" : "kto");
    const char *const *stages = dpo ? dpo_stages : kto ? kto_stages : rlhf_stages;
    for (size_t i = 0; stages[i]; i++) {
        json_t *stage = json_object_get(root, stages[i]);
        if (!stage)
            die_user("%s has no \"%s\" stage (the pipeline runs sft, rm and ppo, or sft and dpo, or sft and kto)", file,
                     stages[i]);
        if (!json_is_object(stage)) die_user("\"%s\" in %s must be an object of its options", stages[i], file);
    }
    if (!json_object_get(root, "output")) die_user("%s has no \"output\" (the run folder)", file);
    if (!json_object_get(root, "model")) die_user("%s has no \"model\" (the base model for SFT)", file);
    json_t *launcher = json_object_get(root, "launcher");
    if (launcher) {
        bool strings = json_is_array(launcher) && json_array_size(launcher) > 0;
        for (size_t i = 0; strings && i < json_array_size(launcher); i++)
            strings = json_is_string(json_array_get(launcher, i)) && json_string_length(json_array_get(launcher, i)) > 0;
        if (!strings)
            die_user("\"launcher\" in %s must be a non-empty array of strings, e.g. [\"mpirun\", \"-np\", \"2\"]", file);
    }
    return stages;
}

// Runs argv[0..] as a child process (argv[0] looked up on PATH when it has no slash) and
// returns its exit status (128 + signal if killed).
static int run_stage(const char *name, char *const *argv) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) die_user("cannot start a process for stage %s: %s", name, strerror(errno));
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "marlhf: error: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) die_user("waiting for stage %s: %s", name, strerror(errno));
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int cmd_pipeline(int argc, char **argv) {
    bool dry_run = false;
    Option options[] = {
        {"dry-run", "dry_run", OPT_BOOL, &dry_run, "print each stage's command instead of running it", false, false},
    };
    const char *positional[1];
    OptionSet set = {"pipeline",
                     "SFT, reward model and PPO (or SFT and DPO) from one JSON file, each stage resumed or skipped when run again.",
                     "marlhf pipeline PIPELINE.json [--dry-run]", options, sizeof options / sizeof options[0],
                     positional, 1, 0};
    options_parse(&set, argc, argv);
    if (set.num_positional != 1) die_user("give the pipeline file: marlhf pipeline PIPELINE.json (--help)");
    const char *file = positional[0];

    json_error_t error;
    json_t *root = json_load_file(file, 0, &error);
    if (!root) die_user("%s:%d:%d: %s", file, error.line, error.column, error.text);
    if (!json_is_object(root)) die_user("%s must hold a JSON object", file);
    const char *const *stage_names = check_top_level(root, file);
    const char *output = string_or(root, "output", NULL, "the pipeline", file);
    const char *base_model = string_or(root, "model", NULL, "the pipeline", file);
    if (!dry_run && fs_mkdir_p(output) != 0) die_from_err();

    char self[4096];
    ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
    if (length <= 0) die_user("cannot find this program's path (/proc/self/exe): %s", strerror(errno));
    self[length] = '\0';

    // Where each stage's result is, as the later stages see it.
    char *sft_final = NULL, *rm_final = NULL, *policy = NULL;
    int exit_status = 0;
    for (size_t s = 0; stage_names[s]; s++) {
        const char *name = stage_names[s];
        json_t *stage = json_deep_copy(json_object_get(root, name));
        for (size_t i = 0; i < sizeof shared_keys / sizeof shared_keys[0]; i++) {
            json_t *value = json_object_get(root, shared_keys[i]);
            if (value && !json_object_get(stage, shared_keys[i])) json_object_set(stage, shared_keys[i], value);
        }
        char *default_out = fs_join(output, name);
        const char *stage_out = string_or(stage, "output", default_out, name, file);
        json_object_set_new(stage, "output", json_string(stage_out));
        char *final_dir = fs_join(stage_out, "final");
        // The wiring: which model each stage starts from.
        if (!strcmp(name, "sft")) {
            if (!json_object_get(stage, "model")) json_object_set_new(stage, "model", json_string(base_model));
        } else if (!strcmp(name, "rm") || !strcmp(name, "dpo") || !strcmp(name, "kto")) {
            if (!json_object_get(stage, "model")) json_object_set_new(stage, "model", json_string(sft_final));
        } else {
            if (!json_object_get(stage, "actor-model")) json_object_set_new(stage, "actor-model", json_string(sft_final));
            if (!json_object_get(stage, "reward-model")) json_object_set_new(stage, "reward-model", json_string(rm_final));
        }

        char *config_name = xmalloc(strlen(name) + 8);
        sprintf(config_name, "%s.json", name);
        char *config_path = fs_join(output, config_name);
        // [launcher...] self stage --config FILE --resume
        json_t *launcher = json_object_get(root, "launcher");
        size_t prefix = launcher ? json_array_size(launcher) : 0;
        char **argv_stage = xcalloc(prefix + 6, sizeof(char *));
        for (size_t i = 0; i < prefix; i++) argv_stage[i] = (char *)json_string_value(json_array_get(launcher, i));
        char *command[] = {self, (char *)name, "--config", config_path, "--resume"};
        memcpy(argv_stage + prefix, command, sizeof command);
        // final/ is written atomically (io/fs.h): its presence means the stage finished.
        char *final_config = fs_join(final_dir, strcmp(name, "ppo") ? "config.json" : "actor/config.json");
        if (fs_is_file(final_config)) {
            fprintf(stderr, "pipeline: %s already finished (%s), skipped\n", name, final_dir);
        } else if (dry_run) {
            char *text = json_dumps(stage, JSON_COMPACT | JSON_SORT_KEYS);
            for (size_t i = 0; argv_stage[i]; i++) printf("%s%s", i ? " " : "", argv_stage[i]);
            printf("    # %s = %s\n", config_path, text);
            free(text);
        } else {
            char *text = json_dumps(stage, JSON_INDENT(2) | JSON_SORT_KEYS);
            if (fs_write_file_atomic(config_path, text, strlen(text)) != 0) die_from_err();
            free(text);
            fprintf(stderr, "pipeline: %s -> %s\n", name, stage_out);
            int status = run_stage(name, argv_stage);
            if (status != 0) {
                fprintf(stderr, "marlhf: error: pipeline stopped: stage %s exited with status %d; finished stages "
                                "are kept, run the pipeline again to continue (%s)\n", name, status, file);
                exit_status = status == 2 || status == PPO_STOPPED_BY_ALARM ? status : 1;
            }
        }
        if (!strcmp(name, "sft")) sft_final = xstrdup(final_dir);
        if (!strcmp(name, "rm")) rm_final = xstrdup(final_dir);
        if (!strcmp(name, "ppo")) policy = fs_join(stage_out, "final/actor");
        if (!strcmp(name, "dpo") || !strcmp(name, "kto")) policy = xstrdup(final_dir);
        free(final_config), free(config_path), free(config_name), free(final_dir), free(default_out), free(argv_stage);
        json_decref(stage);
        if (exit_status != 0) break;
    }
    if (!dry_run && exit_status == 0) fprintf(stderr, "pipeline: done; the policy is in %s\n", policy);
    free(sft_final), free(rm_final), free(policy);
    json_decref(root);
    return exit_status;
}
