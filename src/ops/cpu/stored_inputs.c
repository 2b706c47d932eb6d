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

void cpu_hold_stored(const float *inp, long n, bool written) {
    if (!checking_stores()) return;
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

void cpu_matmul_input_release(void) {
    if (!checking_stores()) return;
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
void cpu_stored_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC,
                               int OC) {
    cpu_matmul_forward(out, cpu_stored_input(inp, (long)N * IC), weight, bias, N, IC, OC);
}

void cpu_stored_matmul_accumulate(float *out, const float *inp, const float *weight, int N, int IC, int OC) {
    cpu_matmul_accumulate(out, cpu_stored_input(inp, (long)N * IC), weight, N, IC, OC);
}

void cpu_stored_matmul_forward_residual(float *out, const float *inp, const float *weight, const float *bias,
                                        const float *residual, int N, int IC, int OC) {
    cpu_matmul_forward_residual(out, cpu_stored_input(inp, (long)N * IC), weight, bias, residual, N, IC, OC);
}

void cpu_stored_matmul_forward_dequantized(float *out, const float *inp, const Q8Matrix *weight, const float *bias,
                                           int N, int IC, int OC) {
    cpu_matmul_forward_dequantized(out, cpu_stored_input(inp, (long)N * IC), weight, bias, N, IC, OC);
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
    cpu_matmul_backward(dinp, dweight, dbias, cpu_stored_input(dout, (long)N * OC), cpu_stored_input(inp, (long)N * IC),
                        weight, N, IC, OC, dinp_mode, weight_mode);
}
