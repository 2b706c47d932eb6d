// MA-PPO's rewards, macro GAE and losses:
//  - the worked GAE example of spec §12.2 (token level, released n = 1 with its zero-length
//    step, n = 2 equal/position, n = 3, n = 5);
//  - 40 random cases against an independent PyTorch reference (tools/make_ppo_fixtures.py,
//    float64 autograd): rewards, advantages, returns, both losses and their gradients,
//    over every value function, macro reward mean/sum and ratio per-token/macro, with
//    clipping active. Tolerance 1e-5 absolute + 1e-4 relative (float32 arithmetic here).
//  - with one-token macro actions, macro GAE equals token-level GAE exactly.
//  - TRL's GRPO loss forms (grpo, cispo, sapo; per-token and sequence-level ratio) and its
//    batch scaling against tools/make_grpo_loss_fixtures.py.
#include <string.h>
#include <jansson.h>

#include "core/check.h"
#include "rl/advantage.h"
#include "rl/ppo_loss.h"
#include "test.h"

static const AdvantageConfig spec_config = {.kl_coef = 0, .reward_clip = 2.5f, .gamma = 1.0f, .lambda = 0.95f,
                                            .value_function = VALUE_EQUAL, .macro_reward = MACRO_REWARD_MEAN};

static void check_gae(const char *what, const AdvantageConfig *config, const int *segments, int count,
                      const float *expected_advantages) {
    float values[4] = {0.5f, 0.4f, 0.3f, 0.2f}, rewards[4] = {0, 0, 0, 1.0f}, advantages[4], returns[4];
    macro_advantages(config, values, rewards, 4, segments, count, advantages, returns);
    for (int j = 0; j < 4; j++) EXPECT_CLOSE(advantages[j], expected_advantages[j], 1e-5, 0, what);
}

static void test_spec_gae_example(void) {
    int token[4] = {1, 1, 1, 1};
    check_gae("token-level", &spec_config, token, 4, (float[]){0.40065f, 0.527f, 0.66f, 0.8f});
    int released_n1[5] = {1, 1, 1, 0, 1};
    check_gae("released n=1", &spec_config, released_n1, 5, (float[]){0.35733f, 0.4814f, 0.612f, 0.8f});
    int n2[3] = {2, 1, 1};
    check_gae("n=2 equal", &spec_config, n2, 3, (float[]){0.477f, 0.477f, 0.66f, 0.8f});
    AdvantageConfig position = spec_config;
    position.value_function = VALUE_POSITION;
    check_gae("n=2 position", &position, n2, 3, (float[]){0.46033f, 0.46033f, 0.66f, 0.8f});
    int n3[3] = {3, 0, 1};
    check_gae("n=3 released", &spec_config, n3, 3, (float[]){0.512f, 0.512f, 0.512f, 0.8f});
    int n5[2] = {3, 1};
    check_gae("n=5", &spec_config, n5, 2, (float[]){0.56f, 0.56f, 0.56f, 0.8f});
    // Macro returns of the n = 2 case: 0.927, 0.96, 1.0.
    float values[4] = {0.5f, 0.4f, 0.3f, 0.2f}, rewards[4] = {0, 0, 0, 1.0f}, advantages[4], returns[4];
    macro_advantages(&spec_config, values, rewards, 4, n2, 3, advantages, returns);
    EXPECT_CLOSE(returns[0], 0.927, 1e-5, 0, "macro return 0");
    EXPECT_CLOSE(returns[2], 0.96, 1e-5, 0, "macro return 1");
    EXPECT_CLOSE(returns[3], 1.0, 1e-5, 0, "macro return 2");
}

static int floats(json_t *array, float *out) {
    for (size_t i = 0; i < json_array_size(array); i++) out[i] = (float)json_number_value(json_array_get(array, i));
    return (int)json_array_size(array);
}

static void test_against_reference(void) {
    json_error_t error;
    json_t *cases = json_load_file("tests/fixtures/ppo/cases.json", 0, &error);
    CHECK(cases, "cases.json: %s", error.text);
    size_t index;
    json_t *c;
    json_array_foreach(cases, index, c) {
        json_t *cfg = json_object_get(c, "config"), *expected = json_object_get(c, "expected");
        AdvantageConfig config = {
            .kl_coef = (float)json_number_value(json_object_get(cfg, "kl_coef")),
            .reward_clip = (float)json_number_value(json_object_get(cfg, "reward_clip")),
            .gamma = (float)json_number_value(json_object_get(cfg, "gamma")),
            .lambda = (float)json_number_value(json_object_get(cfg, "lambda")),
        };
        CHECK(value_function_from_name(json_string_value(json_object_get(cfg, "value_function")), &config.value_function) == 0, "vf");
        CHECK(macro_reward_from_name(json_string_value(json_object_get(cfg, "macro_reward")), &config.macro_reward) == 0, "mr");
        const float clip_ratio = (float)json_number_value(json_object_get(cfg, "clip_ratio"));
        PpoLossConfig loss = {.clip_ratio = clip_ratio, .clip_ratio_high = clip_ratio,
                              .value_clip = (float)json_number_value(json_object_get(cfg, "value_clip"))};
        CHECK(ratio_kind_from_name(json_string_value(json_object_get(cfg, "ratio")), &loss.ratio) == 0, "ratio");
        float logp_old[32], logp_ref[32], logp_new[32], values_old[32], values_new[32];
        int R = floats(json_object_get(c, "logp_old"), logp_old);
        floats(json_object_get(c, "logp_ref"), logp_ref);
        floats(json_object_get(c, "logp_new"), logp_new);
        floats(json_object_get(c, "values_old"), values_old);
        floats(json_object_get(c, "values_new"), values_new);
        json_t *segs = json_object_get(c, "segments");
        int segments[32], count = (int)json_array_size(segs);
        for (int s = 0; s < count; s++) segments[s] = (int)json_integer_value(json_array_get(segs, s));
        float rewards[32], advantages[32], returns[32], dlogp[32] = {0}, dvalues[32] = {0};
        token_rewards(&config, logp_old, logp_ref, (float)json_number_value(json_object_get(c, "score")), R, rewards);
        macro_advantages(&config, values_old, rewards, R, segments, count, advantages, returns);
        double policy = ppo_policy_loss(&loss, logp_new, logp_old, advantages, segments, count, R, 1.0f / R, dlogp, NULL) / R;
        double value = ppo_value_loss(&loss, values_new, values_old, returns, R, 1.0f / R, dvalues, NULL) / R;
        float want[32];
        const char *names[] = {"rewards", "advantages", "returns", "dlogp", "dvalues"};
        float *got[] = {rewards, advantages, returns, dlogp, dvalues};
        for (int k = 0; k < 5; k++) {
            floats(json_object_get(expected, names[k]), want);
            double worst = test_worst_ratio(got[k], want, R, 1e-5, 1e-4);
            EXPECT(worst <= 1.0, "case %zu %s: %.3g x tolerance", index, names[k], worst);
        }
        EXPECT_CLOSE(policy, json_number_value(json_object_get(expected, "policy_loss")), 1e-5, 1e-4, "policy loss");
        EXPECT_CLOSE(value, json_number_value(json_object_get(expected, "value_loss")), 1e-5, 1e-4, "value loss");
    }
    json_decref(cases);
}

