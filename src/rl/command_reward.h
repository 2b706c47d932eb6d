// A reward computed by a program of the user's: `marlhf ppo --reward command
// --reward-command 'python3 my_reward.py'`, the way TRL's GRPOTrainer takes Python reward
// functions and OpenRLHF a remote reward URL, but in any language and with no Python in
// marlhf. For verifiable rewards (a math answer checked against the row's solution, a
// format rule, unit tests) or any scorer that is not a reward model.
//
// The command runs once per process (`/bin/sh -c COMMAND`, the user's own program: not
// sandboxed, unlike the APPS code reward) and answers requests one at a time: marlhf
// writes one JSON line to its standard input,
//     {"prompt": "<prompt text>", "response": "<response text>", "row": {<the prompt's data row>}}
// and reads one line from its standard output: the reward, a number. The row is the
// prompts file's row as read (so it carries a reference answer or tests, in any field).
// stderr passes through. A line that is not a finite number, the program's exit, or no
// answer within the timeout is an error naming the command.
#pragma once

typedef struct CommandReward CommandReward;

// Starts the program. Returns 0, or -1 with err_set().
int command_reward_start(CommandReward **out, const char *command, double timeout_seconds);
// Its reward for one response. Returns 0, or -1 with err_set() (the program is then gone).
int command_reward_score(CommandReward *reward, const char *prompt, const char *response, const char *row_json,
                         double *score);
// Closes its standard input, waits for it to exit (at most a few seconds, then kills it).
void command_reward_stop(CommandReward *reward);
