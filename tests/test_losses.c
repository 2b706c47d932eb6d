// SFT and reward-model losses and their gradients against PyTorch autograd
// (tools/make_loss_fixtures.py, float64). The C losses take float32 inputs and
// accumulate in double: tolerance 1e-6 absolute + 1e-5 relative.
#include <jansson.h>

#include "core/check.h"
#include "test.h"
#include "train/dpo.h"
#include "train/losses.h"

static json_t *fixtures;

static int flatten(json_t *array, float *out) {
    int n = 0;
    size_t i;
    json_t *item;
    json_array_foreach(array, i, item) {
        if (json_is_array(item)) n += flatten(item, out + n);
        else out[n++] = (float)json_number_value(item);
    }
    return n;
}

static void expect_array(const float *got, json_t *want, const char *what) {
    float expected[256];
    int n = flatten(want, expected);
    for (int i = 0; i < n; i++) EXPECT_CLOSE(got[i], expected[i], 1e-6, 1e-5, what);
}

static double number(json_t *object, const char *key) { return json_number_value(json_object_get(object, key)); }

static void test_sft_loss(void) {
    json_t *f = json_object_get(fixtures, "sft");
    float logp[64], mask[64], dlogp[64] = {0};
    int n = flatten(json_object_get(f, "logp"), logp);
    flatten(json_object_get(f, "mask"), mask);
    double count = 0;
    for (int i = 0; i < n; i++) count += mask[i];
    double loss = sft_loss(logp, mask, n, (float)(1.0 / count), dlogp) / count;
    EXPECT_CLOSE(loss, number(f, "loss"), 1e-6, 1e-6, "sft loss");
    expect_array(dlogp, json_object_get(f, "dlogp"), "sft dlogp");
    // DFT (TRL's loss_type "dft"): the same tokens, each weighted by its detached probability.
    f = json_object_get(fixtures, "sft_dft");
    float dft_dlogp[64] = {0};
    n = flatten(json_object_get(f, "logp"), logp);
    flatten(json_object_get(f, "mask"), mask);
    count = 0;
    for (int i = 0; i < n; i++) count += mask[i];
    loss = sft_dft_loss(logp, mask, n, (float)(1.0 / count), dft_dlogp) / count;
    EXPECT_CLOSE(loss, number(f, "loss"), 1e-6, 1e-6, "sft dft loss");
    expect_array(dft_dlogp, json_object_get(f, "dlogp"), "sft dft dlogp");
}

static void run_pairwise(const char *name) {
    json_t *f = json_object_get(fixtures, name);
    float chosen[16], rejected[16], margin[16], dc[16] = {0}, dr[16] = {0};
    int n = flatten(json_object_get(f, "chosen"), chosen);
    flatten(json_object_get(f, "rejected"), rejected);
    flatten(json_object_get(f, "margin"), margin);
    double loss = rm_pairwise_loss(chosen, rejected, margin, n, 1.0f / n, dc, dr) / n;
    EXPECT_CLOSE(loss, number(f, "loss"), 1e-6, 1e-6, name);
    expect_array(dc, json_object_get(f, "d_chosen"), "d chosen");
    expect_array(dr, json_object_get(f, "d_rejected"), "d rejected");
}
static void test_pairwise_loss(void) { run_pairwise("pairwise"); }
static void test_margin_loss(void) { run_pairwise("margin"); }

static void test_listwise_loss(void) {
    json_t *f = json_object_get(fixtures, "listwise");
    json_t *rows = json_object_get(f, "scores");
    int n = (int)json_array_size(rows), K = (int)json_array_size(json_array_get(rows, 0));
    float scores[64], d[64] = {0};
    flatten(rows, scores);
    double loss = rm_listwise_loss(scores, n, K, 1.0f / n, d) / n;
    EXPECT_CLOSE(loss, number(f, "loss"), 1e-6, 1e-6, "listwise loss");
    expect_array(d, json_object_get(f, "d_scores"), "listwise d scores");
    // K = 2 is the pairwise loss.
    float pair[2] = {0.7f, -0.4f}, d2[2] = {0}, c = 0.7f, r = -0.4f, dc = 0, dr = 0;
    double a = rm_listwise_loss(pair, 1, 2, 1.0f, d2), b = rm_pairwise_loss(&c, &r, NULL, 1, 1.0f, &dc, &dr);
    EXPECT_CLOSE(a, b, 1e-12, 0, "listwise K=2 equals pairwise");
    EXPECT_CLOSE(d2[0], dc, 1e-7, 0, "gradient K=2");
}

