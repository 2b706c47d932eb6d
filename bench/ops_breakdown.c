// Where a training step's time goes, op by op: every op of one SFT step of a model shape
// (bench/bench_shapes.h) timed alone at the step's sizes, then multiplied by how often the
// step calls it. The sum is a model of the step to set beside bench/train_step's measured
// time; the gap is what the ops' sequence costs beyond the ops (launch gaps, host syncs,
// the logits copy, the bf16 conversion of a weight AdamW did not write the copy of).
//
// usage: build/bench/ops_breakdown [--model smollm2-135m] [--batch 8] [--seq 1024]
//                                  [--device cpu|cuda] [--attention mma|mma-plain|mma-ds|wmma|unfused] [--reps 5]
// Prints one JSON line per op ({"op", "calls", "ms_per_call", "ms_per_step", "gbytes_per_s"
// or "tflops"}); on the mma attention kernels, one line per kernel with what the GPU reports
// of it ({"attention_kernel", "registers", "local_bytes", "shared_bytes", "blocks_per_sm"}),
// and on "mma" at head_dim 64 one line per kernel from a probed launch ({"attention_probe"}:
// bench/attention_probe_summary.h);
// a line with the step's time by kind of op (the kinds of
// bench/torch_gpu_train_step.py --profile-steps, which measures PyTorch's step the same way)
// and a last line with the modelled total.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_probe_summary.h"
#include "bench_shapes.h"
#include "core/timer.h"
#include "ops/ops.h"

static const OpsBackend *ops;
static int reps = 5;
static double total_ms;

// The kinds a PyTorch profile is summed by (bench/torch_gpu_train_step.py, KINDS): the
// optimizer is AdamW and the gradient norm, the loss the log-probs.
enum { KIND_ATTENTION, KIND_MATMUL, KIND_OPTIMIZER, KIND_LOSS, KIND_OTHER, KIND_COUNT };
static const char *const kind_names[KIND_COUNT] = {"attention", "matmul", "optimizer", "loss", "other"};
static double kind_ms[KIND_COUNT];

static int op_kind(const char *op) {
    if (!strncmp(op, "attention", 9)) return KIND_ATTENTION;
    if (!strncmp(op, "matmul", 6)) return KIND_MATMUL;
    if (!strncmp(op, "adamw", 5) || !strncmp(op, "sum_squares", 11)) return KIND_OPTIMIZER;
    if (!strncmp(op, "logprob", 7)) return KIND_LOSS;
    return KIND_OTHER;
}

static float *buffer(long n) {
    float *host = xmalloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) host[i] = 0.01f * (float)((i * 7919) % 201 - 100);
    float *device = ops->alloc((size_t)n * sizeof(float));
    ops->copy_to_device(device, host, (size_t)n * sizeof(float));
    free(host);
    return device;
}

// Runs `call` once to warm up, then `reps` times; reports the mean and its share of a step.
#define TIME_OP(name, calls, flops, bytes, call)                                                 \
    do {                                                                                         \
        call;                                                                                    \
        ops->synchronize();                                                                      \
        double t0_ = now_seconds();                                                              \
        for (int r_ = 0; r_ < reps; r_++) call;                                                  \
        ops->synchronize();                                                                      \
        double ms_ = (now_seconds() - t0_) * 1e3 / reps;                                         \
        total_ms += ms_ * (calls);                                                               \
        kind_ms[op_kind(name)] += ms_ * (calls);                                                 \
        printf("{\"op\": \"%s\", \"calls\": %d, \"ms_per_call\": %.4f, \"ms_per_step\": %.3f", name, \
               (int)(calls), ms_, ms_ * (calls));                                                 \
        if ((flops) > 0) printf(", \"tflops\": %.1f", (flops) / ms_ / 1e9);                       \
        if ((bytes) > 0) printf(", \"gbytes_per_s\": %.0f", (bytes) / ms_ / 1e6);                 \
        printf("}\n");                                                                           \
        fflush(stdout);                                                                          \
    } while (0)

int main(int argc, char **argv) {
    const char *name = "smollm2-135m", *device = "cpu", *attention = "mma";
    int B = 8, T = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) name = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--attention") && i + 1 < argc) attention = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else die_user("unknown argument %s (see the comment at the top of bench/ops_breakdown.c)", argv[i]);
    }
    if (B < 1 || T < 2 || reps < 1) die_user("--batch, --seq and --reps must be positive");
    ops = ops_backend_by_name(device);
    if (!ops) die_from_err();
