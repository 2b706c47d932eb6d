// Learning-rate schedules with warmup, as Hugging Face's get_*_schedule_with_warmup define
// them (so step 0 of a warmup has learning rate 0).
#pragma once

typedef enum { LR_CONSTANT, LR_LINEAR, LR_COSINE } LrScheduleKind;

typedef struct {
    LrScheduleKind kind;
    float peak_lr;
    long warmup_steps;
    long total_steps;
} LrSchedule;

// Learning rate for optimizer step `step` (0-based).
float lr_schedule_at(const LrSchedule *schedule, long step);
// Warmup steps for a warmup ratio, as transformers computes them: ceil(ratio * total).
long lr_warmup_steps_from_ratio(double ratio, long total_steps);
// "constant" | "linear" | "cosine"; returns -1 for anything else.
int lr_schedule_kind_from_name(const char *name, LrScheduleKind *kind);