static void test_dschat_loss(void) {
    json_t *f = json_object_get(fixtures, "dschat");
    json_t *cids = json_object_get(f, "chosen_ids"), *rids = json_object_get(f, "rejected_ids");
    int pairs = (int)json_array_size(cids), T = (int)json_array_size(json_array_get(cids, 0));
    float cv[64], rv[64], dcv[64] = {0}, drv[64] = {0};
    flatten(json_object_get(f, "chosen_values"), cv);
    flatten(json_object_get(f, "rejected_values"), rv);
    double loss = 0;
    for (int i = 0; i < pairs; i++) {
        int c[32], r[32];
        for (int t = 0; t < T; t++) {
            c[t] = (int)json_integer_value(json_array_get(json_array_get(cids, i), t));
            r[t] = (int)json_integer_value(json_array_get(json_array_get(rids, i), t));
        }
        int d, e;
        rm_dschat_span(c, r, T, (int)number(f, "pad"), &d, &e);
        json_t *span = json_array_get(json_object_get(f, "spans"), i);
        EXPECT(d == json_integer_value(json_array_get(span, 0)) && e == json_integer_value(json_array_get(span, 1)),
               "pair %d span [%d, %d)", i, d, e);
        loss += rm_dschat_pair_loss(cv + i * T, rv + i * T, d, e, 1.0f / pairs, dcv + i * T, drv + i * T);
    }
    EXPECT_CLOSE(loss / pairs, number(f, "loss"), 1e-6, 1e-6, "dschat loss");
    expect_array(dcv, json_object_get(f, "d_chosen_values"), "dschat d chosen");
    expect_array(drv, json_object_get(f, "d_rejected_values"), "dschat d rejected");
}

static void test_extreme_scores_are_finite(void) {
    float c = 1e4f, r = -1e4f, dc = 0, dr = 0;
    double loss = rm_pairwise_loss(&r, &c, NULL, 1, 1.0f, &dr, &dc);
    EXPECT(isfinite(loss) && fabs(loss - 2e4) < 1e-3, "loss %g", loss);
    EXPECT(dc == 1.0f && dr == -1.0f, "saturated gradients %g %g", dc, dr);
}

// The gradient of dpo_pair_loss at x against central differences of the loss in each of
// the four log-probs (the loss depends on the reference's with the opposite sign).
static void expect_dpo_gradient(const DpoLossOptions *o, const double x[4], const char *name) {
    double grad[2];
    dpo_pair_loss(o, x[0], x[1], x[2], x[3], &grad[0], &grad[1]);
    for (int i = 0; i < 4; i++) {
        const double step = 1e-5;
        double up[4], down[4], unused[2];
        memcpy(up, x, sizeof up), memcpy(down, x, sizeof down);
        up[i] += step, down[i] -= step;
        double numeric = (dpo_pair_loss(o, up[0], up[1], up[2], up[3], &unused[0], &unused[1]) -
                          dpo_pair_loss(o, down[0], down[1], down[2], down[3], &unused[0], &unused[1])) /
                         (2 * step);
        double analytic = i < 2 ? grad[i] : -grad[i - 2];
        char what[96];
        snprintf(what, sizeof what, "%s d/dx%d", name, i);
        EXPECT_CLOSE(analytic, numeric, 1e-7, 1e-6, what);
    }
}

