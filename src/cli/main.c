// marlhf: one binary, one command per stage of RLHF. See `marlhf --help`.
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "core/check.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} Command;

static const Command commands[] = {
    {"logprobs", cmd_logprobs, "per-token log-probs and top-1 next tokens of given token ids"},
    {"sft", cmd_sft, "supervised fine-tuning on prompt/response data (step 1)"},
    {"rm", cmd_rm, "train a reward model on chosen/rejected pairs or ranked responses (step 2)"},
    {"ppo", cmd_ppo, "PPO / MA-PPO against a reward model with macro actions (step 3)"},
    {"pipeline", cmd_pipeline, "SFT -> reward model -> PPO from one JSON file, resumable at any stage"},
    {"infer", cmd_infer, "responses of a policy to validation prompts, scored by a reward model (JSONL)"},
    {"sample", cmd_sample, "the evaluation instances of a results file (stratified by subreddit for TL;DR)"},
    {"judge", cmd_judge, "pairwise LLM judge of two results files over an OpenAI-compatible API (win rate)"},
    {"human-eval", cmd_human_eval, "blind pairwise comparison of two results files by a person (web page or terminal)"},
    {"report", cmd_report, "an HTML page of one or more runs: every metric plotted, samples before/after"},
    {"generate", cmd_generate, "generate completions for prompts (arguments or JSONL), batched, with a KV cache"},
    {"chat", cmd_chat, "chat with a model interactively, replies streamed"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server for a model (chat and text completions, streaming)"},
    {"convert", cmd_convert, "convert a GGUF file or Hugging Face folder into a Hugging Face folder"},
    {"tokenize", cmd_tokenize, "text to token ids (or ids to text) with a model's tokenizer"},
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
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 2, argv + 2);
    die_user("unknown command '%s' (marlhf --help lists them)", argv[1]);
}
