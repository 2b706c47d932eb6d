// The losses of SFT, reward modelling and DPO, as pure functions from model outputs to a loss
// value and its gradient with respect to those outputs. The trainers feed the gradients
// to model_backward() as per-token weights (dlogp or dvalue).
//
// All gradients are ACCUMULATED (+=) into the given arrays, scaled by `scale`, so a
// trainer can sum several micro-batches into one optimizer step with scale = 1/total.
#pragma once
#include <stdbool.h>

// ---- SFT ----
// Causal-LM loss: -sum over counted positions of logp. logp and mask are [n]; mask[i] in
// {0, 1}. Returns the sum of -logp over counted positions (the caller divides by the
// number of counted tokens in the optimizer batch); dlogp[i] += -scale * mask[i].
double sft_loss(const float *logp, const float *mask, long n, float scale, float *dlogp);
// Dynamic Fine-Tuning (Wu et al. 2025, "On the Generalization of SFT"; TRL's loss_type "dft"):
// each counted token's -logp weighted by its probability p = exp(logp), held constant (no
// gradient through it). Returns the sum of -p logp over counted positions; dlogp[i] += -scale
// * mask[i] * p[i].
double sft_dft_loss(const float *logp, const float *mask, long n, float scale, float *dlogp);

// ---- reward model: one scalar score per sequence ----
// Pairwise logistic (Bradley–Terry): loss_i = -log sigmoid(chosen_i - rejected_i - margin_i).
// margins may be NULL (0). Returns the summed loss over the n pairs.
double rm_pairwise_loss(const float *chosen, const float *rejected, const float *margins, int n,
                        float scale, float *d_chosen, float *d_rejected);

// Listwise Plackett–Luce over K responses ranked best first (scores[i*K + k]):
// loss_i = -sum_{k=0}^{K-2} [s_k - log sum_{j>=k} exp(s_j)]. Returns the summed loss.
double rm_listwise_loss(const float *scores, int n, int K, float scale, float *d_scores);

// DeepSpeed-Chat's token-span loss for one pair (spec §5): per-token values of the chosen and
// rejected rows (each `length` slots, right-padded), the first differing slot `divergence`
// and the span end `end` (exclusive): loss = mean over t in [divergence, end) of
// -log sigmoid(chosen[t] - rejected[t]). Returns that mean.
double rm_dschat_pair_loss(const float *chosen_values, const float *rejected_values, int divergence,
                           int end, float scale, float *d_chosen_values, float *d_rejected_values);

