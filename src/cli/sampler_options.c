#include "cli/sampler_options.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

// "ID:BIAS[,ID:BIAS...]" into extras->biases.
static void parse_logit_bias(SamplerExtrasCli *extras) {
    const char *text = extras->logit_bias;
    int capacity = 1;
    for (const char *c = text; *c; c++) capacity += *c == ',';
    extras->biases = xcalloc((size_t)capacity, sizeof(SamplerLogitBias));
    for (const char *at = text;;) {
        char *end;
        const long id = strtol(at, &end, 10);
        bool ok = end != at && *end == ':' && id >= 0 && id <= 1L << 30;
        const char *bias_text = end + 1;
        const double bias = ok ? strtod(bias_text, &end) : 0;
        ok = ok && end != bias_text && (*end == ',' || *end == '\0') && bias >= -100 && bias <= 100;
        if (!ok)
            die_user("option --logit-bias must be ID:BIAS pairs separated by commas, BIAS in [-100, 100], got '%s'", text);
        extras->biases[extras->bias_count++] = (SamplerLogitBias){(int)id, (float)bias};
        if (*end == '\0') break;
        at = end + 1;
    }
}

void sampler_extras_check(SamplerExtrasCli *extras) {
    if (!(extras->min_p >= 0 && extras->min_p <= 1)) die_user("option --min-p must be in [0, 1], got %g", extras->min_p);
    if (!(extras->repetition_penalty > 0) || !isfinite(extras->repetition_penalty))
        die_user("option --repetition-penalty must be positive (1 = off), got %g", extras->repetition_penalty);
    if (!(extras->presence_penalty >= -2 && extras->presence_penalty <= 2))
        die_user("option --presence-penalty must be in [-2, 2], got %g", extras->presence_penalty);
    if (!(extras->frequency_penalty >= -2 && extras->frequency_penalty <= 2))
        die_user("option --frequency-penalty must be in [-2, 2], got %g", extras->frequency_penalty);
    if (extras->logit_bias && *extras->logit_bias && !extras->biases) parse_logit_bias(extras);
}

void sampler_extras_apply(const SamplerExtrasCli *extras, SamplerConfig *sampler, int vocab_size) {
    for (int i = 0; vocab_size > 0 && i < extras->bias_count; i++)
        if (extras->biases[i].token >= vocab_size)
            die_user("option --logit-bias: token %d is not in the model's vocabulary of %d", extras->biases[i].token,
                     vocab_size);
    sampler->min_p = (float)extras->min_p;
    sampler->repetition_penalty = (float)extras->repetition_penalty;
    sampler->presence_penalty = (float)extras->presence_penalty;
    sampler->frequency_penalty = (float)extras->frequency_penalty;
    sampler->logit_bias = extras->biases;
    sampler->logit_bias_count = extras->bias_count;
}

void sampler_extras_free(SamplerExtrasCli *extras) {
    free(extras->biases);
    extras->biases = NULL;
    extras->bias_count = 0;
}
