// marlhf: one binary, one command per stage of RLHF. See `marlhf --help`.
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "core/check.h"
#include "dist/dist.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    bool data_parallel; // may run as one of several processes under mpirun (dist/dist.h)
} Command;

static const Command commands[] = {
    {"logprobs", cmd_logprobs, "per-token log-probs and top-1 next tokens of given token ids", false},
    {"sft", cmd_sft, "supervised fine-tuning on prompt/response data (step 1)", true},
    {"rm", cmd_rm, "train a reward model on chosen/rejected pairs or ranked responses (step 2)", true},
    {"dpo", cmd_dpo, "direct preference optimization on chosen/rejected pairs (DPO, IPO, hinge, SimPO, ORPO)", true},
    {"kto", cmd_kto, "KTO on completions labelled desirable or undesirable (or on pairs)", true},
    {"ppo", cmd_ppo, "PPO / MA-PPO against a reward model with macro actions (step 3)", true},
    {"pipeline", cmd_pipeline, "SFT -> reward model -> PPO from one JSON file, resumable at any stage", false},
    {"infer", cmd_infer, "responses of a policy to validation prompts, scored by a reward model (JSONL)", true},
    {"sample", cmd_sample, "the evaluation instances of a results file (stratified by subreddit for TL;DR)", false},
    {"judge", cmd_judge, "pairwise LLM judge of two results files over an OpenAI-compatible API (win rate)", false},
    {"human-eval", cmd_human_eval, "blind pairwise comparison of two results files by a person (web page or terminal)", false},
    {"report", cmd_report, "an HTML page of one or more runs: every metric plotted, samples before/after", false},
    {"generate", cmd_generate, "generate completions for prompts (arguments or JSONL), batched, with a KV cache", true},
    {"chat", cmd_chat, "chat with a model interactively, replies streamed", false},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server for a model (chat and text completions, streaming)", false},
    {"convert", cmd_convert, "convert a GGUF file or Hugging Face folder into a Hugging Face folder", false},
    {"tokenize", cmd_tokenize, "text to token ids (or ids to text) with a model's tokenizer", false},
};

static void print_usage(FILE *out) {
    fprintf(out, "marlhf: RLHF with macro actions, in C\n\nusage: marlhf <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`marlhf <command> --help` lists a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name)) continue;
        if (dist_init(&argc, &argv) != 0) die_user("%s", err_msg());
        if (dist_world_size() > 1 && !commands[i].data_parallel)
            die_user("marlhf %s runs as one process; only sft, rm, dpo, kto, ppo, infer and generate run under mpirun with %d processes",
                     commands[i].name, dist_world_size());
        int rc = commands[i].run(argc - 2, argv + 2);
        dist_finalize();
        return rc;
    }
    die_user("unknown command '%s' (marlhf --help lists them)", argv[1]);
}
