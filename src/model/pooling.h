// Text embeddings from a language model (marlhf serve's /v1/embeddings): a text's tokens
// run through the body and the final norm (model_forward; no LM head), the final hidden
// states of its tokens are pooled into one vector of hidden_size floats, and the vector is
// L2-normalised (unit length) — what llama.cpp's server returns by default (its
// embd_normalize 2, Euclidean) and what sentence-transformers' Pooling + Normalize compute.
// A zero vector stays zero.
//
// The poolings, by llama.cpp's names:
//   mean  the average over the text's tokens (sentence-transformers' default)
//   last  the last token's state: the only one a causal model computes after reading the
//         whole text (the pooling of decoder embedding models: e5-mistral, Qwen3-Embedding)
//   cls   the first token's state (encoders' [CLS]); in a causal model it has seen only
//         the first token, so every text that starts with the same token (a BOS) gets
//         the same vector
//   none  no pooling: one vector per token, the final hidden states as they are (not
//         normalised, as llama.cpp's server returns them with --pooling none):
//         token_embeddings below
#pragma once
#include "model/model.h"

typedef enum { POOLING_MEAN, POOLING_LAST, POOLING_CLS, POOLING_NONE } Pooling;

// "mean", "last", "cls" or "none". Returns 0, or -1 with err_set() naming `option` (e.g. "--pooling").
int pooling_parse(const char *name, const char *option, Pooling *out);
const char *pooling_name(Pooling pooling);

// One forward pass of `count` rows (rows[i]: lengths[i] >= 1 token ids, within the
// vocabulary and the model's context), right-padded to the longest: the causal mask keeps
// the padding out of every real token, so a row gets the vector it gets alone, up to
// float rounding. Writes row i's normalised embedding to out[i * hidden_size ...].
// pooling: mean, last or cls.
void pooled_embeddings(Model *model, const int *const *rows, const int *lengths, int count, Pooling pooling,
                       float *out);

// The same forward without pooling: row b's final hidden states, one vector of hidden_size
// floats per token, unnormalised, rows one after another (row b's first token's vector at
// out[(lengths[0] + ... + lengths[b - 1]) * hidden_size]).
void token_embeddings(Model *model, const int *const *rows, const int *lengths, int count, float *out);
