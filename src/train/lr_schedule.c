#include "train/lr_schedule.h"

#include <math.h>
#include <string.h>

float lr_schedule_at(const LrSchedule *s, long step) {
    if (step < s->warmup_steps)
        return s->peak_lr * (float)step / (float)(s->warmup_steps > 1 ? s->warmup_steps : 1);
    if (s->kind == LR_CONSTANT) return s->peak_lr;
    long decay_steps = s->total_steps - s->warmup_steps;
    if (decay_steps <= 0) return s->kind == LR_LINEAR ? 0.0f : s->peak_lr;
    double progress = (double)(step - s->warmup_steps) / (double)decay_steps;
    if (progress > 1.0) progress = 1.0;
    if (s->kind == LR_LINEAR) return (float)(s->peak_lr * (1.0 - progress));
    return (float)(s->peak_lr * 0.5 * (1.0 + cos(M_PI * progress)));
}

long lr_warmup_steps_from_ratio(double ratio, long total_steps) {
    return (long)ceil(ratio * (double)total_steps);
}

int lr_schedule_kind_from_name(const char *name, LrScheduleKind *kind) {
    if (strcmp(name, "constant") == 0) *kind = LR_CONSTANT;
    else if (strcmp(name, "linear") == 0) *kind = LR_LINEAR;
    else if (strcmp(name, "cosine") == 0) *kind = LR_COSINE;
    else return -1;
    return 0;
}