#ifdef MARLHF_CUDA
    if (ops == &ops_cuda && !ops_cuda_select_attention(attention)) die_user("--attention: mma, mma-plain, mma-ds, wmma or unfused");
#endif
    ModelConfig cfg = bench_shape(name);
    CHECK(cfg.family != FAMILY_GPT2, "the breakdown models gated (Llama-family) layers only");
    const int L = cfg.num_layers, C = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size;
    const int H = cfg.num_heads, KV = cfg.num_kv_heads, hd = cfg.head_dim;
    const int qd = H * hd, kvd = KV * hd;
    const long N = (long)B * T;
    printf("{\"shape\": \"%s\", \"device\": \"%s\", \"batch\": %d, \"seq\": %d, \"attention\": \"%s\"}\n", name,
           ops->name, B, T, attention);

    // Four activation-sized buffers, each large enough for the largest operand (N x V logits).
    const long widest = (long)N * (V > I ? V : I);
    float *x = buffer(widest), *y = buffer(widest), *z = buffer(widest), *u = buffer(widest);
    const long largest_weight = (long)I * (C > qd ? C : qd) > (long)(qd + 2 * kvd) * C ? (long)I * (C > qd ? C : qd)
                                                                                       : (long)(qd + 2 * kvd) * C;
    float *w = buffer(largest_weight);
    float *w2 = buffer((long)V * C), *stat = buffer(N), *grad_w = buffer((long)V * C);
    int *tokens_host = xmalloc(N * sizeof(int)), *positions_host = xmalloc(N * sizeof(int));
    for (long i = 0; i < N; i++) tokens_host[i] = (int)((i * 7919) % V), positions_host[i] = (int)(i % T);
    int *tokens = ops->alloc(N * sizeof(int)), *positions = ops->alloc(N * sizeof(int));
    ops->copy_to_device(tokens, tokens_host, N * sizeof(int));
    ops->copy_to_device(positions, positions_host, N * sizeof(int));
    float *inv_freq_host = xmalloc((size_t)(hd / 2) * sizeof(float)), *inv_freq = ops->alloc((size_t)(hd / 2) * sizeof(float));
    rope_inverse_frequencies(&cfg, inv_freq_host);
    ops->copy_to_device(inv_freq, inv_freq_host, (size_t)(hd / 2) * sizeof(float));
    // Every row starts at position 0 (no padding), as bench/train_step's batches do.
    int *row_start_host = xcalloc((size_t)B, sizeof(int)), *row_start = ops->alloc((size_t)B * sizeof(int));
    ops->copy_to_device(row_start, row_start_host, (size_t)B * sizeof(int));
    free(row_start_host);
    float *q = buffer(N * qd), *k = buffer(N * kvd), *v = buffer(N * kvd), *att = buffer(N * qd);
    float *saved = buffer(ops->attention_saved_size(B, T, H, KV, hd, 0.0f, 0));
    float *dq = buffer(N * qd), *dk = buffer(N * kvd), *dv = buffer(N * kvd);

    // One layer's linear layers, forward and backward (dinp + dweight); the first writer of
    // each input gradient overwrites it, the others add (model/transformer.c), and a step of
    // one micro-batch writes every weight gradient over its unwritten tensor
    // (model/gradient_writes.c). The o and down products add the residual stream as they
    // write (matmul_forward_residual): no separate residual add. An operand
    // that the model holds (matmul_input_hold) with its bf16 copy already made, by an earlier
    // product or by the op that wrote it, is held here too, the untimed first call making the
    // copy: in the forward every product's input (the norms write q's, k's, v's, up's and
    // gate's, the attention o's, the GLU down's); in the backward the inputs of q, k, v, gate
    // and up (the norms' outputs, stored by the forward: hold_stored) and of down (act,
    // stored too), gate's and up's output gradients (the GLU's backward's), o's and down's
    // (the norms' backward), and q's and k's (the RoPE backward's). Gate's and up's outputs
    // are stored (hold_stored): their products write them as bf16 for the GLU to read; so is
    // down's input gradient, for the GLU's backward. Where the model fuses the q, k and v
    // products (model_qkv_fusion_on: the GPU), the step takes "matmul qkv" (one product of
    // the three weights side by side, its output gradient held: the RoPE backward writes its
    // copy) and the three alone are timed beside it (calls 0), and the other way round.
    const bool fused = model_qkv_fusion_on(ops);
    const int separate = fused ? 0 : L;
    struct {
        const char *name;
        int calls, in, out;
        WriteMode dinp;
        bool input_held_forward, input_held_backward, dout_held, onto_residual, output_stored, dinp_stored;
    } linear[] = {{"matmul qkv", fused ? L : 0, C, qd + 2 * kvd, WRITE_OVERWRITE, true, true, true, false, false, false},
                  {"matmul q", separate, C, qd, WRITE_OVERWRITE, true, true, true, false, false, false},
                  {"matmul k", separate, C, kvd, WRITE_ADD, true, true, true, false, false, false},
                  {"matmul v", separate, C, kvd, WRITE_ADD, true, true, false, false, false, false},
                  {"matmul o", L, qd, C, WRITE_OVERWRITE, true, false, true, true, false, false},
                  {"matmul gate", L, C, I, WRITE_OVERWRITE, true, true, true, false, true, false},
                  {"matmul up", L, C, I, WRITE_ADD, true, true, true, false, true, false},
                  {"matmul down", L, I, C, WRITE_OVERWRITE, true, true, true, true, false, true}};
    for (size_t i = 0; i < sizeof linear / sizeof linear[0]; i++) {
        char label[64];
        const long inputs = N * linear[i].in, outputs = N * linear[i].out;
        double flops = 2.0 * N * linear[i].in * linear[i].out;
        snprintf(label, sizeof label, "%s forward", linear[i].name);
        if (linear[i].input_held_forward) ops->matmul_input_hold(x, inputs);
        if (linear[i].output_stored) ops->hold_stored(y, outputs, false); // gate's and up's: bf16 outputs
        if (linear[i].onto_residual)
            TIME_OP(label, linear[i].calls, flops, 0,
                    ops->matmul_forward_residual(y, x, w, NULL, u, (int)N, linear[i].in, linear[i].out));
        else
            TIME_OP(label, linear[i].calls, flops, 0,
                    ops->matmul_forward(y, x, w, NULL, (int)N, linear[i].in, linear[i].out));
        ops->matmul_input_release();
        snprintf(label, sizeof label, "%s backward", linear[i].name);
        if (linear[i].input_held_backward) ops->matmul_input_hold(x, inputs);
        if (linear[i].dout_held) ops->matmul_input_hold(y, outputs);
        if (linear[i].dinp_stored) ops->hold_stored(z, inputs, false); // down's: bf16, for the GLU's backward
        TIME_OP(label, linear[i].calls, 2 * flops, 0,
                ops->matmul_backward(z, grad_w, NULL, y, x, w, (int)N, linear[i].in, linear[i].out, linear[i].dinp,
                                     WRITE_OVERWRITE));
        ops->matmul_input_release();
    }
    double lm_flops = 2.0 * N * C * V;
    TIME_OP("matmul lm_head forward", 1, lm_flops, 0, ops->matmul_forward(x, y, w2, NULL, (int)N, C, V));
    TIME_OP("matmul lm_head backward", 1, 2 * lm_flops, 0,
            ops->matmul_backward(z, grad_w, NULL, x, y, w2, (int)N, C, V, WRITE_ADD, WRITE_OVERWRITE));

    double att_flops = 4.0 * B * H * (double)T * T * hd / 2; // causal half, as bench_shapes.h
    // The attention's output, the norms' outputs (the final norm's aside) and the norms'
    // input gradients are held products' operands in the model: their copies are written too.
    // The model's forward rotates q and k inside the attention (attention_forward_rotary: the
    // GPU as it gathers them); "attention forward", on q and k already rotated, and "rope
    // forward q+k" are the two ops the step ran instead before 2026-12-05 (not counted in it).
    // Its backward is still the attention's and then the RoPE backward's (counted as two).
    ops->matmul_input_hold(att, N * qd);
    TIME_OP("attention forward (rotary)", L, att_flops, 0,
            ops->attention_forward_rotary(att, saved, q, k, v, qd, kvd, row_start, positions, inv_freq, B, T, H, KV,
                                          hd, 0.0f, 0));
    TIME_OP("attention forward", 0, att_flops, 0,
            ops->attention_forward(att, saved, q, k, v, row_start, B, T, H, KV, hd, 0.0f, 0));
    ops->matmul_input_release();
    TIME_OP("attention backward", L, 2 * att_flops, 0,
            ops->attention_backward(dq, dk, dv, att, att, saved, q, k, v, row_start, B, T, H, KV, hd, 0.0f, 0));