// With one-token macro actions the macro machinery is token-level PPO, bit for bit:
// per-token and macro ratios coincide, and every weight is 1.
static void test_single_token_actions_are_token_level(void) {
    enum { R = 9 };
    float values[R], rewards[R], a1[R], r1[R], a2[R], r2[R];
    for (int j = 0; j < R; j++) values[j] = 0.1f * j - 0.3f, rewards[j] = 0.05f * (j % 3) - 0.04f;
    int ones[R];
    for (int j = 0; j < R; j++) ones[j] = 1;
    AdvantageConfig config = spec_config;
    macro_advantages(&config, values, rewards, R, ones, R, a1, r1);
    // Token-level GAE written out directly.
    float next_value = 0, next_advantage = 0;
    for (int j = R - 1; j >= 0; j--) {
        float delta = rewards[j] + config.gamma * next_value - values[j];
        a2[j] = delta + config.gamma * config.lambda * next_advantage;
        r2[j] = a2[j] + values[j];
        next_value = values[j], next_advantage = a2[j];
    }
    EXPECT(memcmp(a1, a2, sizeof a1) == 0 && memcmp(r1, r2, sizeof r1) == 0, "macro GAE with n=1 is token GAE");
    float logp_new[R], logp_old[R], d1[R] = {0}, d2[R] = {0};
    for (int j = 0; j < R; j++) logp_old[j] = -1.0f - 0.1f * j, logp_new[j] = logp_old[j] + 0.05f * (j - 4);
    PpoLossConfig per_token = {.clip_ratio = 0.2f, .clip_ratio_high = 0.2f, .value_clip = 0.2f, .ratio = RATIO_PER_TOKEN},
                  macro = per_token;
    macro.ratio = RATIO_MACRO_PRODUCT;
    double l1 = ppo_policy_loss(&per_token, logp_new, logp_old, a1, ones, R, R, 1.0f / R, d1, NULL);
    double l2 = ppo_policy_loss(&macro, logp_new, logp_old, a1, ones, R, R, 1.0f / R, d2, NULL);
    EXPECT(l1 == l2 && memcmp(d1, d2, sizeof d1) == 0, "macro ratio over one token is the token ratio");
}

// By hand: GDPO's rewards on groups of unequal sizes (a short response dropped from one, one
// left alone): each source normalised as GRPO normalises a group, a lone sample 0; and a
// source rescaled and shifted (a wider reward) changes nothing but the 1e-4 term's share.
static void test_decoupled_group_rewards(void) {
    const int count = 7, groups[7] = {0, 0, 0, 1, 2, 2, 2};
    const double first[7] = {1.0, 0.0, 0.5, 3.0, -1.0, 2.0, 2.0}, second[7] = {0.0, 1.0, 1.0, 7.0, 0.2, 0.4, 0.9};
    const double weights[2] = {1.0, 0.25};
    const double *parts[2] = {first, second};
    double got[7], alone[7], grpo_first[7], grpo_second[7];
    decoupled_group_rewards(parts, weights, 2, groups, count, got);
    rollout_group_advantages(ESTIMATOR_GRPO, GROUP_SCALE_GROUP, first, NULL, groups, count, grpo_first);
    rollout_group_advantages(ESTIMATOR_GRPO, GROUP_SCALE_GROUP, second, NULL, groups, count, grpo_second);
    for (int q = 0; q < count; q++)
        EXPECT_CLOSE(got[q], grpo_first[q] + 0.25 * grpo_second[q], 1e-15, 1e-15, "GDPO = the sum of GRPO's per source");
    EXPECT(got[3] == 0.0, "a sample alone in its group gets 0, got %g", got[3]);
    double wide[7];
    for (int q = 0; q < count; q++) wide[q] = 1000.0 * second[q] - 50.0;
    const double *rescaled[2] = {first, wide};
    decoupled_group_rewards(rescaled, weights, 2, groups, count, alone);
    for (int q = 0; q < count; q++) EXPECT_CLOSE(alone[q], got[q], 1e-3, 1e-3, "GDPO ignores a source's scale");
    // The rollout's standardisation: mean 0, unbiased standard deviation 1 (less the 1e-4).
    double standardized[7], sum = 0, squares = 0;
    batch_standardized(got, count, standardized);
    for (int q = 0; q < count; q++) sum += standardized[q];
    for (int q = 0; q < count; q++) squares += standardized[q] * standardized[q];
    EXPECT_CLOSE(sum, 0.0, 1e-12, 0, "standardised rewards sum to 0");
    EXPECT_CLOSE(sqrt(squares / (count - 1)), 1.0, 1e-3, 1e-3, "standardised rewards have std 1");
    double one = 4.0, one_out;
    batch_standardized(&one, 1, &one_out);
    EXPECT(one_out == 0.0, "one reward standardises to 0, got %g", one_out);
}

// GRPO, Dr. GRPO and RLOO advantages of groups of 1 to 16 rewards (one of them all equal) against
// TRL's formulas (tools/make_group_advantage_fixtures.py, with TRL's own nanstd, whose
// Bessel factor count / (count - 1) is computed in float32: hence 1e-7, not 1e-12).
static void test_group_advantages_against_trl(void) {
    json_error_t error;
    json_t *cases = json_load_file("tests/fixtures/ppo/group_advantages.json", 0, &error);
    CHECK(cases, "group_advantages.json: %s", error.text);
    size_t index;
    json_t *c;
    json_array_foreach(cases, index, c) {
        json_t *rewards = json_object_get(c, "rewards");
        int G = (int)json_array_size(rewards);
        double r[16], got[16];
        for (int g = 0; g < G; g++) r[g] = json_real_value(json_array_get(rewards, g));
        const char *names[3] = {"grpo", "rloo", "dr_grpo"};
        const AdvantageEstimator kinds[3] = {ESTIMATOR_GRPO, ESTIMATOR_RLOO, ESTIMATOR_DR_GRPO};
        for (int k = 0; k < 3; k++) {
            group_advantages(kinds[k], r, NULL, G, got);
            json_t *want = json_object_get(c, names[k]);
            for (int g = 0; g < G; g++) {
                char what[64];
                snprintf(what, sizeof what, "%s group %zu (G=%d) element %d", names[k], index, G, g);
                EXPECT_CLOSE(got[g], json_real_value(json_array_get(want, g)), 1e-12, 1e-7, what);
            }
        }
        // OPO (verl's): the baseline weighted by the responses' lengths.
        int lengths[16];
        for (int g = 0; g < G; g++) lengths[g] = (int)json_integer_value(json_array_get(json_object_get(c, "lengths"), g));
        group_advantages(ESTIMATOR_OPO, r, lengths, G, got);
        for (int g = 0; g < G; g++) {
            char what[96];
            snprintf(what, sizeof what, "opo group %zu (G=%d) element %d", index, G, g);
            EXPECT_CLOSE(got[g], json_real_value(json_array_get(json_object_get(c, "opo"), g)), 1e-12, 1e-9, what);
        }
    }
    json_decref(cases);
}

// DAPO's clip-higher: with eps_low 0.2 and eps_high 0.28, a ratio of 1.25 on a positive
// advantage is inside the range (gradient -A rho) where the symmetric 0.2 clips it (no
// gradient); below 1 the lower bound still clips; and the loss against central differences.
static void test_clip_higher(void) {
    const PpoLossConfig symmetric = {.clip_ratio = 0.2f, .clip_ratio_high = 0.2f, .ratio = RATIO_PER_TOKEN};
    const PpoLossConfig higher = {.clip_ratio = 0.2f, .clip_ratio_high = 0.28f, .ratio = RATIO_PER_TOKEN};
    const int one[1] = {1};
    const float old_logp[1] = {-2.0f}, advantage[1] = {1.5f};
    const float up[1] = {(float)(-2.0 + log(1.25))}, down[1] = {(float)(-2.0 + log(0.75))};
    float d_sym = 0, d_high = 0;
    double l_sym = ppo_policy_loss(&symmetric, up, old_logp, advantage, one, 1, 1, 1.0f, &d_sym, NULL);
    double l_high = ppo_policy_loss(&higher, up, old_logp, advantage, one, 1, 1, 1.0f, &d_high, NULL);
    EXPECT_CLOSE(l_sym, -1.5 * 1.2, 1e-6, 0, "symmetric: clipped at 1.2");
    EXPECT(d_sym == 0.0f, "symmetric: no gradient when clipped (%g)", d_sym);
    EXPECT_CLOSE(l_high, -1.5 * 1.25, 1e-5, 0, "clip-higher: ratio 1.25 kept");
    EXPECT_CLOSE(d_high, -1.5 * 1.25, 1e-5, 0, "clip-higher: d/dlogp = -A rho");
    // A negative advantage below 1 - eps_low is clipped either way.
    const float negative[1] = {-1.0f};
    float d = 0;
    double l = ppo_policy_loss(&higher, down, old_logp, negative, one, 1, 1, 1.0f, &d, NULL);
    EXPECT_CLOSE(l, 1.0 * 0.8, 1e-6, 0, "lower bound");
    EXPECT(d == 0.0f, "lower bound: no gradient (%g)", d);
    // Central differences over a spread of ratios and advantages.
    const float logp_old[6] = {-1.0f, -2.0f, -0.5f, -3.0f, -1.5f, -2.5f};
    const float shift[6] = {0.05f, 0.22f, -0.3f, 0.15f, -0.1f, 0.4f};
    const float adv[6] = {0.7f, 1.1f, -0.4f, -1.3f, 0.2f, 2.0f};
    const int segments[6] = {1, 1, 1, 1, 1, 1};
    float logp[6], grad[6] = {0};
    for (int t = 0; t < 6; t++) logp[t] = logp_old[t] + shift[t];
    ppo_policy_loss(&higher, logp, logp_old, adv, segments, 6, 6, 1.0f, grad, NULL);
    for (int t = 0; t < 6; t++) {
        float plus[6], minus[6];
        memcpy(plus, logp, sizeof plus), memcpy(minus, logp, sizeof minus);
        plus[t] += 1e-3f, minus[t] -= 1e-3f;
        double numeric = (ppo_policy_loss(&higher, plus, logp_old, adv, segments, 6, 6, 1.0f, NULL, NULL) -
                          ppo_policy_loss(&higher, minus, logp_old, adv, segments, 6, 6, 1.0f, NULL, NULL)) / 2e-3;
        char what[48];
        snprintf(what, sizeof what, "clip-higher d/dlogp[%d]", t);
        EXPECT_CLOSE(grad[t], numeric, 1e-3, 1e-3, what);
    }
}

