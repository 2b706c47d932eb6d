// The CPU's hold_stored (ops.h) and the check of what it promises.
//
// A GPU keeps a stored buffer as the bf16 values its readers read, in the buffer's own
// memory, and never writes its floats; the CPU's ops read floats, so here a store is
// nothing. But the model's side of the promise (products and activations are a stored
// buffer's only readers, from the op that writes it until it is next written without a
// store) would then only be checked on a GPU. With MARLHF_CHECK_STORED_INPUTS=1
// (tests/run.sh sets it) the CPU plays the GPU's part with floats: at the first of those
// readers after the writer (or at the release, if none came), the values move to a copy
// of their own, which those readers read from then on, the forward's until its
// backward's, and the buffer is filled with NaN. Any other op that reads the buffer
// meanwhile turns its results into NaN, which the tests see. (A reader between the writer
// and the first product or activation still sees the values: in the model they follow
// the writer directly.) Not thread-safe, like the GPU's held table: one model trains at a
// time.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "ops/cpu/ops_cpu.h"

typedef struct {
    const float *buffer; // the model's buffer (its address is the key)
    long count;
    float *values; // the moved values, which the products and activations read
    bool active;   // stored since the last release
    bool pending;  // written under the current store, not yet moved
} StoredInput;

static StoredInput *stored;
static int stored_count, stored_capacity;

// The buffers held since the last release (matmul_input_hold and hold_stored), counted as
// the GPU counts them: its table has OPS_HELD_INPUTS_MAX entries, one per buffer.
static const float *held[OPS_HELD_INPUTS_MAX];
static int held_count;

// MARLHF_CHECK_STORED_INPUTS: 1 on; unset, empty or 0 off; anything else a user error.
static bool checking_stores(void) {
    static int checking = -1;
    if (checking < 0 && (checking = env_switch("MARLHF_CHECK_STORED_INPUTS")) < 0) die_from_err();
    return checking;
}

static StoredInput *find_stored(const float *buffer) {
    for (int i = 0; i < stored_count; i++)
        if (stored[i].buffer == buffer) return &stored[i];
    return NULL;
}

// The buffer's values into the entry's copy, NaN into the buffer.
static void move_aside(StoredInput *entry) {
    float *buffer = (float *)entry->buffer;
    memcpy(entry->values, buffer, (size_t)entry->count * sizeof(float));
    for (long i = 0; i < entry->count; i++) buffer[i] = NAN;
    entry->pending = false;
}

static void count_hold(const float *buffer) {
    for (int i = 0; i < held_count; i++)
        if (held[i] == buffer) return; // held again: the same entry
    CHECK(held_count < OPS_HELD_INPUTS_MAX, "more than %d matmul inputs held at once (matmul_input_hold, hold_stored)",
          (int)OPS_HELD_INPUTS_MAX);
    held[held_count++] = buffer;
}

void cpu_matmul_input_hold(const float *inp, long n) {
    (void)n;
    if (checking_stores()) count_hold(inp);
}

// Whether x is stored now (held as stored since the last release).
static bool stored_now(const float *x) {
    if (!x || !checking_stores()) return false;
    const StoredInput *entry = find_stored(x);
    return entry && entry->active;
}

void cpu_hold_stored(const float *inp, long n, bool written) {
    if (!checking_stores()) return;
    count_hold(inp);
    StoredInput *entry = find_stored(inp);
    if (written) {
        // The forward's store must have been moved aside (at its first product, or at the
        // release that ended it) and not stored again since.
        CHECK(entry && !entry->pending && entry->count == n,
              "a buffer held as stored and written (hold_stored) that no store wrote");
        entry->active = true;
        return;
    }
    if (!entry) {
        if (stored_count == stored_capacity) {
            stored_capacity = stored_capacity ? 2 * stored_capacity : 16;
            stored = xrealloc(stored, (size_t)stored_capacity * sizeof *stored);
        }
        entry = &stored[stored_count++];
        *entry = (StoredInput){.buffer = inp};
    }
    if (entry->count != n) {
        free(entry->values);
        entry->values = xmalloc((size_t)n * sizeof(float));
        entry->count = n;
    }
    entry->active = true, entry->pending = true;
}

// The CPU's ops read and write a stored buffer's floats: it needs all of them.
long cpu_stored_buffer_floats(long n) { return n; }

