// Every `marlhf <command>` entry point. Each returns the process exit status.
#pragma once

int cmd_logprobs(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_sft(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_dpo(int argc, char **argv);
int cmd_kto(int argc, char **argv);
int cmd_ppo(int argc, char **argv);
int cmd_pipeline(int argc, char **argv);
int cmd_infer(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_judge(int argc, char **argv);
int cmd_human_eval(int argc, char **argv);
int cmd_serve(int argc, char **argv);

// Sets the number of threads for OpenMP and OpenBLAS (0 = all cores).
void cli_set_threads(long threads);