// TRL's GRPO loss forms (tools/make_grpo_loss_fixtures.py, TRL 1.12's formulas in float64
// autograd): grpo (the clipped ratio with eps_high 0.28), cispo and sapo, each with the ratio
// per token and per response (GSPO's sequence level), luspo (grpo summed over the response's
// tokens) at both levels, and vespo (TRL's own get_gamma_weights), both advantage signs, 1 to
// 12 tokens; TRL 1.16's delta (the clipped loss's ratio capped: PpoLossConfig.ratio_cap) and
// top_entropy_quantile (the tokens below the entropies' quantile masked: here, as
// actor_micro_step does, their advantages zeroed after ppo_quantile's threshold). One
// response, so TRL's per-response token mean is our sum times 1/R (luspo: 1).
// A fixture case's "loss" and "grad" (one response of R tokens) against the computed ones.
static void expect_loss_and_gradient(const char *kind, size_t index, double loss, const float *grad, int R, json_t *c) {
    char what[96];
    snprintf(what, sizeof what, "%s case %zu loss", kind, index);
    EXPECT_CLOSE(loss, json_number_value(json_object_get(c, "loss")), 1e-6, 1e-5, what);
    for (int t = 0; t < R; t++) {
        snprintf(what, sizeof what, "%s case %zu d loss / d logp[%d]", kind, index, t);
        EXPECT_CLOSE(grad[t], json_number_value(json_array_get(json_object_get(c, "grad"), t)), 1e-6, 1e-4, what);
    }
}

// A rollout case's rewards and groups (at most 32); returns their count.
static int rollout_rewards_case(json_t *c, double *rewards, int *groups) {
    json_t *r = json_object_get(c, "rewards");
    const int count = (int)json_array_size(r);
    CHECK(count <= 32, "a rollout case of %d rewards", count);
    for (int q = 0; q < count; q++) {
        rewards[q] = json_number_value(json_array_get(r, q));
        groups[q] = (int)json_integer_value(json_array_get(json_object_get(c, "groups"), q));
    }
    return count;
}

// A rollout case's group advantages by `estimator` and `scale` against its "advantages" (to
// 1e-12 absolute, `relative` relative); the rewards and groups go to the caller. Returns their count.
static int expect_rollout_advantages(const char *kind, size_t index, json_t *c, AdvantageEstimator estimator,
                                     GroupScale scale, double relative, double *rewards, int *groups) {
    double got[32];
    const int count = rollout_rewards_case(c, rewards, groups);
    rollout_group_advantages(estimator, scale, rewards, NULL, groups, count, got);
    for (int q = 0; q < count; q++) {
        char what[64];
        snprintf(what, sizeof what, "%s case %zu advantage %d", kind, index, q);
        EXPECT_CLOSE(got[q], json_number_value(json_array_get(json_object_get(c, "advantages"), q)), 1e-12, relative,
                     what);
    }
    return count;
}

// A micro-batch case of responses of several lengths (KL-Cov, Clip-Cov): their log-probs and
// advantages end to end, response b from first[b] with R[b] tokens, n in all.
typedef struct {
    int B, n, first[8], R[8];
    float logp_old[64], logp_new[64], advantages[64];
} MicroBatchCase;

static void micro_batch_case(json_t *c, MicroBatchCase *m) {
    m->B = (int)json_array_size(json_object_get(c, "lengths"));
    m->n = 0;
    CHECK(m->B <= 8, "a micro-batch case of %d responses", m->B);
    for (int b = 0; b < m->B; b++) {
        m->first[b] = m->n;
        m->R[b] = floats(json_array_get(json_object_get(c, "logp_old"), b), m->logp_old + m->n);
        floats(json_array_get(json_object_get(c, "logp_new"), b), m->logp_new + m->n);
        floats(json_array_get(json_object_get(c, "advantages"), b), m->advantages + m->n);
        m->n += m->R[b];
    }
}

static void expect_micro_batch_loss_and_gradient(const char *kind, size_t index, double loss, double loss_tolerance,
                                                 const float *grad, const MicroBatchCase *m, json_t *c) {
    char what[96];
    snprintf(what, sizeof what, "%s case %zu loss", kind, index);
    EXPECT_CLOSE(loss, json_number_value(json_object_get(c, "loss")), 1e-6, loss_tolerance, what);
    for (int b = 0; b < m->B; b++) {
        float want[16];
        floats(json_array_get(json_object_get(c, "grad"), b), want);
        for (int t = 0; t < m->R[b]; t++) {
            snprintf(what, sizeof what, "%s case %zu d loss / d logp[%d][%d]", kind, index, b, t);
            EXPECT_CLOSE(grad[m->first[b] + t], want[t], 1e-6, 1e-4, what);
        }
    }
}

// One response's case: its old and new log-probs, its advantage on every token and one-token
// segments; returns its length (at most 16).
static int response_case(json_t *c, float *logp_old, float *logp_new, float *advantages, int *segments) {
    const int R = floats(json_object_get(c, "logp_old"), logp_old);
    CHECK(R <= 16, "a response case of %d tokens", R);
    floats(json_object_get(c, "logp_new"), logp_new);
    for (int t = 0; t < R; t++) advantages[t] = (float)json_number_value(json_object_get(c, "advantage")), segments[t] = 1;
    return R;
}