#ifdef MARLHF_CUDA
    // The mma backward's two kernels alone (each with the dO gather before them), to see
    // which one the time goes to: not part of the step (calls 0), their gradients partial.
    if (ops == &ops_cuda && !strncmp(attention, "mma", 3)) {
        ops_cuda_attention_backward_parts(true, false);
        TIME_OP("attention backward part: dK/dV kernel", 0, 0, 0,
                ops->attention_backward(dq, dk, dv, att, att, saved, q, k, v, row_start, B, T, H, KV, hd, 0.0f, 0));
        ops_cuda_attention_backward_parts(false, true);
        TIME_OP("attention backward part: dQ kernel", 0, 0, 0,
                ops->attention_backward(dq, dk, dv, att, att, saved, q, k, v, row_start, B, T, H, KV, hd, 0.0f, 0));
        ops_cuda_attention_backward_parts(false, false);
        TIME_OP("attention backward part: neither kernel", 0, 0, 0,
                ops->attention_backward(dq, dk, dv, att, att, saved, q, k, v, row_start, B, T, H, KV, hd, 0.0f, 0));
        ops_cuda_attention_backward_parts(true, true);
        // The whole backward with dQ after dK/dV on one stream, against "attention backward"
        // (dQ beside dK/dV on a second stream): what the overlap gives.
        ops_cuda_attention_backward_overlap(false);
        TIME_OP("attention backward part: whole, dQ after dK/dV on one stream", 0, 0, 0,
                ops->attention_backward(dq, dk, dv, att, att, saved, q, k, v, row_start, B, T, H, KV, hd, 0.0f, 0));
        ops_cuda_attention_backward_overlap(true);
        // And what each of the variant's kernels takes of an SM, as the GPU reports it: how
        // many blocks share one is what hides their latencies.
        // (Not under the CPU emulation, tests/cli/gpu_bench_emulated.sh: no registers, no clocks.)
        OpsAttentionKernelFacts facts[4];
        const int count = ops_cuda_is_emulated() ? 0 : ops_cuda_attention_kernel_facts(attention, hd, facts, 4);
        if (count < 0) die_user("%s", err_msg());
        for (int i = 0; i < count; i++)
            printf("{\"attention_kernel\": \"%s\", \"attention\": \"%s\", \"head_dim\": %d, \"registers\": %d, "
                   "\"local_bytes\": %d, \"shared_bytes\": %d, \"blocks_per_sm\": %d}\n",
                   facts[i].kernel, attention, hd, facts[i].registers, facts[i].local_bytes, facts[i].shared_bytes,
                   facts[i].blocks_per_sm);
        // One probed launch of each kernel (TUNED at head_dim 64 only): where a block's time
        // goes and how the blocks fill the SMs (bench/attention_probe_summary.h).
        if (!strcmp(attention, "mma") && hd == 64 && !ops_cuda_is_emulated()) {
            const char *probed[3] = {"forward", "dK/dV", "dQ"};
            for (int i = 0; i < 3; i++) {
                if (ops_cuda_attention_probe_begin(probed[i]) != 0) die_user("%s", err_msg());
                if (i == 0) ops->attention_forward(att, saved, q, k, v, row_start, B, T, H, KV, hd, 0.0f, 0);
                else ops->attention_backward(dq, dk, dv, att, att, saved, q, k, v, row_start, B, T, H, KV, hd, 0.0f, 0);
                OpsAttentionProbeRecord *records;
                int grid_x, grid_y;
                const long record_count = ops_cuda_attention_probe_end(&records, &grid_x, &grid_y);
                if (record_count < 0) die_user("%s", err_msg());
                const AttentionProbeSummary summary = summarize_attention_probe(records, record_count);
                print_attention_probe_summary(probed[i], attention, hd, &summary);
                free(records);
            }
        }
    }
