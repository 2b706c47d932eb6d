// --batch-invariant: the row-invariant CPU forward (docs/lora.md, "One policy") as an
// option of every command that runs a model, and its config-file key "batch-invariant".
// MARLHF_CPU_MATMUL=batch-invariant in the environment is equivalent; given both, they
// must agree.
#pragma once
#include <stdbool.h>

#include "cli/options.h"

// The option, bound to *on (false by default).
Option cli_batch_invariant_option(bool *on);
// Chooses the forward the command's models run (ops_choose_batch_invariant): the option of
// `set` if given, else the environment's choice. Call after options_parse and before the
// first model is loaded. Exits 2 with one line when the option and MARLHF_CPU_MATMUL
// disagree, or when the row-invariant forward is asked for on a `device` other than cpu.
void cli_set_batch_invariant(const OptionSet *set, const char *device);