static void test_policy_losses_against_trl(void) {
    json_error_t error;
    json_t *root = json_load_file("tests/fixtures/ppo/grpo_losses.json", 0, &error);
    CHECK(root, "grpo_losses.json: %s", error.text);
    size_t index;
    json_t *c;
    int capped_cases = 0, capped_changes = 0, masked_cases = 0;
    json_array_foreach(json_object_get(root, "losses"), index, c) {
        PpoLossConfig config = {0};
        const char *type = json_string_value(json_object_get(c, "loss_type"));
        // TRL's grpo and luspo are the clipped loss ("ppo" here); luspo sums a response's tokens.
        bool token_sum = json_is_true(json_object_get(c, "token_sum"));
        const char *kind = !strcmp(type, "grpo") || !strcmp(type, "luspo") ? "ppo" : type;
        CHECK(policy_loss_kind_from_name(kind, &config.policy_loss) == 0, "%s", type);
        CHECK(ratio_kind_from_name(json_string_value(json_object_get(c, "level")), &config.ratio) == 0, "level");
        config.clip_ratio = (float)json_number_value(json_object_get(c, "epsilon_low"));
        config.clip_ratio_high = (float)json_number_value(json_object_get(c, "epsilon_high"));
        config.cispo_max_weight = (float)json_number_value(json_object_get(c, "cispo_max"));
        config.sapo_temperature_pos = (float)json_number_value(json_object_get(c, "tau_pos"));
        config.sapo_temperature_neg = (float)json_number_value(json_object_get(c, "tau_neg"));
        json_t *vespo = json_object_get(c, "vespo");
        config.vespo_k_pos = (float)json_number_value(json_array_get(vespo, 0));
        config.vespo_lambda_pos = (float)json_number_value(json_array_get(vespo, 1));
        config.vespo_k_neg = (float)json_number_value(json_array_get(vespo, 2));
        config.vespo_lambda_neg = (float)json_number_value(json_array_get(vespo, 3));
        float logp_old[16], logp_new[16], advantages[16], grad[16] = {0};
        int segments[16], R = response_case(c, logp_old, logp_new, advantages, segments);
        const float scale = token_sum ? 1.0f : 1.0f / R;
        char what[96];
        config.ratio_cap = (float)json_number_value(json_object_get(c, "delta"));
        const double quantile = json_number_value(json_object_get(c, "entropy_quantile"));
        if (quantile < 1) { // the 80/20 rule
            float entropies[16];
            floats(json_object_get(c, "entropies"), entropies);
            const double threshold = ppo_quantile(entropies, R, 1 - quantile);
            snprintf(what, sizeof what, "case %zu entropy threshold", index);
            EXPECT_CLOSE(threshold, json_number_value(json_object_get(c, "entropy_threshold")), 1e-6, 1e-6, what);
            for (int t = 0; t < R; t++)
                if (entropies[t] < threshold) advantages[t] = 0;
            masked_cases++;
        }
        if (config.ratio_cap > 0) { // the cap must change something among the cases
            PpoLossConfig uncapped = config;
            uncapped.ratio_cap = 0;
            capped_changes += ppo_policy_loss(&uncapped, logp_new, logp_old, advantages, segments, R, R, scale, NULL,
                                              NULL) != ppo_policy_loss(&config, logp_new, logp_old, advantages,
                                                                       segments, R, R, scale, NULL, NULL);
            capped_cases++;
        }
        double loss = ppo_policy_loss(&config, logp_new, logp_old, advantages, segments, R, R, scale, grad, NULL) * scale;
        snprintf(what, sizeof what, "case %zu (%s, %s, R=%d) loss", index, type,
                 json_string_value(json_object_get(c, "level")), R);
        EXPECT_CLOSE(loss, json_number_value(json_object_get(c, "loss")), 1e-6, 1e-5, what);
        for (int t = 0; t < R; t++) {
            snprintf(what, sizeof what, "case %zu (%s, R=%d) d loss / d logp[%d]", index, type, R, t);
            EXPECT_CLOSE(grad[t], json_number_value(json_array_get(json_object_get(c, "grad"), t)), 1e-6, 1e-4, what);
        }
    }
    EXPECT(capped_cases == 8 && masked_cases == 8 && capped_changes > 0,
           "%d delta cases (%d of them changed by it), %d entropy-masked cases (want 8, some, 8)", capped_cases,
           capped_changes, masked_cases);
    // Generation's log-probs: TRL's importance weights and off-policy mask, applied as actor_micro_step
    // applies them (each token's advantage times its weight, 0 where the mask drops it).
    int dropped = 0, zero_weights = 0, clamped_weights = 0;
    json_array_foreach(json_object_get(root, "rollout_correction"), index, c) {
        RolloutCorrection mode;
        CHECK(rollout_correction_from_name(json_string_value(json_object_get(c, "mode")), &mode) == 0, "mode");
        const float clip_min = (float)json_number_value(json_object_get(c, "clip_min"));
        const float clip_max = (float)json_number_value(json_object_get(c, "clip_max"));
        const float threshold = (float)json_number_value(json_object_get(c, "threshold"));
        float logp_old[16], logp_sampling[16], logp_new[16], weights[16], want[16], advantages[16], grad[16] = {0};
        int R = floats(json_object_get(c, "logp_old"), logp_old), segments[16];
        floats(json_object_get(c, "logp_sampling"), logp_sampling);
        floats(json_object_get(c, "logp_new"), logp_new);
        floats(json_object_get(c, "weights"), want);
        rollout_correction_weights(mode, clip_min, clip_max, logp_old, logp_sampling, R, weights);
        char what[96];
        for (int t = 0; t < R; t++) {
            snprintf(what, sizeof what, "rollout case %zu weight %d", index, t);
            EXPECT_CLOSE(weights[t], want[t], 1e-6, 1e-5, what);
            zero_weights += want[t] == 0, clamped_weights += want[t] == clip_max || want[t] == clip_min;
        }
        const bool masked = threshold >= 0 && off_policy_masked(logp_sampling, logp_new, R, threshold);
        const float advantage = (float)json_number_value(json_object_get(c, "advantage"));
        EXPECT((masked && advantage < 0) == !json_is_true(json_object_get(c, "kept")), "rollout case %zu mask", index);
        dropped += !json_is_true(json_object_get(c, "kept"));
        for (int t = 0; t < R; t++)
            advantages[t] = masked && advantage < 0 ? 0.0f : advantage * weights[t], segments[t] = 1;
        PpoLossConfig config = {.clip_ratio = (float)json_number_value(json_object_get(c, "epsilon_low")),
                                .clip_ratio_high = (float)json_number_value(json_object_get(c, "epsilon_high"))};
        double loss = ppo_policy_loss(&config, logp_new, logp_old, advantages, segments, R, R, 1.0f / R, grad, NULL) / R;
        expect_loss_and_gradient("rollout", index, loss, grad, R, c);
    }
    // TRL 1.16's default KL loss term: k3 times the policy ratio (use_bias_correction_kl), beside
    // the clipped term; and without the correction the loss is another (the cases' KL is not 0).
    int kl_cases = 0;
    json_array_foreach(json_object_get(root, "kl_bias_correction"), index, c) {
        PpoLossConfig config = {.clip_ratio = (float)json_number_value(json_object_get(c, "epsilon_low")),
                                .clip_ratio_high = (float)json_number_value(json_object_get(c, "epsilon_high")),
                                .kl_loss_coef = (float)json_number_value(json_object_get(c, "beta")),
                                .kl_loss_estimator = KL_K3, .kl_loss_bias_correction = true};
        CHECK(ratio_kind_from_name(json_string_value(json_object_get(c, "level")), &config.ratio) == 0, "level");
        float logp_old[16], logp_ref[16], logp_new[16], advantages[16], grad[16] = {0};
        int segments[16], R = response_case(c, logp_old, logp_new, advantages, segments);
        floats(json_object_get(c, "logp_ref"), logp_ref);
        const float scale = 1.0f / R;
        double loss = ppo_policy_loss(&config, logp_new, logp_old, advantages, segments, R, R, scale, grad, NULL) * scale;
        loss += config.kl_loss_coef * scale *
                ppo_kl_loss_ratio_weighted(&config, logp_new, logp_old, logp_ref, segments, R, R, scale, grad);
        expect_loss_and_gradient("KL bias-correction", index, loss, grad, R, c);
        const double plain = ppo_kl_loss(KL_K3, logp_new, logp_ref, R, 0, 0, NULL);
        EXPECT(fabs(plain - ppo_kl_loss_ratio_weighted(&config, logp_new, logp_old, logp_ref, segments, R, R, 0, NULL)) >
                   1e-6 * fabs(plain),
               "KL bias-correction case %zu: the ratio changes the term", index);
        kl_cases++;
    }
    EXPECT(kl_cases == 8, "%d KL bias-correction cases", kl_cases);
    // TRL 1.16's VESPO with the rollout correction: the weights' clamped logs join the
    // response's log-ratio in its gamma weight, and the per-token terms are not weighted again.
    int vespo_cases = 0, crushed = 0;
    json_array_foreach(json_object_get(root, "vespo_correction"), index, c) {
        PpoLossConfig config = {.policy_loss = POLICY_LOSS_VESPO, .vespo_k_pos = 2.0f, .vespo_lambda_pos = 3.0f,
                                .vespo_k_neg = 3.0f, .vespo_lambda_neg = 2.0f};
        CHECK(rollout_correction_from_name(json_string_value(json_object_get(c, "mode")), &config.rollout_correction) == 0,
              "mode");
        float logp_old[16], logp_sampling[16], logp_new[16], weights[16], advantages[16], grad[16] = {0};
        int segments[16], R = response_case(c, logp_old, logp_new, advantages, segments);
        floats(json_object_get(c, "logp_sampling"), logp_sampling);
        rollout_correction_weights(config.rollout_correction, (float)json_number_value(json_object_get(c, "clip_min")),
                                   (float)json_number_value(json_object_get(c, "clip_max")), logp_old, logp_sampling, R,
                                   weights);
        const double log_weight = rollout_correction_log_weight(config.rollout_correction, weights, R);
        const double loss =
            ppo_vespo_loss(&config, logp_new, logp_old, advantages, log_weight, R, 1.0f / R, grad, NULL) / R;
        expect_loss_and_gradient("VESPO with the rollout correction", index, loss, grad, R, c);
        crushed += json_number_value(json_object_get(c, "phi")) < 1e-10;
        vespo_cases++;
    }
    EXPECT(vespo_cases == 16 && crushed > 0, "%d VESPO cases with the rollout correction, %d with a masked token",
           vespo_cases, crushed);
    // GSPO-token (TRL's "sequence_token" level before 1.12, written out in the fixture tool): the
    // response's ratio in value, each token's own gradient, a different advantage on each token;
    // with its KL term times that ratio in half the cases. Its gradient is not GSPO's.
    int gspo_token_cases = 0, unlike_gspo = 0;
    json_array_foreach(json_object_get(root, "gspo_token"), index, c) {
        PpoLossConfig config = {.ratio = RATIO_SEQUENCE_TOKEN,
                                .clip_ratio = (float)json_number_value(json_object_get(c, "epsilon_low")),
                                .clip_ratio_high = (float)json_number_value(json_object_get(c, "epsilon_high")),
                                .cispo_max_weight = (float)json_number_value(json_object_get(c, "cispo_max")),
                                .sapo_temperature_pos = (float)json_number_value(json_object_get(c, "tau_pos")),
                                .sapo_temperature_neg = (float)json_number_value(json_object_get(c, "tau_neg")),
                                .kl_loss_coef = (float)json_number_value(json_object_get(c, "beta")),
                                .kl_loss_estimator = KL_K3, .kl_loss_bias_correction = true};
        const char *type = json_string_value(json_object_get(c, "loss_type"));
        CHECK(policy_loss_kind_from_name(!strcmp(type, "grpo") ? "ppo" : type, &config.policy_loss) == 0, "%s", type);
        float logp_old[16], logp_ref[16], logp_new[16], advantages[16], grad[16] = {0}, grad_gspo[16] = {0};
        int segments[16], R = floats(json_object_get(c, "logp_old"), logp_old);
        CHECK(R <= 16, "a GSPO-token case of %d tokens", R);
        floats(json_object_get(c, "logp_ref"), logp_ref);
        floats(json_object_get(c, "logp_new"), logp_new);
        floats(json_object_get(c, "advantages"), advantages);
        for (int t = 0; t < R; t++) segments[t] = 1;
        const float scale = 1.0f / R;
        double loss = ppo_policy_loss(&config, logp_new, logp_old, advantages, segments, R, R, scale, grad, NULL) * scale;
        PpoLossConfig gspo = config;
        gspo.ratio = RATIO_SEQUENCE_MEAN;
        ppo_policy_loss(&gspo, logp_new, logp_old, advantages, segments, R, R, scale, grad_gspo, NULL);
        if (config.kl_loss_coef > 0) {
            loss += config.kl_loss_coef * scale *
                    ppo_kl_loss_ratio_weighted(&config, logp_new, logp_old, logp_ref, segments, R, R, scale, grad);
            ppo_kl_loss_ratio_weighted(&gspo, logp_new, logp_old, logp_ref, segments, R, R, scale, grad_gspo);
        }
        expect_loss_and_gradient("GSPO-token", index, loss, grad, R, c);
        bool differs = false;
        for (int t = 0; t < R; t++) differs |= fabsf(grad[t] - grad_gspo[t]) > 1e-4f;
        unlike_gspo += differs;
        gspo_token_cases++;
    }
    EXPECT(gspo_token_cases == 24 && unlike_gspo >= 12, "%d GSPO-token cases, %d of them with GSPO's gradient unlike",
           gspo_token_cases, unlike_gspo);
    // TRL 1.16's experimental GMPO: the response's loss with every token carrying it, so that
    // the token mean (scale 1/R) is the response's term; some cases clip some tokens.
    int gmpo_cases = 0, gmpo_clipped = 0;
    json_array_foreach(json_object_get(root, "gmpo"), index, c) {
        PpoLossConfig config = {.policy_loss = POLICY_LOSS_GMPO,
                                .clip_ratio = (float)json_number_value(json_object_get(c, "epsilon_low")),
                                .clip_ratio_high = (float)json_number_value(json_object_get(c, "epsilon_high"))};
        float logp_old[16], logp_new[16], advantages[16], grad[16] = {0};
        int segments[16], R = response_case(c, logp_old, logp_new, advantages, segments);
        PpoLossStats stats = {0};
        const double loss =
            ppo_policy_loss(&config, logp_new, logp_old, advantages, segments, R, R, 1.0f / R, grad, &stats) / R;
        expect_loss_and_gradient("GMPO", index, loss, grad, R, c);
        gmpo_clipped += stats.clipped > 0;
        gmpo_cases++;
    }
    EXPECT(gmpo_cases == 12 && gmpo_clipped > 0, "%d GMPO cases, %d with clipped tokens", gmpo_cases, gmpo_clipped);
    // ... and with TRL's entropy mask: the threshold as actor_micro_step takes it (ppo_quantile
    // of the response's entropies), the tokens below it out of the geometric mean.
    int gmpo_entropy_cases = 0;
    json_array_foreach(json_object_get(root, "gmpo_entropy"), index, c) {
        PpoLossConfig config = {.policy_loss = POLICY_LOSS_GMPO,
                                .clip_ratio = (float)json_number_value(json_object_get(c, "epsilon_low")),
                                .clip_ratio_high = (float)json_number_value(json_object_get(c, "epsilon_high"))};
        float logp_old[16], logp_new[16], advantages[16], entropies[16], kept_want[16], grad[16] = {0};
        int segments[16], R = response_case(c, logp_old, logp_new, advantages, segments);
        floats(json_object_get(c, "entropies"), entropies);
        floats(json_object_get(c, "kept"), kept_want);
        const double threshold =
            ppo_quantile(entropies, R, 1.0 - json_number_value(json_object_get(c, "entropy_quantile")));
        EXPECT_CLOSE(threshold, json_number_value(json_object_get(c, "entropy_threshold")), 1e-6, 1e-6,
                     "GMPO entropy threshold");
        unsigned char kept[16];
        int kept_count = 0;
        for (int t = 0; t < R; t++) {
            kept[t] = entropies[t] >= threshold;
            kept_count += kept[t];
            EXPECT(kept[t] == (kept_want[t] != 0), "GMPO entropy case %zu token %d kept", index, t);
        }
        const double loss = ppo_gmpo_loss(&config, logp_new, logp_old, advantages, kept, R, 1.0f / R, grad, NULL) / R;
        expect_loss_and_gradient("GMPO with the entropy mask", index, loss, grad, R, c);
        EXPECT(kept_count < R, "GMPO entropy case %zu leaves some token out", index);
        gmpo_entropy_cases++;
    }
    EXPECT(gmpo_entropy_cases == 6, "%d GMPO cases with the entropy mask", gmpo_entropy_cases);
    // verl's KL-Cov over a micro-batch of responses: the same tokens penalised, and the
    // token-mean loss (the unclipped term plus the penalty) and its gradient.
    int kl_cov_cases = 0;
    json_array_foreach(json_object_get(root, "kl_cov"), index, c) {
        PpoLossConfig config = {.policy_loss = POLICY_LOSS_KL_COV,
                                .kl_cov_ratio = (float)json_number_value(json_object_get(c, "kl_cov_ratio")),
                                .kl_cov_coef = (float)json_number_value(json_object_get(c, "ppo_kl_coef"))};
        MicroBatchCase m;
        micro_batch_case(c, &m);
        float grad[64] = {0};
        int segments[64];
        for (int t = 0; t < m.n; t++) segments[t] = 1;
        unsigned char selected[64];
        kl_cov_tokens(m.advantages, m.logp_new, m.n, config.kl_cov_ratio, selected);
        double loss = 0;
        const float scale = 1.0f / m.n; // token-mean over the micro-batch
        for (int b = 0; b < m.B; b++) {
            const int first = m.first[b], R = m.R[b];
            float want[16];
            floats(json_array_get(json_object_get(c, "selected"), b), want);
            for (int t = 0; t < R; t++)
                EXPECT(selected[first + t] == (want[t] != 0), "KL-Cov case %zu response %d token %d selected", index, b,
                       t);
            loss += scale * ppo_policy_loss(&config, m.logp_new + first, m.logp_old + first, m.advantages + first,
                                            segments, R, R, scale, grad + first, NULL);
            loss += scale * config.kl_cov_coef *
                    ppo_kl_cov_term(m.logp_new + first, m.logp_old + first, selected + first, R, config.kl_cov_coef,
                                    scale, grad + first);
        }
        expect_micro_batch_loss_and_gradient("KL-Cov", index, loss, 1e-5, grad, &m, c);
        kl_cov_cases++;
    }
    EXPECT(kl_cov_cases == 3, "%d KL-Cov cases", kl_cov_cases);
    // verl's Clip-Cov over a micro-batch: the same candidates (covariance within the bounds,
    // PPO's clip not binding), the same draw from the same keys, and the token-mean loss with the
    // drawn tokens' terms left out (a zero advantage, as actor_micro_step does) and its gradient.
    int clip_cov_cases = 0, partial_draws = 0;
    json_array_foreach(json_object_get(root, "clip_cov"), index, c) {
        PpoLossConfig config = {.policy_loss = POLICY_LOSS_CLIP_COV,
                                .clip_ratio = (float)json_number_value(json_object_get(c, "epsilon_low")),
                                .clip_ratio_high = (float)json_number_value(json_object_get(c, "epsilon_high"))};
        const double ratio = json_number_value(json_object_get(c, "clip_cov_ratio"));
        MicroBatchCase m;
        micro_batch_case(c, &m);
        float grad[64] = {0};
        double keys[64];
        int segments[64];
        for (int b = 0; b < m.B; b++) {
            json_t *row_keys = json_array_get(json_object_get(c, "keys"), b);
            for (int t = 0; t < m.R[b]; t++) keys[m.first[b] + t] = json_number_value(json_array_get(row_keys, t));
        }
        unsigned char unclipped[64], selected[64];
        for (int t = 0; t < m.n; t++) {
            segments[t] = 1;
            unclipped[t] = !ppo_clip_binds(m.advantages[t], (double)m.logp_new[t] - m.logp_old[t], config.clip_ratio,
                                           config.clip_ratio_high);
        }
        const long drawn = clip_cov_tokens(m.advantages, m.logp_new, unclipped, keys, m.n, ratio,
                                           json_number_value(json_object_get(c, "lower")),
                                           json_number_value(json_object_get(c, "upper")), selected);
        long candidates = 0;
        double loss = 0;
        const float scale = 1.0f / m.n; // token-mean over the micro-batch
        for (int b = 0; b < m.B; b++) {
            const int first = m.first[b], R = m.R[b];
            float want_selected[16], want_candidate[16], kept[16];
            floats(json_array_get(json_object_get(c, "selected"), b), want_selected);
            floats(json_array_get(json_object_get(c, "candidates"), b), want_candidate);
            for (int t = 0; t < R; t++) {
                EXPECT(selected[first + t] == (want_selected[t] != 0), "Clip-Cov case %zu response %d token %d drawn",
                       index, b, t);
                candidates += want_candidate[t] != 0;
                EXPECT(!selected[first + t] || want_candidate[t] != 0,
                       "Clip-Cov case %zu response %d token %d drawn but not a candidate", index, b, t);
                kept[t] = selected[first + t] ? 0.0f : m.advantages[first + t];
            }
            loss += scale * ppo_policy_loss(&config, m.logp_new + first, m.logp_old + first, kept, segments, R, R, scale,
                                            grad + first, NULL);
        }
        long want_drawn = (long)(m.n * ratio);
        if (want_drawn < 1) want_drawn = 1;
        if (want_drawn > candidates) want_drawn = candidates;
        EXPECT(drawn == want_drawn, "Clip-Cov case %zu: %ld drawn, want %ld", index, drawn, want_drawn);
        partial_draws += drawn >= 2 && drawn < candidates;
        expect_micro_batch_loss_and_gradient("Clip-Cov", index, loss, 1e-4, grad, &m, c);
        clip_cov_cases++;
    }
    // verl's GPG: the rollout's advantages alpha (r - group mean), and the -A logp loss (token
    // mean over a response) with its gradient -A / R whatever the ratio.
    int gpg_cases = 0;
    json_array_foreach(json_object_get(root, "gpg"), index, c) {
        double rewards[32];
        int groups[32];
        expect_rollout_advantages("GPG", index, c, ESTIMATOR_GPG, GROUP_SCALE_GROUP, 1e-12, rewards, groups);
        PpoLossConfig config = {.policy_loss = POLICY_LOSS_GPG, .clip_ratio = 0.2f, .clip_ratio_high = 0.2f};
        float logp_old[16], logp_new[16], advantages[16], grad[16] = {0};
        int segments[16], R = response_case(c, logp_old, logp_new, advantages, segments);
        PpoLossStats stats = {0};
        const double loss =
            ppo_policy_loss(&config, logp_new, logp_old, advantages, segments, R, R, 1.0f / R, grad, &stats) / R;
        expect_loss_and_gradient("GPG", index, loss, grad, R, c);
        EXPECT(stats.clipped == 0, "GPG clips nothing (case %zu: %g)", index, stats.clipped);
        gpg_cases++;
    }
    EXPECT(gpg_cases == 3, "%d GPG cases", gpg_cases);
    EXPECT(clip_cov_cases == 4 && partial_draws > 0, "%d Clip-Cov cases, %d drawing some of several candidates",
           clip_cov_cases, partial_draws);
    EXPECT(dropped > 0 && zero_weights > 0 && clamped_weights > 0,
           "the cases drop %d responses, zero %d weights, clamp %d (each must be some)", dropped, zero_weights,
           clamped_weights);
    // scale_rewards="batch": r - group mean over the rollout's standard deviation.
    json_array_foreach(json_object_get(root, "batch_scaling"), index, c) {
        double rewards[32];
        int groups[32];
        // 1e-7 relative: TRL's nanstd takes Bessel's count / (count - 1) in float32.
        const int count =
            expect_rollout_advantages("batch scaling", index, c, ESTIMATOR_GRPO, GROUP_SCALE_BATCH, 1e-7, rewards, groups);
        // "none" is Dr. GRPO's r - mean; "group" is group_advantages group by group.
        double none[32], dr[32], grouped[32], per_group[32];
        rollout_group_advantages(ESTIMATOR_GRPO, GROUP_SCALE_NONE, rewards, NULL, groups, count, none);
        rollout_group_advantages(ESTIMATOR_DR_GRPO, GROUP_SCALE_GROUP, rewards, NULL, groups, count, dr);
        rollout_group_advantages(ESTIMATOR_GRPO, GROUP_SCALE_GROUP, rewards, NULL, groups, count, grouped);
        for (int first = 0; first < count;) {
            int last = first;
            while (last < count && groups[last] == groups[first]) last++;
            group_advantages(ESTIMATOR_GRPO, rewards + first, NULL, last - first, per_group + first);
            first = last;
        }
        for (int q = 0; q < count; q++) {
            EXPECT(none[q] == dr[q], "scale none = dr-grpo at %d", q);
            EXPECT(grouped[q] == per_group[q], "scale group = per-group GRPO at %d", q);
        }
    }
    // GDPO (TRL's multi_objective_aggregation="normalize_then_sum"): each source normalised
    // within its group, the weighted sum, then standardised over the batch.
    int gdpo_cases = 0;
    json_array_foreach(json_object_get(root, "gdpo"), index, c) {
        double parts[3][32], weights[3], rewards[32], advantages[32];
        const double *per_source[3];
        int groups[32];
        json_t *sources = json_object_get(c, "parts");
        const int source_count = (int)json_array_size(sources);
        const int count = (int)json_array_size(json_array_get(sources, 0));
        CHECK(source_count <= 3 && count <= 32, "GDPO case %zu is larger than the test's arrays", index);
        for (int k = 0; k < source_count; k++) {
            for (int q = 0; q < count; q++) parts[k][q] = json_number_value(json_array_get(json_array_get(sources, k), q));
            weights[k] = json_number_value(json_array_get(json_object_get(c, "weights"), k));
            per_source[k] = parts[k];
        }
        for (int q = 0; q < count; q++) groups[q] = (int)json_integer_value(json_array_get(json_object_get(c, "groups"), q));
        decoupled_group_rewards(per_source, weights, source_count, groups, count, rewards);
        batch_standardized(rewards, count, advantages);
        for (int q = 0; q < count; q++) {
            char what[64];
            snprintf(what, sizeof what, "GDPO case %zu reward %d", index, q);
            EXPECT_CLOSE(rewards[q], json_number_value(json_array_get(json_object_get(c, "rewards"), q)), 1e-12, 1e-7, what);
            snprintf(what, sizeof what, "GDPO case %zu advantage %d", index, q);
            EXPECT_CLOSE(advantages[q], json_number_value(json_array_get(json_object_get(c, "advantages"), q)), 1e-12,
                         1e-7, what);
        }
        gdpo_cases++;
    }
    EXPECT(gdpo_cases == 4, "%d GDPO cases", gdpo_cases);
    json_decref(root);
}