// ---- DPO: one pair's log-probabilities under the policy and the frozen reference ----
// a = policy_chosen - ref_chosen and b = policy_rejected - ref_rejected (each a sum of the
// response tokens' log-probs; for IPO, sigmoid-norm and SimPO the caller passes per-token
// means, as TRL does), h = a - b, z = beta h, sigma the logistic function:
//   DPO_LOSS_SIGMOID  -(1 - eps) log sigma(z) - eps log sigma(-z)
//                     (eps = label_smoothing: DeepSpeed-Chat's / OpenRLHF's conservative
//                     DPO; eps = 0 is the DPO paper's and TRL's "sigmoid")
//   DPO_LOSS_SIGMOID_NORM  -log sigma(z) on per-token means (TRL "sigmoid_norm")
//   DPO_LOSS_ROBUST   (-(1 - eps) log sigma(z) + eps log sigma(-z)) / (1 - 2 eps), unbiased
//                     under a fraction eps of flipped labels (Chowdhury et al. 2024; TRL "robust")
//   DPO_LOSS_EXO      KL(q || p) over {chosen, rejected}: q = (sigma(z), sigma(-z)),
//                     p = (1 - eps, eps), eps > 0 (Ji et al. 2024, EXO; TRL "exo_pair")
//   DPO_LOSS_IPO      (h - 1 / (2 beta))^2
//   DPO_LOSS_HINGE    max(0, 1 - z)  (SLiC; the gradient at the kink is 0)
//   DPO_LOSS_NCA      -log sigma(beta a) - 0.5 log sigma(-beta a) - 0.5 log sigma(-beta b)
//                     (Chen et al. 2024, NCA; TRL "nca_pair")
//   DPO_LOSS_BCO      -log sigma(beta a) - log sigma(-beta b)  (binary classifier
//                     optimisation on pairs, with no running reward shift: TRL 1.12 "bco_pair")
//   DPO_LOSS_SPPO     (a - 1 / (2 beta))^2 + (b + 1 / (2 beta))^2  (SPPO with hard win
//                     probabilities, Wu et al. 2024; TRL "sppo_hard")
//   DPO_LOSS_APO_ZERO 1 - sigma(beta a) + sigma(beta b)  (anchored: chosen up, rejected down;
//                     D'Oosterlinck et al. 2024; TRL "apo_zero")
//   DPO_LOSS_APO_DOWN sigma(beta a) + 1 - sigma(z)  (both down, rejected more; TRL "apo_down")
//   DPO_LOSS_DISCOPOP -log sigma(z) (1 - m) + e^(-z) m, m = sigma(z / tau)  (a discovered
//                     blend of the logistic and exponential losses, Chris Lu et al. 2024;
//                     TRL "discopop", tau = discopop_tau)
//   DPO_LOSS_SIMPO    -(1-eps) log sigma(z - gamma) - eps log sigma(gamma - z) with no
//                     reference (the caller passes 0 and per-token means; Meng et al. 2024,
//                     TRL's CPOTrainer loss_type "simpo", eps its label_smoothing)
//   DPO_LOSS_CPO      -(1-eps) log sigma(z) - eps log sigma(-z) with no reference (the caller
//                     passes 0 and the sums; Xu et al. 2024, TRL's CPOTrainer loss_type
//                     "sigmoid"; its behaviour-cloning term is train/dpo.c's sft term)
//   DPO_LOSS_CPO_HINGE max(0, 1 - z) with no reference, over the sums (TRL's CPOTrainer
//                     loss_type "hinge")
//   DPO_LOSS_CPO_IPO  (h - 1 / (2 beta))^2 with no reference, the caller passing per-token
//                     means (TRL's CPOTrainer loss_type "ipo")
//   DPO_LOSS_ALPHAPO  SimPO's loss; dpo_pair_loss_from_sums gives it AlphaPO's rewards
//                     (Gupta et al. 2025; TRL's CPOTrainer loss_type "alphapo", which is "simpo"
//                     with cpo_alpha 0). Any CPOTrainer loss takes options->alphapo_alpha.
//   DPO_LOSS_AOT, DPO_LOSS_AOT_UNPAIRED  alignment via optimal transport (Melnyk et al. 2024;
//                     TRL "aot", "aot_unpaired"): -(1-eps) log sigma(z) - eps log sigma(-z) of
//                     a delta that sorts the log-ratios ACROSS the micro-batch
//                     (dpo_batch_loss_from_sums); for one pair alone delta = h, which is what
//                     dpo_pair_loss computes for them.
//   DPO_LOSS_ORPO     -a_c + beta (-log sigmoid(odds(a_c) - odds(a_r))), a = policy - ref with
//                     no reference (the caller passes 0 and per-token means, so a_c is the
//                     chosen response's mean log-prob and -a_c its NLL), odds(a) =
//                     a - log(1 - e^a) the log-odds of the mean probability (Hong et al. 2024,
//                     TRL's ORPOTrainer, beta its lambda)
// Returns the pair's loss; *d_chosen and *d_rejected receive d loss / d policy_chosen and
// d loss / d policy_rejected (not scaled, not accumulated).
typedef enum {
    DPO_LOSS_SIGMOID,
    DPO_LOSS_IPO,
    DPO_LOSS_HINGE,
    DPO_LOSS_SIMPO,
    DPO_LOSS_ORPO,
    DPO_LOSS_SIGMOID_NORM,
    DPO_LOSS_ROBUST,
    DPO_LOSS_EXO,
    DPO_LOSS_NCA,
    DPO_LOSS_BCO,
    DPO_LOSS_SPPO,
    DPO_LOSS_APO_ZERO,
    DPO_LOSS_APO_DOWN,
    DPO_LOSS_DISCOPOP,
    DPO_LOSS_CPO,
    DPO_LOSS_CPO_HINGE,
    DPO_LOSS_CPO_IPO,
    DPO_LOSS_ALPHAPO,
    DPO_LOSS_AOT,
    DPO_LOSS_AOT_UNPAIRED,
} DpoLossKind;
// The names dpo_loss_from_name takes (train/dpo.c), for help texts and errors.
#define DPO_LOSS_NAMES                                                                                                 \
    "sigmoid, sigmoid-norm, robust, exo, ipo, hinge, nca, bco, sppo-hard, apo-zero, apo-down, discopop, aot, "    \
    "aot-unpaired, simpo, orpo, cpo, cpo-hinge, cpo-ipo, alphapo"
