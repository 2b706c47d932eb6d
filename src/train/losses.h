// The losses of SFT and reward modelling, as pure functions from model outputs to a loss
// value and its gradient with respect to those outputs. The trainers feed the gradients
// to model_backward() as per-token weights (dlogp or dvalue).
//
// All gradients are ACCUMULATED (+=) into the given arrays, scaled by `scale`, so a
// trainer can sum several micro-batches into one optimizer step with scale = 1/total.
#pragma once

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

// -log sigmoid(x), computed without overflow.
double log_sigmoid_negated(double x);

// DeepSpeed-Chat's span for the token-span loss, from the two right-padded token rows
// (T slots each): c_end / r_end = first pad slot (or T); identical rows give
// [c_end - 1, c_end); otherwise [first differing slot, max(c_end, r_end)).
void rm_dschat_span(const int *chosen_ids, const int *rejected_ids, int T, int pad_id, int *divergence,
                    int *end);