// By hand: CISPO keeps the gradient of a token whose ratio is above its cap (PPO's clip
// drops it), with the weight capped; GSPO's ratio is the geometric mean, so opposite moves
// of two tokens cancel and the gradient is -A / R per token; SAPO at ratio 1 is PPO.
static void test_policy_loss_forms_by_hand(void) {
    const int segments[2] = {1, 1};
    const float old2[2] = {-1.0f, -2.0f}, adv2[2] = {2.0f, 2.0f};
    const float up2[2] = {(float)(-1.0 + log(1.5)), -2.0f};
    PpoLossConfig cispo = {.clip_ratio = 0.2f, .clip_ratio_high = 0.2f, .policy_loss = POLICY_LOSS_CISPO,
                           .cispo_max_weight = 1.25f};
    PpoLossConfig ppo = {.clip_ratio = 0.2f, .clip_ratio_high = 0.2f};
    float d_cispo[2] = {0}, d_ppo[2] = {0};
    PpoLossStats stats = {0};
    double l = ppo_policy_loss(&cispo, up2, old2, adv2, segments, 2, 2, 1.0f, d_cispo, &stats);
    ppo_policy_loss(&ppo, up2, old2, adv2, segments, 2, 2, 1.0f, d_ppo, NULL);
    EXPECT_CLOSE(d_cispo[0], -1.25 * 2.0, 1e-6, 0, "cispo: capped weight, gradient kept");
    EXPECT(d_ppo[0] == 0.0f, "ppo: no gradient above the clip (%g)", d_ppo[0]);
    EXPECT_CLOSE(d_cispo[1], -1.0 * 2.0, 1e-6, 0, "cispo: ratio 1 weight 1");
    EXPECT_CLOSE(l, -1.25 * 2.0 * up2[0] - 1.0 * 2.0 * old2[1], 1e-5, 1e-6, "cispo loss -w A logp");
    EXPECT(stats.clipped == 1, "cispo: one token over the cap (%g)", stats.clipped);
    PpoLossConfig gspo = {.clip_ratio = 0.2f, .clip_ratio_high = 0.2f, .ratio = RATIO_SEQUENCE_MEAN};
    const float opposite[2] = {-1.0f + 0.1f, -2.0f - 0.1f};
    float d_gspo[2] = {0};
    l = ppo_policy_loss(&gspo, opposite, old2, adv2, segments, 2, 2, 1.0f, d_gspo, NULL);
    EXPECT_CLOSE(l, -2.0 * 2, 1e-6, 0, "gspo: geometric mean ratio 1");
    EXPECT_CLOSE(d_gspo[0], -2.0, 1e-6, 0, "gspo: sum of -A rho over 2 tokens, times 1/2");
    EXPECT_CLOSE(d_gspo[1], -2.0, 1e-6, 0, "gspo: the same for the other token");
    PpoLossConfig sapo = {.clip_ratio = 0.2f, .clip_ratio_high = 0.2f, .policy_loss = POLICY_LOSS_SAPO,
                          .sapo_temperature_pos = 1.0f, .sapo_temperature_neg = 1.05f};
    float d_sapo[2] = {0}, d_plain[2] = {0};
    ppo_policy_loss(&sapo, old2, old2, adv2, segments, 2, 2, 1.0f, d_sapo, NULL);
    ppo_policy_loss(&ppo, old2, old2, adv2, segments, 2, 2, 1.0f, d_plain, NULL);
    for (int t = 0; t < 2; t++) EXPECT_CLOSE(d_sapo[t], d_plain[t], 1e-6, 0, "sapo at ratio 1 = ppo");
    // GSPO and SAPO losses against central differences (CISPO's stop-gradient has none).
    const float logp_old[5] = {-1.0f, -2.0f, -0.5f, -3.0f, -1.5f}, shift[5] = {0.05f, 0.12f, -0.3f, 0.15f, -0.1f};
    const float adv[5] = {0.7f, 0.7f, 0.7f, 0.7f, 0.7f};
    const int ones[5] = {1, 1, 1, 1, 1};
    const PpoLossConfig *configs[2] = {&gspo, &sapo};
    for (int k = 0; k < 2; k++) {
        float logp[5], grad[5] = {0};
        for (int t = 0; t < 5; t++) logp[t] = logp_old[t] + shift[t];
        ppo_policy_loss(configs[k], logp, logp_old, adv, ones, 5, 5, 1.0f, grad, NULL);
        for (int t = 0; t < 5; t++) {
            float plus[5], minus[5];
            memcpy(plus, logp, sizeof plus), memcpy(minus, logp, sizeof minus);
            plus[t] += 1e-3f, minus[t] -= 1e-3f;
            double numeric = (ppo_policy_loss(configs[k], plus, logp_old, adv, ones, 5, 5, 1.0f, NULL, NULL) -
                              ppo_policy_loss(configs[k], minus, logp_old, adv, ones, 5, 5, 1.0f, NULL, NULL)) / 2e-3;
            char what[48];
            snprintf(what, sizeof what, "%s d/dlogp[%d]", k == 0 ? "gspo" : "sapo", t);
            EXPECT_CLOSE(grad[t], numeric, 1e-3, 1e-3, what);
        }
    }
    // GSPO-token with one advantage on every token trains as GSPO: the same loss and gradient.
    for (int k = 0; k < 2; k++) {
        PpoLossConfig token_level = *configs[k], sequence = *configs[k];
        token_level.ratio = RATIO_SEQUENCE_TOKEN, sequence.ratio = RATIO_SEQUENCE_MEAN;
        float logp[5], grad_token[5] = {0}, grad_sequence[5] = {0};
        for (int t = 0; t < 5; t++) logp[t] = logp_old[t] + shift[t];
        const double loss_token = ppo_policy_loss(&token_level, logp, logp_old, adv, ones, 5, 5, 1.0f, grad_token, NULL);
        const double loss_sequence =
            ppo_policy_loss(&sequence, logp, logp_old, adv, ones, 5, 5, 1.0f, grad_sequence, NULL);
        EXPECT_CLOSE(loss_token, loss_sequence, 1e-9, 1e-9, "GSPO-token's loss is GSPO's");
        for (int t = 0; t < 5; t++) EXPECT_CLOSE(grad_token[t], grad_sequence[t], 1e-6, 1e-6, "GSPO-token's gradient is GSPO's");
    }
    PolicyLossKind kind;
    RatioKind ratio;
    EXPECT(policy_loss_kind_from_name("grpo", &kind) != 0, "unknown policy loss refused");
    EXPECT(ratio_kind_from_name("gspo", &ratio) == 0 && ratio == RATIO_SEQUENCE_MEAN, "gspo names the sequence ratio");
    EXPECT(ratio_kind_from_name("sequence_token", &ratio) == 0 && ratio == RATIO_SEQUENCE_TOKEN,
           "TRL's sequence_token names GSPO-token");
}