// DPO: the loss at h = 0 (log 2 for sigmoid, whatever the smoothing; 1/(4 beta^2) for IPO;
// 1 for hinge), the gradient against central differences, and saturation without overflow.
static void test_dpo_loss(void) {
    struct { DpoLossOptions o; const char *name; } cases[] = {
        {{.loss = DPO_LOSS_SIGMOID, .beta = 0.1}, "sigmoid"},
        {{.loss = DPO_LOSS_SIGMOID, .beta = 0.5, .label_smoothing = 0.2}, "sigmoid eps 0.2"},
        {{.loss = DPO_LOSS_IPO, .beta = 0.1}, "ipo"}, {{.loss = DPO_LOSS_HINGE, .beta = 0.5}, "hinge"},
        {{.loss = DPO_LOSS_SIMPO, .beta = 2.0, .simpo_gamma = 1.0}, "simpo"},
        {{.loss = DPO_LOSS_SIMPO, .beta = 2.0, .simpo_gamma = 1.0, .label_smoothing = 0.2}, "simpo eps 0.2"},
        {{.loss = DPO_LOSS_CPO, .beta = 0.5, .label_smoothing = 0.1}, "cpo eps 0.1"},
        {{.loss = DPO_LOSS_CPO_HINGE, .beta = 0.5}, "cpo-hinge"}, {{.loss = DPO_LOSS_CPO_IPO, .beta = 0.1}, "cpo-ipo"},
        {{.loss = DPO_LOSS_ALPHAPO, .beta = 2.0, .simpo_gamma = 1.0, .label_smoothing = 0.1}, "alphapo eps 0.1"},
        {{.loss = DPO_LOSS_AOT, .beta = 0.5, .label_smoothing = 0.1}, "aot of one pair, eps 0.1"},
        {{.loss = DPO_LOSS_AOT_UNPAIRED, .beta = 0.5}, "aot-unpaired of one pair"}};
    const DpoLossOptions sigmoid = {.loss = DPO_LOSS_SIGMOID, .beta = 0.1};
    const DpoLossOptions cdpo = {.loss = DPO_LOSS_SIGMOID, .beta = 0.1, .label_smoothing = 0.3};
    const DpoLossOptions ipo = {.loss = DPO_LOSS_IPO, .beta = 0.1}, hinge = {.loss = DPO_LOSS_HINGE, .beta = 0.5};
    const DpoLossOptions simpo = {.loss = DPO_LOSS_SIMPO, .beta = 2.0, .simpo_gamma = 1.0};
    double dc, dr;
    EXPECT_CLOSE(dpo_pair_loss(&sigmoid, -3, -4, -3, -4, &dc, &dr), log(2.0), 1e-15, 0, "sigmoid at 0");
    EXPECT_CLOSE(dc, -0.05, 1e-15, 0, "sigmoid d chosen at 0 (-beta/2)");
    EXPECT_CLOSE(dpo_pair_loss(&cdpo, -3, -4, -3, -4, &dc, &dr), log(2.0), 1e-15, 0, "cdpo at 0");
    EXPECT_CLOSE(dc, -0.1 * (0.7 * 0.5 - 0.3 * 0.5), 1e-15, 0, "cdpo d chosen at 0");
    EXPECT_CLOSE(dpo_pair_loss(&ipo, -3, -4, -3, -4, &dc, &dr), 25.0, 1e-12, 0, "ipo at 0");
    EXPECT_CLOSE(dpo_pair_loss(&hinge, -3, -4, -3, -4, &dc, &dr), 1.0, 1e-15, 0, "hinge at 0");
    // SimPO at equal means: -log sigmoid(-gamma).
    EXPECT_CLOSE(dpo_pair_loss(&simpo, -2, -2, 0, 0, &dc, &dr), log1p(exp(1.0)), 1e-15, 0, "simpo at equal means");
    // CPO at equal sums: log 2 whatever the smoothing (no reference: the caller passes 0).
    const DpoLossOptions cpo = {.loss = DPO_LOSS_CPO, .beta = 0.5, .label_smoothing = 0.1};
    EXPECT_CLOSE(dpo_pair_loss(&cpo, -7, -7, 0, 0, &dc, &dr), log(2.0), 1e-15, 0, "cpo at equal sums");
    EXPECT_CLOSE(dc, -0.5 * (0.9 * 0.5 - 0.1 * 0.5), 1e-15, 0, "cpo d chosen at 0");
    // AOT of a batch of one pair sorts nothing: it is cDPO's loss and gradient.
    for (int unpaired = 0; unpaired < 2; unpaired++) {
        const DpoLossOptions aot = {.loss = unpaired ? DPO_LOSS_AOT_UNPAIRED : DPO_LOSS_AOT, .beta = 0.3,
                                    .label_smoothing = 0.2};
        const DpoLossOptions smoothed = {.loss = DPO_LOSS_SIGMOID, .beta = 0.3, .label_smoothing = 0.2};
        const double pc = -12, pr = -9, rc = -14, rr = -8;
        const int tokens = 5;
        double bc, br;
        const double batch = dpo_batch_loss_from_sums(&aot, 1, &pc, &pr, &rc, &rr, &tokens, &tokens, &bc, &br);
        EXPECT(batch == dpo_pair_loss(&smoothed, pc, pr, rc, rr, &dc, &dr) && bc == dc && br == dr,
               "aot (unpaired %d) of one pair %g vs cdpo %g", unpaired, batch, dpo_pair_loss(&smoothed, pc, pr, rc, rr, &dc, &dr));
    }
    const double points[][4] = {{-10.5, -12.25, -11.0, -11.5}, {-3.0, -2.0, -3.5, -1.25}, {-40, -7, -20, -30}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int p = 0; p < 3; p++) {
            char name[64];
            snprintf(name, sizeof name, "%s point %d", cases[c].name, p);
            expect_dpo_gradient(&cases[c].o, points[p], name);
        }
    // ORPO takes mean log-probs, which are negative: its own points, one near 0 where the
    // odds are large, one far below.
    const DpoLossOptions orpo = {.loss = DPO_LOSS_ORPO, .beta = 0.7};
    const double orpo_points[][4] = {{-2.5, -1.25, 0, 0}, {-0.02, -4.0, 0, 0}, {-9.0, -0.3, 0, 0}, {-1.0, -1.5, 0.5, -0.25}};
    for (int p = 0; p < 4; p++) {
        char name[64];
        snprintf(name, sizeof name, "orpo point %d", p);
        expect_dpo_gradient(&orpo, orpo_points[p], name);
    }
    // At equal means the odds term is beta log 2: the loss is the NLL plus that.
    EXPECT_CLOSE(dpo_pair_loss(&orpo, -2, -2, 0, 0, &dc, &dr), 2.0 + 0.7 * log(2.0), 1e-14, 0, "orpo at equal means");
    // A mean log-prob of 0 (certain tokens) stays finite.
    double certain = dpo_pair_loss(&orpo, 0.0, -1.0, 0, 0, &dc, &dr);
    EXPECT(isfinite(certain) && isfinite(dc) && isfinite(dr), "orpo at mean 0: loss %g grads %g %g", certain, dc, dr);
    const DpoLossOptions saturated = {.loss = DPO_LOSS_SIGMOID, .beta = 1.0, .label_smoothing = 0.1};
    double loss = dpo_pair_loss(&saturated, -1, -5000, -5000, -1, &dc, &dr);
    EXPECT(isfinite(loss) && isfinite(dc) && isfinite(dr), "saturated sigmoid: loss %g grads %g %g", loss, dc, dr);
    EXPECT_CLOSE(loss, 0.1 * 9998, 1e-6, 1e-9, "saturated cdpo loss is eps * beta * h");
}

