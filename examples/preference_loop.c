// On-device preference learning with the embedding API: a policy learns from pairs of its
// own responses, judged as they come, with LoRA adapters on its frozen weights (which stay
// the DPO reference), and is saved at the end.
//
//   build/examples/preference_loop POLICY REWARD_MODEL PROMPTS.txt OUT_DIR [ROUNDS]
//
// Each round, for every prompt (one per line of PROMPTS.txt): two responses are sampled
// (all of them in one batch, marlhf_generate_batch), the reward model scores both, the better becomes "chosen" (a tie
// is skipped), and the round's pairs make one DPO step. That is online DPO with a reward
// model as the judge (TRL's OnlineDPOTrainer); on a device the judge would be the user
// picking one of two answers, and the loop is the same.
//
// Prints one line per round: the mean reward of the responses sampled in that round, and
// the step's loss and accuracy. OUT_DIR must not exist; it receives the trained model.
#include <marlhf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PROMPTS 64

static void report(const char *what) { fprintf(stderr, "preference_loop: %s: %s\n", what, marlhf_last_error()); }

// One prompt per line (at most MAX_PROMPTS); returns how many, or -1.
static int read_prompts(const char *path, char *prompts[MAX_PROMPTS]) {
    FILE *file = fopen(path, "r");
    if (!file) return -1;
    int count = 0;
    char line[4096];
    while (count < MAX_PROMPTS && fgets(line, sizeof line, file)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0]) continue;
        prompts[count] = malloc(strlen(line) + 1);
        strcpy(prompts[count++], line);
    }
    fclose(file);
    return count;
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: preference_loop POLICY REWARD_MODEL PROMPTS.txt OUT_DIR [ROUNDS]\n");
        return 2;
    }
    const int rounds = argc == 6 ? atoi(argv[5]) : 10;
    char *prompts[MAX_PROMPTS];
    const int count = read_prompts(argv[3], prompts);
    if (count <= 0) {
        fprintf(stderr, "preference_loop: no prompts in %s\n", argv[3]);
        return 2;
    }

    int status = 2;
    marlhf_model *policy = NULL, *judge = NULL;
    char *texts[MAX_PROMPTS][2] = {{NULL}};
    marlhf_model_params params = marlhf_model_default_params();
    if (!(policy = marlhf_model_load(argv[1], &params))) {
        report(argv[1]);
        goto done;
    }
    params.kind = MARLHF_REWARD_MODEL;
    if (!(judge = marlhf_model_load(argv[2], &params))) {
        report(argv[2]);
        goto done;
    }
    marlhf_trainer_params dpo = marlhf_trainer_default_params();
    dpo.lora_rank = 4;
    dpo.learning_rate = 1e-3;
    dpo.max_seq_len = 64;
    marlhf_trainer *trainer = marlhf_trainer_new(policy, &dpo); // freed with the policy
    if (!trainer) {
        report("trainer");
        goto done;
    }

    marlhf_generate_params sampling = marlhf_generate_default_params();
    sampling.max_new_tokens = 12;
    sampling.temperature = 1.0f;
    sampling.top_k = 0;
    marlhf_preference pairs[MAX_PROMPTS];
    const char *twice[2 * MAX_PROMPTS]; // each prompt twice: two samples of it in one batch
    for (int i = 0; i < count; i++) twice[2 * i] = twice[2 * i + 1] = prompts[i];
    for (int round = 0; round < rounds; round++) {
        int used = 0;
        double reward_sum = 0;
        // One batch per round; each row has its own random stream, so the two answers to a
        // prompt differ.
        sampling.seed = 1000 + (unsigned long long)round;
        if (marlhf_generate_batch(policy, twice, 2 * count, &sampling, &texts[0][0]) != 0) {
            report("generate");
            goto done;
        }
        for (int i = 0; i < count; i++) {
            float scores[2];
            for (int k = 0; k < 2; k++) {
                if (marlhf_reward(judge, prompts[i], texts[i][k], &scores[k]) != 0) {
                    report("reward");
                    goto done;
                }
                reward_sum += scores[k];
            }
            if (scores[0] == scores[1]) continue;
            const int better = scores[1] > scores[0];
            pairs[used++] = (marlhf_preference){prompts[i], texts[i][better], texts[i][1 - better]};
        }
        marlhf_dpo_stats stats = {0};
        if (used > 0 && marlhf_dpo_step(trainer, pairs, used, &stats) != 0) {
            report("dpo step");
            goto done;
        }
        printf("round %d: mean reward %.4f, pairs %d, loss %.4f, accuracy %.3f\n", round,
               reward_sum / (2.0 * count), used, stats.loss, stats.accuracy);
        fflush(stdout);
        for (int i = 0; i < count; i++) {
            marlhf_free(texts[i][0]), marlhf_free(texts[i][1]);
            texts[i][0] = texts[i][1] = NULL;
        }
    }
    if (marlhf_model_save(policy, argv[4]) != 0) {
        report("save");
        goto done;
    }
    printf("saved %s\n", argv[4]);
    status = 0;
done:
    for (int i = 0; i < count; i++) marlhf_free(texts[i][0]), marlhf_free(texts[i][1]), free(prompts[i]);
    marlhf_model_free(judge);
    marlhf_model_free(policy);
    return status;
}
