#include "train/losses.h"

#include <math.h>
#include <stdlib.h>

#include "core/check.h"

double log_sigmoid_negated(double x) {
    // -log sigmoid(x) = log(1 + exp(-x)) = softplus(-x)
    return x >= 0 ? log1p(exp(-x)) : -x + log1p(exp(x));
}

double sft_dft_loss(const float *logp, const float *mask, long n, float scale, float *dlogp) {
    double loss = 0;
    for (long i = 0; i < n; i++) {
        if (mask[i] == 0.0f) continue;
        const double p = exp((double)logp[i]);
        loss -= (double)mask[i] * p * logp[i];
        if (dlogp) dlogp[i] += (float)(-scale * mask[i] * p);
    }
    return loss;
}

static double sigmoid(double x) {
    return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

double sft_loss(const float *logp, const float *mask, long n, float scale, float *dlogp) {
    double loss = 0;
    for (long i = 0; i < n; i++) {
        if (mask[i] == 0.0f) continue;
        loss -= (double)mask[i] * logp[i];
        if (dlogp) dlogp[i] += -scale * mask[i];
    }
    return loss;
}

double rm_pairwise_loss(const float *chosen, const float *rejected, const float *margins, int n,
                        float scale, float *d_chosen, float *d_rejected) {
    double loss = 0;
    for (int i = 0; i < n; i++) {
        double z = (double)chosen[i] - rejected[i] - (margins ? margins[i] : 0.0);
        loss += log_sigmoid_negated(z);
        // d/dz -log sigmoid(z) = -(1 - sigmoid(z)) = -sigmoid(-z)
        double g = -sigmoid(-z) * scale;
        if (d_chosen) d_chosen[i] += (float)g;
        if (d_rejected) d_rejected[i] -= (float)g;
    }
    return loss;
}

double rm_listwise_loss(const float *scores, int n, int K, float scale, float *d_scores) {
    CHECK(K >= 2, "listwise loss needs at least two responses");
    double loss = 0;
    for (int i = 0; i < n; i++) {
        const float *s = scores + (long)i * K;
        // suffix log-sum-exps: lse[k] = log sum_{j>=k} exp(s_j)
        double lse[K];
        double running_max = s[K - 1];
        double running_sum = 1.0; // exp(s[K-1] - running_max)
        lse[K - 1] = s[K - 1];
        for (int k = K - 2; k >= 0; k--) {
            if (s[k] > running_max) {
                running_sum = running_sum * exp(running_max - s[k]) + 1.0;
                running_max = s[k];
            } else {
                running_sum += exp(s[k] - running_max);
            }
            lse[k] = running_max + log(running_sum);
        }
        for (int k = 0; k < K - 1; k++) loss += lse[k] - s[k];
        if (!d_scores) continue;
        // d loss / d s_j = sum_{k <= min(j, K-2)} softmax_k(j) - [j <= K-2]
        float *d = d_scores + (long)i * K;
        for (int j = 0; j < K; j++) {
            double g = j <= K - 2 ? -1.0 : 0.0;
            for (int k = 0; k <= j && k <= K - 2; k++) g += exp(s[j] - lse[k]);
            d[j] += (float)(g * scale);
        }
    }
    return loss;
}

double rm_dschat_pair_loss(const float *chosen_values, const float *rejected_values, int divergence,
                           int end, float scale, float *d_chosen_values, float *d_rejected_values) {
    CHECK(end > divergence, "empty DeepSpeed-Chat loss span [%d, %d)", divergence, end);
    int span = end - divergence;
    double loss = 0;
    for (int t = divergence; t < end; t++) {
        double z = (double)chosen_values[t] - rejected_values[t];
        loss += log_sigmoid_negated(z);
        double g = -sigmoid(-z) * scale / span;
        if (d_chosen_values) d_chosen_values[t] += (float)g;
        if (d_rejected_values) d_rejected_values[t] -= (float)g;
    }
    return loss / span;
}

void rm_dschat_span(const int *chosen_ids, const int *rejected_ids, int T, int pad_id, int *divergence,
                    int *end) {
    int c_end = T, r_end = T;
    for (int t = 0; t < T; t++)
        if (chosen_ids[t] == pad_id) {
            c_end = t;
            break;
        }
    for (int t = 0; t < T; t++)
        if (rejected_ids[t] == pad_id) {
            r_end = t;
            break;
        }
    int first_difference = -1;
    for (int t = 0; t < T; t++)
        if (chosen_ids[t] != rejected_ids[t]) {
            first_difference = t;
            break;
        }
    if (first_difference < 0) {
        *divergence = c_end > 0 ? c_end - 1 : 0;
        *end = c_end > 0 ? c_end : 1;
        return;
    }
    *divergence = first_difference;
    *end = c_end > r_end ? c_end : r_end;
    if (*end <= *divergence) *end = *divergence + 1; // a difference inside the padding of both
}

double kto_example_loss(const KtoLossOptions *options, bool desirable, double logratio, double baseline,
                        double *d_logratio) {
    const double beta = options->beta;
    if (options->loss == KTO_LOSS_BCO) {
        // A logistic classifier of desirable vs undesirable with logit beta r - delta.
        const double z = desirable ? beta * logratio - baseline : baseline - beta * logratio;
        // d/dz -log sigmoid(z) = -sigmoid(-z); dz/dr = +beta (desirable) or -beta
        *d_logratio = desirable ? -beta * sigmoid(-z) : beta * sigmoid(-z);
        return log_sigmoid_negated(z);
    }
    // APO-zero (unpaired) is KTO's loss with the baseline held at 0: 1 - sigmoid(-beta r) is
    // TRL's sigmoid(beta r) for an undesirable example.
    const double kl = options->loss == KTO_LOSS_APO_ZERO_UNPAIRED ? 0.0 : baseline;
    const double z = desirable ? beta * (logratio - kl) : beta * (kl - logratio);
    const double weight = desirable ? options->desirable_weight : options->undesirable_weight;
    // d/dz (1 - sigmoid(z)) = -sigmoid(z) sigmoid(-z); dz/dr = +beta (desirable) or -beta
    const double d_z = -weight * sigmoid(z) * sigmoid(-z);
    *d_logratio = desirable ? beta * d_z : -beta * d_z;
    return weight * sigmoid(-z); // 1 - sigmoid(z), without the cancellation for large z
}

double dpo_pair_loss(const DpoLossOptions *options, double policy_chosen, double policy_rejected, double ref_chosen,
                     double ref_rejected, double *d_chosen, double *d_rejected) {
    const double beta = options->beta, eps = options->label_smoothing;
    const double a = policy_chosen - ref_chosen, b = policy_rejected - ref_rejected, h = a - b, z = beta * h;
    // Losses of the two log-ratios apart set d_a and d_b and return; losses of h alone set
    // d_h (d loss / d h), and d_a = d_h, d_b = -d_h below.
    double loss, d_h;
    switch (options->loss) {
    case DPO_LOSS_SIGMOID:
    case DPO_LOSS_SIGMOID_NORM:
    case DPO_LOSS_SIMPO:
    case DPO_LOSS_ALPHAPO:
    case DPO_LOSS_CPO:
    case DPO_LOSS_AOT: // a batch of one pair: the sorts change nothing, delta = h
    case DPO_LOSS_AOT_UNPAIRED: {
        const double smoothing = options->loss == DPO_LOSS_SIGMOID_NORM ? 0.0 : eps;
        const bool margin = options->loss == DPO_LOSS_SIMPO || options->loss == DPO_LOSS_ALPHAPO;
        const double x = z - (margin ? options->simpo_gamma : 0.0);
        loss = (1 - smoothing) * log_sigmoid_negated(x) + smoothing * log_sigmoid_negated(-x);
        // d/dx -log sigmoid(x) = -sigmoid(-x); d/dx -log sigmoid(-x) = sigmoid(x)
        d_h = beta * (-(1 - smoothing) * sigmoid(-x) + smoothing * sigmoid(x));
        break;
    }
    case DPO_LOSS_ROBUST:
        loss = ((1 - eps) * log_sigmoid_negated(z) - eps * log_sigmoid_negated(-z)) / (1 - 2 * eps);
        d_h = beta * (-(1 - eps) * sigmoid(-z) - eps * sigmoid(z)) / (1 - 2 * eps);
        break;
    case DPO_LOSS_EXO: {
        // q_w log(q_w / (1 - eps)) + q_l log(q_l / eps) with q_w = sigma(z), q_l = sigma(-z);
        // since log q_w - log q_l = z, its derivative is q_w q_l (z - log((1 - eps) / eps)).
        const double q_w = sigmoid(z), q_l = sigmoid(-z);
        loss = q_w * (-log_sigmoid_negated(z) - log1p(-eps)) + q_l * (-log_sigmoid_negated(-z) - log(eps));
        d_h = beta * q_w * q_l * (z - (log1p(-eps) - log(eps)));
        break;
    }
    case DPO_LOSS_IPO:
    case DPO_LOSS_CPO_IPO: {
        const double gap = h - 1.0 / (2.0 * beta);
        loss = gap * gap;
        d_h = 2.0 * gap;
        break;
    }
    case DPO_LOSS_NCA: {
        const double za = beta * a, zb = beta * b;
        *d_chosen = beta * (-sigmoid(-za) + 0.5 * sigmoid(za));
        *d_rejected = beta * 0.5 * sigmoid(zb);
        return log_sigmoid_negated(za) + 0.5 * log_sigmoid_negated(-za) + 0.5 * log_sigmoid_negated(-zb);
    }
    case DPO_LOSS_BCO: {
        const double za = beta * a, zb = beta * b;
        *d_chosen = -beta * sigmoid(-za);
        *d_rejected = beta * sigmoid(zb);
        return log_sigmoid_negated(za) + log_sigmoid_negated(-zb);
    }
    case DPO_LOSS_SPPO: {
        const double gap_chosen = a - 0.5 / beta, gap_rejected = b + 0.5 / beta;
        *d_chosen = 2.0 * gap_chosen;
        *d_rejected = 2.0 * gap_rejected;
        return gap_chosen * gap_chosen + gap_rejected * gap_rejected;
    }
    case DPO_LOSS_APO_ZERO: {
        const double za = beta * a, zb = beta * b;
        *d_chosen = -beta * sigmoid(za) * sigmoid(-za);
        *d_rejected = beta * sigmoid(zb) * sigmoid(-zb);
        return sigmoid(-za) + sigmoid(zb); // 1 - sigmoid(za) without cancellation
    }
    case DPO_LOSS_APO_DOWN: {
        const double za = beta * a, slope_h = beta * sigmoid(z) * sigmoid(-z);
        *d_chosen = beta * sigmoid(za) * sigmoid(-za) - slope_h;
        *d_rejected = slope_h;
        return sigmoid(za) + sigmoid(-z);
    }
    case DPO_LOSS_DISCOPOP: {
        const double tau = options->discopop_tau, m = sigmoid(z / tau), d_m = m * (1 - m) / tau;
        const double logistic = log_sigmoid_negated(z), exponential = exp(-z);
        loss = logistic * (1 - m) + exponential * m;
        d_h = beta * (-sigmoid(-z) * (1 - m) - logistic * d_m - exponential * m + exponential * d_m);
        break;
    }
    case DPO_LOSS_ORPO: {
        // A mean log-prob of exactly 0 (every token certain) has infinite odds; hold it just
        // below, where the loss and its gradient stay finite.
        const double a_c = fmin(a, -1e-9), a_r = fmin(b, -1e-9);
        const double one_minus_c = -expm1(a_c), one_minus_r = -expm1(a_r); // 1 - e^a, accurately near 0
        const double odds = (a_c - log(one_minus_c)) - (a_r - log(one_minus_r));
        // d odds(a) / da = 1 + e^a / (1 - e^a) = 1 / (1 - e^a)
        const double d_odds = beta * -sigmoid(-odds);
        *d_chosen = -1.0 + d_odds / one_minus_c;
        *d_rejected = -d_odds / one_minus_r;
        return -a_c + beta * log_sigmoid_negated(odds);
    }
    case DPO_LOSS_HINGE:
    case DPO_LOSS_CPO_HINGE:
    default:
        loss = z < 1.0 ? 1.0 - z : 0.0;
        d_h = z < 1.0 ? -beta : 0.0;
        break;
    }
    *d_chosen = d_h;
    *d_rejected = -d_h;
    return loss;
}

double f_divergence_score(FDivergence kind, double alpha, double u, double *d_score) {
    switch (kind) {
    case F_DIVERGENCE_FORWARD_KL:
        *d_score = exp(-u);
        return -expm1(-u);
    case F_DIVERGENCE_JS:
        *d_score = sigmoid(-u); // d/du log sigma(u)
        return log(2.0) - log_sigmoid_negated(u);
    case F_DIVERGENCE_ALPHA: {
        if (fabs(alpha - 1.0) < 1e-6) break; // the limit is reverse KL
        const double t = (alpha - 1.0) * u;
        // TRL holds t at most 80 so that exp(t) stays finite in float32; held, it is flat.
        *d_score = t > 80.0 ? 0.0 : exp(t);
        return expm1(fmin(t, 80.0)) / (alpha - 1.0);
    }
    case F_DIVERGENCE_REVERSE_KL:
    default:
        break;
    }
    *d_score = 1.0;
    return u;
}

double alphapo_reward(double alpha, double x, double *slope) {
    if (alpha == 0.0) {
        *slope = 1.0;
        return x;
    }
    *slope = exp(-alpha * x);
    return -expm1(-alpha * x) / alpha;
}

// One loss kind of dpo_pair_loss_from_sums.
static double pair_term_from_sums(const DpoLossOptions *options, double policy_chosen, double policy_rejected,
                                  double ref_chosen, double ref_rejected, int chosen_tokens, int rejected_tokens,
                                  double *d_chosen, double *d_rejected) {
    const DpoLossKind kind = options->loss;
    const bool means = dpo_loss_compares_means(kind);
    const double nc = means ? chosen_tokens : 1.0, nr = means ? rejected_tokens : 1.0;
    double loss, dc, dr;
    if (dpo_loss_is_cpo_trainer(kind) && options->alphapo_alpha != 0.0) {
        // AlphaPO: the rewards of the rows' log-probs (means or sums as the loss compares
        // them, as TRL's CPOTrainer computes them) take the log-probs' place.
        double slope_chosen, slope_rejected;
        const double reward_chosen = alphapo_reward(options->alphapo_alpha, policy_chosen / nc, &slope_chosen);
        const double reward_rejected = alphapo_reward(options->alphapo_alpha, policy_rejected / nr, &slope_rejected);
        loss = dpo_pair_loss(options, reward_chosen, reward_rejected, 0.0, 0.0, &dc, &dr);
        *d_chosen = dc * slope_chosen / nc, *d_rejected = dr * slope_rejected / nr;
        return loss;
    }
    if (options->f_divergence == F_DIVERGENCE_REVERSE_KL) {
        loss = dpo_pair_loss(options, policy_chosen / nc, policy_rejected / nr, ref_chosen / nc, ref_rejected / nr, &dc,
                             &dr);
        *d_chosen = dc / nc, *d_rejected = dr / nr;
        return loss;
    }
    // The scores of the whole log-ratios, then their means (TRL divides the scores).
    double slope_chosen, slope_rejected;
    const double score_chosen = f_divergence_score(options->f_divergence, options->f_alpha,
                                                   policy_chosen - ref_chosen, &slope_chosen);
    const double score_rejected = f_divergence_score(options->f_divergence, options->f_alpha,
                                                     policy_rejected - ref_rejected, &slope_rejected);
    loss = dpo_pair_loss(options, score_chosen / nc, score_rejected / nr, 0.0, 0.0, &dc, &dr);
    *d_chosen = dc / nc * slope_chosen, *d_rejected = dr / nr * slope_rejected;
    return loss;
}

double dpo_pair_loss_from_sums(const DpoLossOptions *options, double policy_chosen, double policy_rejected,
                               double ref_chosen, double ref_rejected, int chosen_tokens, int rejected_tokens,
                               double *d_chosen, double *d_rejected) {
    if (options->term_count == 0)
        return pair_term_from_sums(options, policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_tokens,
                                   rejected_tokens, d_chosen, d_rejected);
    double loss = 0.0;
    *d_chosen = *d_rejected = 0.0;
    for (int k = 0; k < options->term_count; k++) {
        DpoLossOptions term = *options;
        term.loss = options->terms[k];
        double dc, dr;
        const double term_loss = pair_term_from_sums(&term, policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                                                     chosen_tokens, rejected_tokens, &dc, &dr);
        const double weight = options->term_weights[k];
        loss += weight * term_loss;
        *d_chosen += weight * dc, *d_rejected += weight * dr;
    }
    return loss;
}

bool dpo_options_sort_batch(const DpoLossOptions *options) {
    if (options->term_count == 0) return dpo_loss_sorts_batch(options->loss);
    for (int k = 0; k < options->term_count; k++)
        if (dpo_loss_sorts_batch(options->terms[k])) return true;
    return false;
}

// Sorting pairs by a value, ties by index (qsort is not stable).
typedef struct {
    double value;
    int index;
} Ranked;

static int ranked_compare(const void *x, const void *y) {
    const Ranked *a = x, *b = y;
    if (a->value != b->value) return a->value < b->value ? -1 : 1;
    return a->index - b->index;
}

static Ranked *ranked_sort(int n, const double *plus, const double *minus) {
    Ranked *ranked = xmalloc((size_t)n * sizeof *ranked);
    for (int i = 0; i < n; i++) ranked[i] = (Ranked){plus[i] - minus[i], i};
    qsort(ranked, (size_t)n, sizeof *ranked, ranked_compare);
    return ranked;
}

// One AOT term over the batch: the sum of its n sorted terms; the gradients are ADDED, times weight.
static double sorted_term(const DpoLossOptions *options, DpoLossKind kind, double weight, int n,
                          const double *policy_chosen, const double *policy_rejected, const double *ref_chosen,
                          const double *ref_rejected, double *d_chosen, double *d_rejected) {
    // aot: the policy's chosen - rejected against the reference's, each sorted; aot_unpaired:
    // the chosen log-ratios against the rejected ones, each sorted.
    const bool paired = kind == DPO_LOSS_AOT;
    Ranked *first = paired ? ranked_sort(n, policy_chosen, policy_rejected) : ranked_sort(n, policy_chosen, ref_chosen);
    Ranked *second = paired ? ranked_sort(n, ref_chosen, ref_rejected) : ranked_sort(n, policy_rejected, ref_rejected);
    DpoLossOptions term = *options;
    term.loss = kind;
    double loss = 0.0;
    for (int k = 0; k < n; k++) {
        double d_delta, d_unused;
        loss += dpo_pair_loss(&term, first[k].value - second[k].value, 0.0, 0.0, 0.0, &d_delta, &d_unused);
        // aot: delta_k moves with the policy's x of the pair first[k] names (+ chosen, - rejected);
        // aot_unpaired: + with the chosen log-ratio of first[k], - with the rejected one of second[k].
        d_chosen[first[k].index] += weight * d_delta;
        d_rejected[paired ? first[k].index : second[k].index] -= weight * d_delta;
    }
    free(first), free(second);
    return loss;
}

double dpo_batch_loss_from_sums(const DpoLossOptions *options, int n, const double *policy_chosen,
                                const double *policy_rejected, const double *ref_chosen, const double *ref_rejected,
                                const int *chosen_tokens, const int *rejected_tokens, double *d_chosen,
                                double *d_rejected) {
    const int terms = options->term_count == 0 ? 1 : options->term_count;
    for (int i = 0; i < n; i++) d_chosen[i] = d_rejected[i] = 0.0;
    double loss = 0.0;
    for (int k = 0; k < terms; k++) {
        DpoLossOptions term = *options;
        term.term_count = 0;
        if (options->term_count > 0) term.loss = options->terms[k];
        const double weight = options->term_count > 0 ? options->term_weights[k] : 1.0;
        if (dpo_loss_sorts_batch(term.loss)) {
            loss += weight * sorted_term(&term, term.loss, weight, n, policy_chosen, policy_rejected, ref_chosen,
                                         ref_rejected, d_chosen, d_rejected);
            continue;
        }
        for (int i = 0; i < n; i++) {
            double dc, dr;
            loss += weight * pair_term_from_sums(&term, policy_chosen[i], policy_rejected[i], ref_chosen[i],
                                                 ref_rejected[i], chosen_tokens[i], rejected_tokens[i], &dc, &dr);
            d_chosen[i] += weight * dc, d_rejected[i] += weight * dr;
        }
    }
    return loss;
}