#endif
    TIME_OP("rope forward q+k", 0, 0, 8.0 * N * (qd + kvd),
            (ops->rope_forward(q, positions, (int)N, H, hd, inv_freq),
             ops->rope_forward(k, positions, (int)N, KV, hd, inv_freq)));
    ops->matmul_input_hold(dq, N * qd); // q's and k's output gradients: their copies written too
    ops->matmul_input_hold(dk, N * kvd);
    TIME_OP("rope backward q+k", L, 0, 8.0 * N * (qd + kvd),
            (ops->rope_backward(dq, positions, (int)N, H, hd, inv_freq),
             ops->rope_backward(dk, positions, (int)N, KV, hd, inv_freq)));
    ops->matmul_input_release();
    // A layer's two norms write their outputs stored (hold_stored: the bf16 copy only),
    // the final norm's as floats with a copy.
    ops->hold_stored(y, N * C, false);
    TIME_OP("rmsnorm forward (stored)", 2 * L, 0, 6.0 * N * C,
            ops->rmsnorm_forward(y, stat, x, w, (int)N, C, 1e-5f, false));
    ops->matmul_input_release();
    ops->matmul_input_hold(y, N * C);
    TIME_OP("rmsnorm forward (final)", 1, 0, 10.0 * N * C, ops->rmsnorm_forward(y, stat, x, w, (int)N, C, 1e-5f, false));
    ops->matmul_input_release();
    ops->matmul_input_hold(z, N * C);
    TIME_OP("rmsnorm backward", 2 * L + 1, 0, 16.0 * N * C,
            ops->rmsnorm_backward(z, grad_w, y, x, w, stat, (int)N, C, false));
    ops->matmul_input_release();
    // The GLU's output and input gradients are stored products' inputs in the model
    // (hold_stored): written as their bf16 copies only; the backward leaves the
    // forward's output where the forward stored it (down's weight gradient reads it there).
    // Its inputs, gate's and up's outputs, are stored too: bf16, written by their products.
    ops->hold_stored(z, N * I, false);
    ops->hold_stored(x, N * I, true);
    ops->hold_stored(y, N * I, true);
    TIME_OP("glu forward (stored)", L, 0, 6.0 * N * I, ops->glu_forward(z, x, y, N * I, false));
    ops->matmul_input_release();
    float *act = buffer(N * I), *d_act = buffer(N * I);
    ops->hold_stored(z, N * I, false);
    ops->hold_stored(u, N * I, false);
    ops->hold_stored(x, N * I, true);
    ops->hold_stored(y, N * I, true);
    ops->hold_stored(act, N * I, true); // the forward's output: this backward neither reads nor writes it
    ops->hold_stored(d_act, N * I, true); // down's input gradient, stored by its product
    TIME_OP("glu backward (stored)", L, 0, 10.0 * N * I, ops->glu_backward(z, u, d_act, x, y, act, N * I, false));
    ops->matmul_input_release();
    TIME_OP("embedding forward", 1, 0, 8.0 * N * C, ops->embedding_forward(y, tokens, positions, w2, NULL, (int)N, C, 1.0f));
    TIME_OP("embedding backward", 1, 0, 8.0 * N * C,
            ops->embedding_backward(grad_w, NULL, y, tokens, positions, (int)N, C, 1.0f));
    // The forward reads the logits once (cuda/logprob_rows.cuh); the backward reads and writes them.
    TIME_OP("logprob forward", 1, 0, 4.0 * N * V, ops->logprob_forward(stat, z, NULL, NULL, x, tokens, (int)N, V));
    TIME_OP("logprob backward", 1, 0, 8.0 * N * V, ops->logprob_backward(x, stat, NULL, tokens, z, (int)N, V, 0.0f));
    // The optimizer over every parameter: AdamW and the gradient norm.
    Model model;
    model_init(&model, &cfg, ops, true, false);
    long P = model.table.total;
    model_free(&model);
    float *params = buffer(P), *grads = buffer(P), *m = buffer(P), *vv = buffer(P);
    TIME_OP("adamw", 1, 0, 28.0 * P,
            ops->adamw_update(params, grads, m, vv, P, 1e-5f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.1f, 0.05f, 1.0f));
    TIME_OP("sum_squares (grad norm)", 1, 0, 4.0 * P, (void)ops->sum_squares(grads, P));
    // No zero-fill of the gradients: model_zero_grad marks them unwritten.
    printf("{\"kinds_ms_per_step\": {");
    for (int kind = 0; kind < KIND_COUNT; kind++)
        printf("%s\"%s\": %.3f", kind ? ", " : "", kind_names[kind], kind_ms[kind]);
    printf("}}\n");
    printf("{\"modelled_step_ms\": %.2f, \"note\": \"sum of the ops above; compare bench/train_step step_ms\"}\n", total_ms);
    return 0;
}
