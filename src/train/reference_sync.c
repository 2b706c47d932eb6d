// A reference that follows the policy (train/reference_sync.h).
#include "train/reference_sync.h"

#include <math.h>

#include "core/check.h"
#include "dist/zero.h"

int reference_sync_start(ReferenceSync *sync, Model *reference, const Model *policy, double mixup_alpha, long steps,
                         const char *reference_name, const char *policy_name) {
    if (reference->quantized || reference->lora.rank > 0)
        return err_set("--sync-ref-model mixes the policy's float weights into the reference's: not with a quantized "
                       "reference (--reference-quantize) or adapters");
    if (reference->table.total != policy->table.total || reference->table.count != policy->table.count)
        return err_set("--sync-ref-model mixes the reference's weights with the policy's, and %s is not shaped as %s",
                       reference_name, policy_name);
    *sync = (ReferenceSync){.model = reference, .mixup_alpha = mixup_alpha, .steps = steps};
    return 0;
}

bool reference_sync_after_step(ReferenceSync *sync, const Model *policy, long step) {
    if (!sync->model || step % sync->steps != 0) return false;
    // moving_average: reference = (1 - alpha) reference + alpha policy
    dist_moving_average(sync->model, policy, (float)(1.0 - sync->mixup_alpha));
    sync->updates++;
    return true;
}

void reference_sync_save_state(const ReferenceSync *sync, json_t *state) {
    if (!sync->model) return;
    json_object_set_new(state, "sync_ref_model",
                        json_pack("{s:f, s:I}", "mixup_alpha", sync->mixup_alpha, "sync_steps", (json_int_t)sync->steps));
}

int reference_sync_check_state(const ReferenceSync *sync, const json_t *state, const char *checkpoint) {
    const json_t *saved = json_object_get(state, "sync_ref_model");
    if (!sync->model && saved)
        return err_set("checkpoint was made with --sync-ref-model, this run has none (%s): another reference",
                       checkpoint);
    if (!sync->model) return 0;
    if (!saved)
        return err_set("checkpoint was made without --sync-ref-model, this run has it (%s): another reference",
                       checkpoint);
    const double alpha = json_number_value(json_object_get(saved, "mixup_alpha"));
    const long steps = (long)json_integer_value(json_object_get(saved, "sync_steps"));
    if (fabs(alpha - sync->mixup_alpha) > 1e-12 || steps != sync->steps)
        return err_set("checkpoint was made with --ref-model-mixup-alpha %g --ref-model-sync-steps %ld, this run has "
                       "%g and %ld (%s)",
                       alpha, steps, sync->mixup_alpha, sync->steps, checkpoint);
    return 0;
}