void cpu_matmul_input_release(void) {
    if (!checking_stores()) return;
    held_count = 0;
    for (int i = 0; i < stored_count; i++) {
        if (stored[i].active && stored[i].pending) move_aside(&stored[i]);
        stored[i].active = false;
    }
}

bool cpu_stored_pending(const float *buffer, long n) {
    if (!buffer || !checking_stores()) return false;
    StoredInput *entry = find_stored(buffer);
    return entry && entry->active && entry->pending && entry->count == n;
}

const float *cpu_stored_input(const float *x, long n) {
    if (!x || !checking_stores()) return x;
    StoredInput *entry = find_stored(x);
    if (!entry || !entry->active) return x;
    CHECK(entry->count == n, "a stored buffer read as %ld floats; it was stored as %ld", n, entry->count);
    if (entry->pending) move_aside(entry);
    return entry->values;
}

// The products of the CPU's function table, reading their inputs through cpu_stored_input.
// Each refuses what the GPU refuses (ops/cuda/matmul.cu): a stored output written but by
// a bias-less matmul_forward or a matmul_backward overwriting its dinp (the others write
// floats, or add to floats a stored buffer does not have), and a bias gradient of a
// stored dout (it sums dout's floats).
void cpu_stored_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC,
                               int OC) {
    CHECK(!(bias && stored_now(out)), "a stored matmul output (hold_stored) with a bias");
    cpu_matmul_forward(out, cpu_stored_input(inp, (long)N * IC), weight, bias, N, IC, OC);
}

void cpu_stored_matmul_accumulate(float *out, const float *inp, const float *weight, int N, int IC, int OC) {
    CHECK(!stored_now(out), "matmul_accumulate into a stored buffer (hold_stored)");
    cpu_matmul_accumulate(out, cpu_stored_input(inp, (long)N * IC), weight, N, IC, OC);
}

void cpu_stored_matmul_forward_residual(float *out, const float *inp, const float *weight, const float *bias,
                                        const float *residual, int N, int IC, int OC) {
    CHECK(!stored_now(out), "matmul_forward_residual into a stored buffer (hold_stored)");
    cpu_matmul_forward_residual(out, cpu_stored_input(inp, (long)N * IC), weight, bias, residual, N, IC, OC);
}

// (The GPU's decode kernel, for a few rows, reads floats: it refuses a stored input.)
void cpu_stored_matmul_forward_dequantized(float *out, const float *inp, const Q8Matrix *weight, const float *bias,
                                           int N, int IC, int OC) {
    CHECK(!stored_now(out) && !stored_now(inp), "a quantized product with a stored input or output (hold_stored)");
    cpu_matmul_forward_dequantized(out, inp, weight, bias, N, IC, OC);
}

// The activations of the table, reading a stored gate, up, input or output gradient (a
// product's output that only they read) through cpu_stored_input.
void cpu_stored_gelu_forward(float *out, const float *inp, long n) { cpu_gelu_forward(out, cpu_stored_input(inp, n), n); }

void cpu_stored_gelu_backward(float *dinp, const float *dout, const float *inp, const float *act, long n) {
    cpu_gelu_backward(dinp, cpu_stored_input(dout, n), cpu_stored_input(inp, n), act, n);
}

void cpu_stored_glu_forward(float *out, const float *gate, const float *up, long n, bool gelu) {
    cpu_glu_forward(out, cpu_stored_input(gate, n), cpu_stored_input(up, n), n, gelu);
}

void cpu_stored_glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                             const float *act, long n, bool gelu) {
    cpu_glu_backward(dgate, dup, cpu_stored_input(dout, n), cpu_stored_input(gate, n), cpu_stored_input(up, n), act, n,
                     gelu);
}

void cpu_stored_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                const float *weight, int N, int IC, int OC, WriteMode dinp_mode,
                                WriteMode weight_mode) {
    CHECK(!(dinp && stored_now(dinp) && dinp_mode == WRITE_ADD), "a stored input gradient (hold_stored) added to");
    CHECK(!(dbias && stored_now(dout)), "a bias gradient of a stored output gradient (hold_stored)");
    cpu_matmul_backward(dinp, dweight, dbias, cpu_stored_input(dout, (long)N * OC), cpu_stored_input(inp, (long)N * IC),
                        weight, N, IC, OC, dinp_mode, weight_mode);
}
