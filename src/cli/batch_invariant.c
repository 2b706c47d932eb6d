#include "cli/batch_invariant.h"

#include <string.h>

#include "core/check.h"
#include "ops/ops.h"

Option cli_batch_invariant_option(bool *on) {
    return (Option){"batch-invariant", "batch_invariant", OPT_BOOL, on,
                    "row-invariant CPU forward: each linear layer's output computed in one fixed order, so a row's "
                    "log-probs are the same bits alone or in any batch (PPO's first ratio exactly 1; slower; "
                    "MARLHF_CPU_MATMUL=batch-invariant is the same; not on cuda)",
                    false, false};
}

void cli_set_batch_invariant(const OptionSet *set, const char *device) {
    for (int i = 0; i < set->count; i++) {
        const Option *o = &set->options[i];
        if (strcmp(o->name, "batch-invariant")) continue;
        const bool on = *(const bool *)o->target;
        // The option given on the command line or in --config is a request; absent, the
        // environment decides (and a bad MARLHF_CPU_MATMUL is reported now, not at the
        // first matmul).
        if (ops_choose_batch_invariant(device, o->seen ? on : -1,
                                       on ? "option --batch-invariant" : "option --batch-invariant false") != 0)
            die_from_err();
        return;
    }
    CHECK(0, "marlhf %s has no --batch-invariant option", set->command);
}