// The losses of TRL's CPOTrainer (cpo, cpo-hinge, cpo-ipo, simpo, alphapo), which alone take
// its behaviour-cloning weight cpo_alpha and AlphaPO's reward shape alpha.
static inline bool dpo_loss_is_cpo_trainer(DpoLossKind kind) {
    return kind == DPO_LOSS_CPO || kind == DPO_LOSS_SIMPO || kind == DPO_LOSS_CPO_HINGE || kind == DPO_LOSS_CPO_IPO ||
           kind == DPO_LOSS_ALPHAPO;
}
// CPOTrainer's losses and ORPO (TRL's CPOTrainer and ORPOTrainer) need no reference model.
static inline bool dpo_loss_uses_reference(DpoLossKind kind) {
    return kind != DPO_LOSS_ORPO && !dpo_loss_is_cpo_trainer(kind);
}
// AOT's losses: a pair's loss depends on the micro-batch's other pairs (dpo_batch_loss_from_sums).
static inline bool dpo_loss_sorts_batch(DpoLossKind kind) {
    return kind == DPO_LOSS_AOT || kind == DPO_LOSS_AOT_UNPAIRED;
}
// Losses that compare per-token means of the log-probs rather than their sums (TRL's
// normalisations: IPO and sigmoid-norm in DPOTrainer, SimPO in CPOTrainer, ORPO).
static inline bool dpo_loss_compares_means(DpoLossKind kind) {
    return kind == DPO_LOSS_IPO || kind == DPO_LOSS_SIGMOID_NORM || kind == DPO_LOSS_SIMPO || kind == DPO_LOSS_ORPO ||
           kind == DPO_LOSS_CPO_IPO || kind == DPO_LOSS_ALPHAPO;
}
// Losses that take label_smoothing's eps (the others refuse it).
static inline bool dpo_loss_uses_label_smoothing(DpoLossKind kind) {
    return kind == DPO_LOSS_SIGMOID || kind == DPO_LOSS_ROBUST || kind == DPO_LOSS_EXO || kind == DPO_LOSS_CPO ||
           kind == DPO_LOSS_SIMPO || kind == DPO_LOSS_ALPHAPO || dpo_loss_sorts_batch(kind);
}
// The f-divergence between policy and reference that DPO regularises with (Wang et al.
// 2023, f-DPO; TRL's f_divergence_type): it replaces each log-ratio u = policy - reference
// by the score s(u) = f'(e^u) before the chosen - rejected difference:
//   F_DIVERGENCE_REVERSE_KL  s = u (DPO itself)
//   F_DIVERGENCE_FORWARD_KL  s = 1 - e^(-u)
//   F_DIVERGENCE_JS          s = log 2 + log sigma(u)  (Jensen-Shannon)
//   F_DIVERGENCE_ALPHA       s = (e^((alpha - 1) u) - 1) / (alpha - 1), (alpha - 1) u held
//                            at most 80 as TRL does; alpha within 1e-6 of 1 is reverse KL
// Only the losses of the difference alone have an f-divergence form
// (dpo_loss_takes_f_divergence).
typedef enum { F_DIVERGENCE_REVERSE_KL, F_DIVERGENCE_FORWARD_KL, F_DIVERGENCE_JS, F_DIVERGENCE_ALPHA } FDivergence;
static inline bool dpo_loss_takes_f_divergence(DpoLossKind kind) {
    return kind == DPO_LOSS_SIGMOID || kind == DPO_LOSS_SIGMOID_NORM || kind == DPO_LOSS_HINGE ||
           kind == DPO_LOSS_IPO || kind == DPO_LOSS_EXO || kind == DPO_LOSS_ROBUST || kind == DPO_LOSS_DISCOPOP;
}
// s(u) of the divergence above; *d_score receives ds/du.
double f_divergence_score(FDivergence kind, double alpha, double u, double *d_score);