// TRL 1.12's DPO loss types and f-divergences (tools/make_dpo_loss_fixtures.py: its
// formulas in float64 autograd, from the rows' sums and token counts): every case's loss and
// both gradients, and the gradients against central differences.
static void test_dpo_loss_types(void) {
    json_error_t error;
    json_t *cases = json_load_file("tests/fixtures/dpo/loss_types.json", 0, &error);
    CHECK(cases, "loss_types.json: %s", error.text);
    size_t index;
    json_t *c;
    int checked[DPO_LOSS_CPO + 1] = {0}, divergences[F_DIVERGENCE_ALPHA + 1] = {0};
    json_array_foreach(cases, index, c) {
        const char *type = json_string_value(json_object_get(c, "loss_type"));
        const char *divergence = json_string_value(json_object_get(c, "f_divergence"));
        DpoLossOptions o = {.beta = json_number_value(json_object_get(c, "beta")),
                            .label_smoothing = json_number_value(json_object_get(c, "label_smoothing")),
                            .discopop_tau = json_number_value(json_object_get(c, "discopop_tau")),
                            .f_alpha = json_number_value(json_object_get(c, "f_alpha"))};
        CHECK(dpo_loss_from_name(type, &o.loss) == 0, "unknown loss type %s", type);
        CHECK(f_divergence_from_name(divergence, &o.f_divergence) == 0, "unknown divergence %s", divergence);
        json_t *logps = json_object_get(c, "logps"), *grad = json_object_get(c, "grad");
        json_t *tokens = json_object_get(c, "tokens");
        double x[4];
        for (int i = 0; i < 4; i++) x[i] = json_number_value(json_array_get(logps, (size_t)i));
        const int nc = (int)json_integer_value(json_array_get(tokens, 0));
        const int nr = (int)json_integer_value(json_array_get(tokens, 1));
        double dc, dr, loss = dpo_pair_loss_from_sums(&o, x[0], x[1], x[2], x[3], nc, nr, &dc, &dr);
        char what[128];
        snprintf(what, sizeof what, "case %zu (%s, %s, beta %g) loss", index, type, divergence, o.beta);
        EXPECT_CLOSE(loss, json_number_value(json_object_get(c, "loss")), 1e-12, 1e-10, what);
        snprintf(what, sizeof what, "case %zu (%s, %s, beta %g) d chosen", index, type, divergence, o.beta);
        EXPECT_CLOSE(dc, json_number_value(json_array_get(grad, 0)), 1e-12, 1e-9, what);
        snprintf(what, sizeof what, "case %zu (%s, %s, beta %g) d rejected", index, type, divergence, o.beta);
        EXPECT_CLOSE(dr, json_number_value(json_array_get(grad, 1)), 1e-12, 1e-9, what);
        // Central differences in the policy's two sums (no point sits on hinge's kink).
        const double analytic[2] = {dc, dr};
        for (int i = 0; i < 2; i++) {
            const double step = 1e-5;
            double up[4], down[4], unused[2];
            memcpy(up, x, sizeof up), memcpy(down, x, sizeof down);
            up[i] += step, down[i] -= step;
            const double numeric = (dpo_pair_loss_from_sums(&o, up[0], up[1], up[2], up[3], nc, nr, &unused[0], &unused[1]) -
                                    dpo_pair_loss_from_sums(&o, down[0], down[1], down[2], down[3], nc, nr, &unused[0],
                                                            &unused[1])) /
                                   (2 * step);
            snprintf(what, sizeof what, "case %zu (%s, %s) d/dx%d by central differences", index, type, divergence, i);
            EXPECT_CLOSE(analytic[i], numeric, 1e-7, 1e-6, what);
        }
        checked[o.loss]++, divergences[o.f_divergence]++;
    }
    // CPO, SimPO and ORPO are not DPOTrainer's: tests/test_dpo.c checks them against TRL's
    // CPOTrainer and the ORPO definition.
    for (int kind = 0; kind <= DPO_LOSS_CPO; kind++)
        EXPECT(checked[kind] > 0 || !dpo_loss_uses_reference(kind), "loss kind %d has no fixture case", kind);
    for (int kind = 0; kind <= F_DIVERGENCE_ALPHA; kind++)
        EXPECT(divergences[kind] > 0, "divergence %d has no fixture case", kind);
    json_decref(cases);
}

