#include "cli/sampler_options.h"

#include <math.h>

#include "core/check.h"

void sampler_extras_apply(const SamplerExtrasCli *extras, SamplerConfig *sampler) {
    if (!(extras->min_p >= 0 && extras->min_p <= 1)) die_user("option --min-p must be in [0, 1], got %g", extras->min_p);
    if (!(extras->repetition_penalty > 0) || !isfinite(extras->repetition_penalty))
        die_user("option --repetition-penalty must be positive (1 = off), got %g", extras->repetition_penalty);
    if (!(extras->presence_penalty >= -2 && extras->presence_penalty <= 2))
        die_user("option --presence-penalty must be in [-2, 2], got %g", extras->presence_penalty);
    if (!(extras->frequency_penalty >= -2 && extras->frequency_penalty <= 2))
        die_user("option --frequency-penalty must be in [-2, 2], got %g", extras->frequency_penalty);
    sampler->min_p = (float)extras->min_p;
    sampler->repetition_penalty = (float)extras->repetition_penalty;
    sampler->presence_penalty = (float)extras->presence_penalty;
    sampler->frequency_penalty = (float)extras->frequency_penalty;
}