// Several losses combined, each a pair's loss times its weight, summed (TRL's loss_type list
// with loss_weights; the MPO recipe is sigmoid 0.8, bco_pair 0.2, sft 1).
#define DPO_MAX_LOSS_TERMS 8

typedef struct {
    DpoLossKind loss; // the loss; with terms, the first of them (it decides the reference and the rewards)
    // term_count 0: `loss` alone, weight 1. Else the pair loss is the sum over k < term_count
    // of term_weights[k] times the loss terms[k] (SimPO and ORPO, TRL's other trainers, do
    // not combine: cli/cmd_dpo.c refuses them).
    int term_count;
    DpoLossKind terms[DPO_MAX_LOSS_TERMS];
    double term_weights[DPO_MAX_LOSS_TERMS];
    // TRL's "sft" term (train/dpo.c): plus sft_term_weight times the mean -log-prob over the
    // micro-batch's chosen response tokens (TRL's batch mean, unlike --sft-weight's per pair).
    bool sft_term;
    double sft_term_weight;
    // WPO (train/dpo.c): each pair's loss, the sft term's too, times the detached weight
    // w_chosen w_rejected, w a row's exp(mean over its tokens of log p - log sum_v p_v^2).
    bool use_weighting;
    FDivergence f_divergence; // F_DIVERGENCE_REVERSE_KL (0): plain DPO
    double f_alpha;           // F_DIVERGENCE_ALPHA's alpha
    double beta;            // the KL strength (IPO's tau, SimPO's reward scale)
    double label_smoothing; // sigmoid, robust, exo: the assumed fraction of flipped labels
    double simpo_gamma;     // SimPO only: the target reward margin
    double discopop_tau;    // DiscoPOP only: the temperature of its blend (TRL's 0.05)
    double ld_alpha;        // train/dpo.c: the weight of the longer response's tokens past the shorter one's
                            // length in both rows' sums (LD-DPO, TRL's ld_alpha); 1 (or 0 when unset): plain
    double sft_weight;      // > 0: plus this times the chosen response's mean -log-prob (RPO; train/dpo.c)
    // CPOTrainer's losses: TRL's alpha, AlphaPO's reward shape (alphapo_reward) of each row's
    // log-prob (the sum, or the per-token mean where the loss compares means); 0: the log-prob
    double alphapo_alpha;
} DpoLossOptions;
double dpo_pair_loss(const DpoLossOptions *options, double policy_chosen, double policy_rejected, double ref_chosen,
                     double ref_rejected, double *d_chosen, double *d_rejected);

// A pair's loss from its two rows' response log-prob sums (policy and reference; 0 for the
// reference where the loss has none) and response token counts, as train/dpo.c and TRL
// compute it: the f-divergence's scores of the log-ratio sums, divided by the token counts
// where the loss compares per-token means (IPO, sigmoid-norm; SimPO and ORPO, which have no
// reference), then dpo_pair_loss; with terms, their weighted sum (each term divides by the
// counts or not as it would alone). The sft term and WPO's weight are train/dpo.c's, not
// here. *d_chosen and *d_rejected receive d loss / d policy sum.
double dpo_pair_loss_from_sums(const DpoLossOptions *options, double policy_chosen, double policy_rejected,
                               double ref_chosen, double ref_rejected, int chosen_tokens, int rejected_tokens,
                               double *d_chosen, double *d_rejected);