// DAPO's overlong punishment: free up to max - buffer, then linear down to -factor.
static void test_overlong_penalty(void) {
    EXPECT(overlong_penalty(100, 128, 0, 1.0f) == 0.0f, "off without a buffer");
    EXPECT(overlong_penalty(96, 128, 32, 1.0f) == 0.0f, "free at max - buffer");
    EXPECT_CLOSE(overlong_penalty(97, 128, 32, 1.0f), -1.0 / 32, 1e-7, 0, "one token in");
    EXPECT_CLOSE(overlong_penalty(112, 128, 32, 0.5f), -0.25, 1e-7, 0, "halfway, factor 0.5");
    EXPECT_CLOSE(overlong_penalty(128, 128, 32, 1.0f), -1.0, 1e-7, 0, "at the limit");
    EXPECT(overlong_penalty(3, 128, 32, 1.0f) == 0.0f, "short");
}

// REINFORCE++'s returns-to-go: by hand for gamma 1 and 0.5, and an empty response.
static void test_returns_to_go(void) {
    const float rewards[4] = {0.5f, -1.0f, 0.25f, 2.0f};
    float out[4];
    returns_to_go(rewards, 4, 1.0f, out);
    const float want1[4] = {1.75f, 1.25f, 2.25f, 2.0f};
    for (int j = 0; j < 4; j++) EXPECT_CLOSE(out[j], want1[j], 1e-7, 0, "returns-to-go, gamma 1");
    returns_to_go(rewards, 4, 0.5f, out);
    const float want_half[4] = {0.5f + 0.5f * -1.0f + 0.25f * 0.25f + 0.125f * 2.0f, -1.0f + 0.5f * 0.25f + 0.25f * 2.0f,
                                0.25f + 0.5f * 2.0f, 2.0f};
    for (int j = 0; j < 4; j++) EXPECT_CLOSE(out[j], want_half[j], 1e-7, 0, "returns-to-go, gamma 0.5");
    returns_to_go(rewards, 0, 1.0f, out); // nothing to do, nothing written
    AdvantageEstimator e;
    EXPECT(advantage_estimator_from_name("reinforce_plus_plus_baseline", &e) == 0 && e == ESTIMATOR_REINFORCE_PP_BASELINE,
           "verl's name for REINFORCE++-baseline");
    EXPECT(!strcmp(advantage_estimator_name(ESTIMATOR_REINFORCE_PP), "reinforce++"), "canonical name");
}