// Several TRL loss types at once (tools/make_dpo_loss_fixtures.py's loss_combinations.json:
// TRL 1.12's sum over loss_type of loss_weights times each per-pair loss): the loss and both
// gradients of dpo_pair_loss_from_sums with terms.
static void test_dpo_loss_combinations(void) {
    json_error_t error;
    json_t *cases = json_load_file("tests/fixtures/dpo/loss_combinations.json", 0, &error);
    CHECK(cases, "loss_combinations.json: %s", error.text);
    size_t index;
    json_t *c;
    int checked = 0;
    json_array_foreach(cases, index, c) {
        DpoLossOptions o = {.beta = json_number_value(json_object_get(c, "beta")),
                            .label_smoothing = json_number_value(json_object_get(c, "label_smoothing")),
                            .discopop_tau = json_number_value(json_object_get(c, "discopop_tau")),
                            .f_alpha = json_number_value(json_object_get(c, "f_alpha"))};
        const char *divergence = json_string_value(json_object_get(c, "f_divergence"));
        CHECK(f_divergence_from_name(divergence, &o.f_divergence) == 0, "unknown divergence %s", divergence);
        json_t *types = json_object_get(c, "loss_type"), *weights = json_object_get(c, "loss_weights");
        o.term_count = (int)json_array_size(types);
        CHECK(o.term_count >= 2 && o.term_count <= DPO_MAX_LOSS_TERMS &&
                  json_array_size(weights) == json_array_size(types),
              "case %zu: bad loss_type list", index);
        for (int k = 0; k < o.term_count; k++) {
            const char *type = json_string_value(json_array_get(types, (size_t)k));
            CHECK(dpo_loss_from_name(type, &o.terms[k]) == 0, "unknown loss type %s", type);
            o.term_weights[k] = json_number_value(json_array_get(weights, (size_t)k));
        }
        o.loss = o.terms[0];
        json_t *logps = json_object_get(c, "logps"), *grad = json_object_get(c, "grad");
        json_t *tokens = json_object_get(c, "tokens");
        double x[4];
        for (int i = 0; i < 4; i++) x[i] = json_number_value(json_array_get(logps, (size_t)i));
        const int nc = (int)json_integer_value(json_array_get(tokens, 0));
        const int nr = (int)json_integer_value(json_array_get(tokens, 1));
        double dc, dr, loss = dpo_pair_loss_from_sums(&o, x[0], x[1], x[2], x[3], nc, nr, &dc, &dr);
        char what[96];
        snprintf(what, sizeof what, "combination %zu (%d losses, beta %g) loss", index, o.term_count, o.beta);
        EXPECT_CLOSE(loss, json_number_value(json_object_get(c, "loss")), 1e-12, 1e-10, what);
        snprintf(what, sizeof what, "combination %zu d chosen", index);
        EXPECT_CLOSE(dc, json_number_value(json_array_get(grad, 0)), 1e-12, 1e-9, what);
        snprintf(what, sizeof what, "combination %zu d rejected", index);
        EXPECT_CLOSE(dr, json_number_value(json_array_get(grad, 1)), 1e-12, 1e-9, what);
        checked++;
    }
    EXPECT(checked >= 20, "only %d combination cases", checked);
    json_decref(cases);
    // One term of weight 1 is the loss alone, bit for bit (what --loss with one name runs).
    const DpoLossOptions alone = {.loss = DPO_LOSS_IPO, .beta = 0.3};
    const DpoLossOptions one_term = {.loss = DPO_LOSS_IPO, .beta = 0.3, .term_count = 1, .terms = {DPO_LOSS_IPO},
                                     .term_weights = {1.0}};
    double dc1, dr1, dc2, dr2;
    const double l1 = dpo_pair_loss_from_sums(&alone, -12.5, -20.25, -13.0, -19.0, 7, 9, &dc1, &dr1);
    const double l2 = dpo_pair_loss_from_sums(&one_term, -12.5, -20.25, -13.0, -19.0, 7, 9, &dc2, &dr2);
    EXPECT(l1 == l2 && dc1 == dc2 && dr1 == dr2, "one term of weight 1: %.17g vs %.17g", l1, l2);
}

int main(void) {
    json_error_t error;
    fixtures = json_load_file("tests/fixtures/losses/losses.json", 0, &error);
    CHECK(fixtures, "losses.json: %s", error.text);
    RUN(test_sft_loss);
    RUN(test_pairwise_loss);
    RUN(test_margin_loss);
    RUN(test_listwise_loss);
    RUN(test_dschat_loss);
    RUN(test_extreme_scores_are_finite);
    RUN(test_dpo_loss);
    RUN(test_dpo_loss_types);
    RUN(test_dpo_loss_combinations);
    json_decref(fixtures);
    TEST_EXIT();
}