// The micro-batch's loss over its n pairs (arrays of n; ref 0 where the loss has none): the
// sum over the pairs of dpo_pair_loss_from_sums, except that AOT's terms sort (TRL 1.12's
// DPOTrainer, within the batch it is given, as TRL sorts a device's micro-batch):
//   aot           x_i = policy_chosen_i - policy_rejected_i and y_i = ref_chosen_i -
//                 ref_rejected_i are sorted apart, ascending; delta_k = x_(k) - y_(k)
//   aot_unpaired  a_i = policy_chosen_i - ref_chosen_i and b_i = policy_rejected_i -
//                 ref_rejected_i sorted apart; delta_k = a_(k) - b_(k)
// and the k-th term is -(1-eps) log sigma(beta delta_k) - eps log sigma(-beta delta_k); its
// gradient goes to the pairs the sorts put at place k (ties: the lower index first).
// No WPO weights: TRL refuses use_weighting with AOT, whose terms belong to no one pair.
// Returns the sum; d_chosen and d_rejected receive d sum / d policy sum of each pair (set, not accumulated).
double dpo_batch_loss_from_sums(const DpoLossOptions *options, int n, const double *policy_chosen,
                                const double *policy_rejected, const double *ref_chosen, const double *ref_rejected,
                                const int *chosen_tokens, const int *rejected_tokens, double *d_chosen,
                                double *d_rejected);
// True when the loss, or any of its terms, is AOT's.
bool dpo_options_sort_batch(const DpoLossOptions *options);

// AlphaPO's reward of a log-prob x (Gupta et al. 2025; TRL CPOTrainer's alpha):
// (1 - p^(-alpha)) / alpha with p = e^x, i.e. -expm1(-alpha x) / alpha (x itself at
// alpha 0); *slope receives dr/dx = e^(-alpha x).
double alphapo_reward(double alpha, double x, double *slope);

// ---- KTO and its unpaired relatives: one example's log-ratio against a baseline ----
// With r = policy - reference (the completion's log-prob sums), per loss kind:
//   KTO_LOSS_KTO   desirable    w_D (1 - sigmoid(beta (r - z0)))
//                  undesirable  w_U (1 - sigmoid(beta (z0 - r)))
//                  z0 = `baseline`: the KL estimate (train/kto.c: the clamped mean of
//                  policy - reference over mismatched prompt/completion rows, which carries
//                  no gradient, as TRL detaches it). Ethayarajh et al. 2024; TRL's KTOTrainer,
//                  loss_type "kto".
//   KTO_LOSS_APO_ZERO_UNPAIRED
//                  desirable    w_D (1 - sigmoid(beta r))
//                  undesirable  w_U sigmoid(beta r)
//                  `baseline` is not used: KTO with z0 fixed at 0 (D'Oosterlinck et al. 2024,
//                  APO-zero, unpaired; TRL's KTOTrainer, loss_type "apo_zero_unpaired").
//   KTO_LOSS_BCO   desirable    -log sigmoid(beta r - delta)
//                  undesirable  -log sigmoid(-(beta r - delta))
//                  delta = `baseline`: the running mean of the rewards beta r seen in
//                  training (train/kto.c), a constant here. The weights are not used (TRL's
//                  BCOTrainer has none besides its density-ratio classifier's). Jung et al.
//                  2024, "Binary Classifier Optimization"; TRL's experimental BCOTrainer.
// Returns the loss; *d_logratio receives d loss / d r.
typedef enum { KTO_LOSS_KTO, KTO_LOSS_APO_ZERO_UNPAIRED, KTO_LOSS_BCO } KtoLossKind;
typedef struct {
    KtoLossKind loss;          // KTO_LOSS_KTO (0)
    double beta;               // 0.1
    double desirable_weight;   // w_D, 1
    double undesirable_weight; // w_U, 1
} KtoLossOptions;
double kto_example_loss(const KtoLossOptions *options, bool desirable, double logratio, double baseline,
                        double *d_logratio);

// -log sigmoid(x), computed without overflow.
double log_sigmoid_negated(double x);

// DeepSpeed-Chat's span for the token-span loss, from the two right-padded token rows
// (T slots each): c_end / r_end = first pad slot (or T); identical rows give
// [c_end - 1, c_end); otherwise [first differing slot, max(c_end, r_end)).
void rm_dschat_span(const int *chosen_ids, const int *rejected_ids, int T, int pad_id, int *divergence,
                    int *end);
