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
// h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected), each a sum of the
// response tokens' log-probs (for IPO and SimPO the caller passes per-token means, as TRL
// does):
//   DPO_LOSS_SIGMOID  -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)
//                     (eps = label_smoothing: DeepSpeed-Chat's / OpenRLHF's conservative
//                     DPO; eps = 0 is the DPO paper's and TRL's "sigmoid")
//   DPO_LOSS_IPO      (h - 1 / (2 beta))^2
//   DPO_LOSS_HINGE    max(0, 1 - beta h)  (SLiC; the gradient at the kink is 0)
//   DPO_LOSS_SIMPO    -log sigmoid(beta h - gamma) with no reference (the caller passes 0;
//                     Meng et al. 2024, TRL's CPOTrainer loss_type "simpo")
//   DPO_LOSS_ORPO     -a_c + beta (-log sigmoid(odds(a_c) - odds(a_r))), a = policy - ref with
//                     no reference (the caller passes 0 and per-token means, so a_c is the
//                     chosen response's mean log-prob and -a_c its NLL), odds(a) =
//                     a - log(1 - e^a) the log-odds of the mean probability (Hong et al. 2024,
//                     TRL's ORPOTrainer, beta its lambda)
// Returns the pair's loss; *d_chosen and *d_rejected receive d loss / d policy_chosen and
// d loss / d policy_rejected (not scaled, not accumulated).
typedef enum { DPO_LOSS_SIGMOID, DPO_LOSS_IPO, DPO_LOSS_HINGE, DPO_LOSS_SIMPO, DPO_LOSS_ORPO } DpoLossKind;
// SimPO and ORPO compare the policy's per-token means and need no reference model.
static inline bool dpo_loss_uses_reference(DpoLossKind kind) { return kind != DPO_LOSS_SIMPO && kind != DPO_LOSS_ORPO; }
typedef struct {
    DpoLossKind loss;
    double beta;            // the KL strength (IPO's tau, SimPO's reward scale)
    double label_smoothing; // sigmoid only: the assumed fraction of flipped labels (cDPO)
    double simpo_gamma;     // SimPO only: the target reward margin
    double sft_weight;      // > 0: plus this times the chosen response's mean -log-prob (RPO; train/dpo.c)
} DpoLossOptions;
double dpo_pair_loss(const DpoLossOptions *options, double policy_chosen, double policy_rejected, double ref_chosen,
                     double ref_rejected, double *d_chosen, double *d_rejected);

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