// The KL estimators (rl/kl_estimator.h) of the loss term and the reward penalty: each zero
// where the policy is the reference (with a zero gradient but k1's), its value by hand as TRL and
// OpenRLHF write it, and its gradient against central differences.
static void test_kl_estimators(void) {
    const float ref[3] = {-1.0f, -2.5f, -0.25f}, same[3] = {-1.0f, -2.5f, -0.25f};
    const float moved[3] = {-0.5f, -3.0f, -0.25f}; // x = logp - ref: 0.5, -0.5, 0
    // TRL: logr = ref - logp; k3 = (exp(logr) - 1) - logr. OpenRLHF: k2 = (logp - ref)^2 / 2.
    const double k3 = ((exp(-0.5) - 1) + 0.5) + ((exp(0.5) - 1) - 0.5);
    const double want[4] = {0.5 - 0.5 + 0, 2 * 0.5 * 0.25, k3, 0.5 + 0.5}; // k1, k2, k3, abs
    for (int e = KL_K1; e <= KL_ABS; e++) {
        KlEstimator estimator;
        EXPECT(kl_estimator_from_name(kl_estimator_name((KlEstimator)e), &estimator) == 0 && (int)estimator == e,
               "name %s", kl_estimator_name((KlEstimator)e));
        float dlogp[3] = {0};
        const char *name = kl_estimator_name(estimator);
        EXPECT_CLOSE(ppo_kl_loss(estimator, same, ref, 3, 0.1f, 1.0f, dlogp), 0.0, 1e-15, 0, name);
        // (k1's gradient is 1 everywhere: its mean over samples, not each sample's, is the KL's)
        const float at_reference = estimator == KL_K1 ? 0.1f : 0.0f;
        EXPECT(dlogp[0] == at_reference && dlogp[1] == at_reference && dlogp[2] == at_reference,
               "%s: gradient at the reference %g", name, dlogp[0]);
        float grad[3] = {0};
        EXPECT_CLOSE(ppo_kl_loss(estimator, moved, ref, 3, 0.2f, 0.5f, grad), want[e], 1e-7, 1e-6, name);
        for (int t = 0; t < 3; t++) {
            float up[3], down[3];
            memcpy(up, moved, sizeof up), memcpy(down, moved, sizeof down);
            up[t] += 1e-3f, down[t] -= 1e-3f;
            double numeric = 0.2 * 0.5 *
                             (ppo_kl_loss(estimator, up, ref, 3, 0, 0, NULL) - ppo_kl_loss(estimator, down, ref, 3, 0, 0, NULL)) /
                             ((double)up[t] - down[t]);
            EXPECT_CLOSE(grad[t], numeric, 1e-5, 1e-3, name);
        }
        // The reward penalty: -beta times the same estimate on every token, the score on the last.
        AdvantageConfig config = {.kl_coef = 0.1f, .kl_estimator = estimator};
        float rewards[3];
        token_rewards(&config, moved, ref, 1.5f, 3, rewards);
        double sum = 0;
        for (int t = 0; t < 3; t++) sum += rewards[t];
        EXPECT_CLOSE(sum, -0.1 * want[e] + 1.5, 1e-6, 1e-6, name);
    }
    // k1's penalty is the float log-ratio times -beta, as before estimators: the same bits.
    AdvantageConfig k1 = {.kl_coef = 0.05f};
    const float logp[2] = {-0.123456f, -7.654321f}, logp_ref[2] = {-3.3e-8f, -0.5f};
    float rewards[2];
    token_rewards(&k1, logp, logp_ref, 0.0f, 2, rewards);
    for (int t = 0; t < 2; t++)
        EXPECT(rewards[t] == -0.05f * (logp[t] - logp_ref[t]), "k1 penalty bits at %d", t);
    KlEstimator unknown;
    EXPECT(kl_estimator_from_name("low_var_kl", &unknown) != 0, "unknown estimator refused");
    // The ratio-weighted term's gradient (the ratio's own included) against central differences,
    // for each kind of ratio and a macro segmentation of 2 + 3 tokens.
    const float old5[5] = {-1.1f, -0.4f, -2.0f, -0.9f, -3.1f}, ref5[5] = {-1.0f, -0.7f, -1.6f, -1.2f, -2.5f};
    const float new5[5] = {-0.8f, -0.5f, -2.3f, -0.6f, -2.9f};
    const int macro[2] = {2, 3};
    for (int kind = RATIO_PER_TOKEN; kind <= RATIO_SEQUENCE_MEAN; kind++)
        for (int e = KL_K1; e <= KL_K3; e++) {
            PpoLossConfig config = {.ratio = (RatioKind)kind, .kl_loss_coef = 0.3f, .kl_loss_estimator = (KlEstimator)e};
            float grad[5] = {0};
            ppo_kl_loss_ratio_weighted(&config, new5, old5, ref5, macro, 2, 5, 0.5f, grad);
            for (int t = 0; t < 5; t++) {
                float up[5], down[5];
                memcpy(up, new5, sizeof up), memcpy(down, new5, sizeof down);
                up[t] += 1e-3f, down[t] -= 1e-3f;
                const double numeric = 0.3 * 0.5 *
                                       (ppo_kl_loss_ratio_weighted(&config, up, old5, ref5, macro, 2, 5, 0, NULL) -
                                        ppo_kl_loss_ratio_weighted(&config, down, old5, ref5, macro, 2, 5, 0, NULL)) /
                                       ((double)up[t] - down[t]);
                EXPECT_CLOSE(grad[t], numeric, 1e-5, 1e-3, "ratio-weighted KL gradient");
            }
        }
}

int main(void) {
    RUN(test_spec_gae_example);
    RUN(test_against_reference);
    RUN(test_single_token_actions_are_token_level);
    RUN(test_group_advantages_against_trl);
    RUN(test_decoupled_group_rewards);
    RUN(test_clip_higher);
    RUN(test_overlong_penalty);
    RUN(test_returns_to_go);
    RUN(test_kl_estimators);
    RUN(test_policy_losses_against_trl);
    RUN(test_policy_loss_forms_by_hand);
    TEST_EXIT();
}
