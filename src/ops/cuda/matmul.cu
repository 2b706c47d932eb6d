// Linear layers through cuBLASLt: bf16 operands, fp32 accumulation and fp32 outputs; a
// decode step's forward products (a few rows) through matvec_bf16.cuh instead, the same
// operands without cuBLASLt's host cost.
//
// The fp32 master weights are converted to bf16 once and cached by address; the cache
// entry goes stale when anything writes the fp32 weights through the backend (AdamW, a
// copy from the host, the EMA), so a weight is converted once per optimizer step and not
// at all during generation. Activations are converted on every call into scratch, but for
// the held input (matmul_input_hold), converted once for all the products that read it.
//
// Row-major X[r, c] is column-major X^T, so each product below is written for cuBLAS's
// column-major convention on the transposed matrices.
#include <climits>
#include <map>
#include <tuple>
#include <vector>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/matvec_bf16.cuh"

// ---------------------------------------------------------------------------------------
// bf16 weight cache

struct CachedWeight {
    const float *fp32;
    long n;
    __nv_bfloat16 *bf16;
    bool valid;
};
static std::vector<CachedWeight> weight_cache;

static bool overlaps(const CachedWeight &w, const void *ptr, size_t bytes) {
    const char *start = (const char *)w.fp32, *end = start + w.n * sizeof(float);
    const char *other = (const char *)ptr;
    return start < other + bytes && other < end;
}

void cuda_weight_cache_mark_stale(const void *ptr, size_t bytes) {
    for (CachedWeight &w : weight_cache)
        if (w.valid && overlaps(w, ptr, bytes)) w.valid = false;
}

void cuda_weight_cache_release(const void *ptr, size_t bytes) {
    for (size_t i = 0; i < weight_cache.size();) {
        if (overlaps(weight_cache[i], ptr, bytes)) {
            cuda_device_free(weight_cache[i].bf16);
            weight_cache[i] = weight_cache.back();
            weight_cache.pop_back();
        } else {
            i++;
        }
    }
}

// Whether w's copy covers [weight, weight + n): a copy of exactly that range, or of a larger
// one around it (the fused q/k/v product's copy of three weights side by side, which also
// serves each weight's own products: a decode step's, an adapter's merge).
static bool covers(const CachedWeight &w, const float *weight, long n) {
    return w.fp32 <= weight && weight + n <= w.fp32 + w.n;
}

__nv_bfloat16 *cuda_weight_cache_claim(const float *weight, long n) {
    // The copy the caller's kernel writes: one of exactly this range, which becomes valid
    // with it (once that kernel, queued before any reader, has run), or a valid one of a
    // larger range, which stays valid (the rest of it still matches its weights). A stale
    // copy of a larger range is not claimed: the rest of it may not match; it is converted
    // whole at its next use. Every other copy touching the range goes stale.
    CachedWeight *claimed = NULL;
    for (CachedWeight &w : weight_cache) {
        const bool exact = w.fp32 == weight && w.n == n;
        if (!claimed && (exact || (w.valid && covers(w, weight, n)))) claimed = &w;
        else if (w.valid && overlaps(w, weight, (size_t)n * sizeof(float))) w.valid = false;
    }
    if (!claimed) return NULL;
    claimed->valid = true;
    return claimed->bf16 + (weight - claimed->fp32);
}

const __nv_bfloat16 *cuda_weight_bf16(const float *weight, long n) {
    CachedWeight *entry = NULL;
    for (CachedWeight &w : weight_cache)
        if (!entry && covers(w, weight, n)) entry = &w;
    if (!entry) {
        // The copies touching the new range go: it serves the products of those inside it
        // (one copy of each weight, not a fused product's and its parts').
        cuda_weight_cache_release(weight, (size_t)n * sizeof(float));
        CachedWeight fresh = {weight, n, NULL, false};
        fresh.bf16 = (__nv_bfloat16 *)cuda_device_alloc((size_t)n * sizeof(__nv_bfloat16), "a weight's bf16 copy");
        weight_cache.push_back(fresh);
        entry = &weight_cache.back();
    }
    if (!entry->valid) {
        cuda_to_bf16(entry->bf16, entry->fp32, entry->n);
        entry->valid = true;
    }
    return entry->bf16 + (weight - entry->fp32);
}

// ---------------------------------------------------------------------------------------
// cuBLASLt plans, one per problem shape and operand alignment

static int alignment_of(const void *ptr) {
    uintptr_t address = (uintptr_t)ptr;
    int alignment = 256;
    while (alignment > 4 && address % alignment) alignment /= 2;
    return alignment;
}

struct GemmPlan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};

typedef std::tuple<int, int, int, int, int, int, int, int, int, long long, long long, long long,
                   int, int, int, int, int>
    GemmKey;
static std::map<GemmKey, GemmPlan> gemm_plans;

static cublasLtMatrixLayout_t make_layout(cudaDataType type, int rows, int cols, int ld, int batch,
                                          long long stride) {
    cublasLtMatrixLayout_t layout;
    CUBLAS_CHECK(cublaslt.MatrixLayoutCreate(&layout, type, rows, cols, ld));
    if (batch > 1) {
        CUBLAS_CHECK(cublaslt.MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &batch, sizeof batch));
        CUBLAS_CHECK(cublaslt.MatrixLayoutSetAttribute(
            layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
    return layout;
}

// D = alpha * op(A) op(B) + beta * C, C laid out as D: C == D (in place, every caller but
// one) or another buffer (out of place: cuBLASLt reads C and writes D). C and D are fp32, or
// both bf16 (`d_type` CUDA_R_16BF: a stored product output, hold_stored) rounded from the
// fp32 accumulators.
static void gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const __nv_bfloat16 *A, int lda,
                      const __nv_bfloat16 *B, int ldb, float beta, const void *C, void *D, int ldd, int batch,
                      long long stride_a, long long stride_b, long long stride_d, cudaDataType d_type = CUDA_R_32F) {
    if (m == 0 || n == 0) return;
    int align_a = alignment_of(A), align_b = alignment_of(B), align_c = alignment_of(C), align_d = alignment_of(D);
    GemmKey key{trans_a, trans_b, m, n, k, lda, ldb, ldd, batch, stride_a, stride_b, stride_d,
                align_a, align_b, align_c, align_d, (int)d_type};
    auto found = gemm_plans.find(key);
    if (found == gemm_plans.end()) {
        GemmPlan plan;
        CUBLAS_CHECK(cublaslt.MatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        CUBLAS_CHECK(cublaslt.MatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                    sizeof op_a));
        CUBLAS_CHECK(cublaslt.MatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                    sizeof op_b));
        // Stored shapes: A is (m x k) after op, so stored (k x m) when transposed.
        plan.a = make_layout(CUDA_R_16BF, trans_a ? k : m, trans_a ? m : k, lda, batch, stride_a);
        plan.b = make_layout(CUDA_R_16BF, trans_b ? n : k, trans_b ? k : n, ldb, batch, stride_b);
        plan.d = make_layout(d_type, m, n, ldd, batch, stride_d);

        cublasLtMatmulPreference_t preference;
        CUBLAS_CHECK(cublaslt.MatmulPreferenceCreate(&preference));
        size_t workspace_bytes;
        cuda_blaslt_workspace(&workspace_bytes);
        CUBLAS_CHECK(cublaslt.MatmulPreferenceSetAttribute(
            preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
            sizeof workspace_bytes));
        uint32_t alignments[3] = {(uint32_t)align_a, (uint32_t)align_b, (uint32_t)align_d};
        cublasLtMatmulPreferenceAttributes_t names[3] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 3; i++)
            CUBLAS_CHECK(cublaslt.MatmulPreferenceSetAttribute(preference, names[i], &alignments[i],
                                                              sizeof alignments[i]));
        const uint32_t alignment_c = (uint32_t)align_c;
        CUBLAS_CHECK(cublaslt.MatmulPreferenceSetAttribute(
            preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alignment_c, sizeof alignment_c));
        cublasLtMatmulHeuristicResult_t result;
        int returned = 0;
        CUBLAS_CHECK(cublaslt.MatmulAlgoGetHeuristic(cuda_blaslt(), plan.desc, plan.a, plan.b,
                                                    plan.d, plan.d, preference, 1, &result,
                                                    &returned));
        CHECK(returned > 0, "cuBLASLt has no bf16 algorithm for %s%s m=%d n=%d k=%d batch=%d",
              trans_a ? "T" : "N", trans_b ? "T" : "N", m, n, k, batch);
        plan.algo = result.algo;
        CUBLAS_CHECK(cublaslt.MatmulPreferenceDestroy(preference));
        found = gemm_plans.emplace(key, plan).first;
    }
    const GemmPlan &plan = found->second;
    size_t workspace_bytes;
    void *workspace = cuda_blaslt_workspace(&workspace_bytes);
    CUBLAS_CHECK(cublaslt.Matmul(cuda_blaslt(), plan.desc, &alpha, A, plan.a, B, plan.b, &beta, C,
                                plan.d, D, plan.d, &plan.algo, workspace, workspace_bytes, 0));
}

void cuda_gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B, int ldb, float beta,
                    float *D, int ldd, int batch, long long stride_a, long long stride_b,
                    long long stride_d) {
    gemm_bf16(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, D, D, ldd, batch, stride_a, stride_b, stride_d);
}

// ---------------------------------------------------------------------------------------
// The backend's linear layer

__global__ static void add_bias_kernel(float *out, const float *bias, long N, int OC) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N * OC) out[i] += bias[i % OC];
}

// The held inputs (ops.h, matmul_input_hold): each one's bf16 copy in a scratch slot of its
// own, made by the op that writes the input during the hold (activations, norms, the fused
// attention forward, the RoPE backward, through cuda_held_copy_to_write) or else by the first
// product that reads it, and read by the others until the release. A hold starts without a copy, so holding a buffer again (the
// next layer's rows in a shared buffer) copies its new contents.
// A stored input (hold_stored) keeps its copy in its own memory instead of a
// scratch slot, and no floats: the first half of the buffer is the bf16 copy, written by
// the op that produces it (cuda_held_output) and kept there from a forward to its
// backward, whose products read it again without a conversion (held with `written`).
enum { MATMUL_HELD_INPUTS = SCRATCH_MATMUL_HELD_LAST - SCRATCH_MATMUL_HELD + 1 };
struct HeldInput {
    const float *input; // NULL: a free entry
    long count;
    bool copied; // the copy is made (for a stored input: its producer has written it)
    bool stored;
};
static HeldInput held_inputs[MATMUL_HELD_INPUTS];

// MARLHF_CUDA_STORED_INPUTS=0 (ops_cuda_open) turns stores into plain holds: the floats are
// written as before, the copies go to scratch slots. For measuring the one against the other.
static bool stores_enabled = true;

extern "C" void ops_cuda_enable_stored_inputs(bool enabled) { stores_enabled = enabled; }

static void hold_entry(const float *inp, long n, bool copied, bool stored) {
    HeldInput *entry = NULL;
    for (HeldInput &h : held_inputs)
        if (h.input == inp) entry = &h; // held again: new contents
    for (HeldInput &h : held_inputs)
        if (!entry && !h.input) entry = &h;
    CHECK(entry, "more than %d matmul inputs held at once (matmul_input_hold)", (int)MATMUL_HELD_INPUTS);
    *entry = HeldInput{inp, n, copied, stored};
}

void cuda_matmul_input_hold(const float *inp, long n) { hold_entry(inp, n, false, false); }

long cuda_stored_buffer_floats(long n) {
    if (!stores_enabled) return n;
    const long bf16_per_float = sizeof(float) / sizeof(__nv_bfloat16), floats_per_16_bytes = 16 / sizeof(float);
    const long floats = (n + bf16_per_float - 1) / bf16_per_float;
    return (floats + floats_per_16_bytes - 1) / floats_per_16_bytes * floats_per_16_bytes;
}

void cuda_hold_stored(const float *inp, long n, bool written) {
    // A buffer sized for its bf16 values (stored_buffer_floats) held with stores turned off
    // would be written as floats past its end.
    const size_t allocated = cuda_allocation_size(inp);
    CHECK(allocated == 0 || allocated >= (size_t)cuda_stored_buffer_floats(n) * sizeof(float),
          "a stored buffer (hold_stored) of %zu bytes is too small for %ld values (MARLHF_CUDA_STORED_INPUTS changed "
          "after the model sized its buffers?)", allocated, n);
    // A plain hold of a stored-and-written input would read the floats the store never wrote.
    if (stores_enabled) hold_entry(inp, n, written, true);
    else hold_entry(inp, n, false, false);
}

void cuda_matmul_input_release(void) {
    for (HeldInput &h : held_inputs) h = HeldInput{NULL, 0, false, false};
}

// The held entry of x (n floats), or NULL (also for x NULL).
static HeldInput *held_entry(const float *x, long n) {
    for (HeldInput &h : held_inputs)
        if (x && h.input == x && h.count == n) return &h;
    return NULL;
}

// Where an entry's bf16 copy lives: a stored buffer's own memory, else its scratch slot
// (allocated or grown here, so only asked for by a caller that writes or reads the copy).
static __nv_bfloat16 *copy_of(const HeldInput *entry) {
    if (entry->stored) return (__nv_bfloat16 *)entry->input;
    const int slot = SCRATCH_MATMUL_HELD + (int)(entry - held_inputs);
    return (__nv_bfloat16 *)cuda_scratch(slot, (size_t)entry->count * sizeof(__nv_bfloat16));
}

// x's entry when x is held as stored, else NULL.
static HeldInput *stored_entry(const float *x, long n) {
    HeldInput *entry = held_entry(x, n);
    return entry && entry->stored ? entry : NULL;
}

__nv_bfloat16 *cuda_held_copy_to_write(const float *out, long n) {
    HeldInput *entry = held_entry(out, n);
    if (!entry) return NULL;
    CHECK(!entry->stored, "a stored buffer (hold_stored) written by an op that writes its floats");
    entry->copied = true; // the caller's kernel writes it, in stream order before any reader
    return copy_of(entry);
}

__nv_bfloat16 *cuda_held_output(float **out, long n) {
    HeldInput *entry = held_entry(*out, n);
    if (!entry) return NULL;
    if (entry->stored) *out = NULL; // the copy is the buffer's own memory: no floats
    entry->copied = true;
    return copy_of(entry);
}

// A product's output that is stored (and so written as bf16 in place), else NULL: a held
// one that is not stored gets no copy from a product, whose output the hold does not cover.
static __nv_bfloat16 *stored_output(const float *out, long n) {
    HeldInput *entry = stored_entry(out, n);
    if (!entry) return NULL;
    entry->copied = true;
    return copy_of(entry);
}

const __nv_bfloat16 *cuda_stored_values(const float *x, long n) {
    const HeldInput *entry = stored_entry(x, n);
    if (!entry) return NULL;
    CHECK(entry->copied, "a stored buffer (hold_stored) read before an op wrote it");
    return copy_of(entry);
}

__nv_bfloat16 *cuda_held_recomputed_copy(const float *act, long n) {
    HeldInput *entry = held_entry(act, n);
    if (!entry || (entry->stored && entry->copied)) return NULL; // not held, or stored and still there
    entry->copied = true;
    return copy_of(entry);
}

const __nv_bfloat16 *cuda_activation_bf16(int slot, const float *x, long n) {
    if (HeldInput *entry = held_entry(x, n)) {
        CHECK(!entry->stored || entry->copied, "a stored buffer (hold_stored) read before an op wrote it");
        __nv_bfloat16 *copy = copy_of(entry);
        if (!entry->copied) cuda_to_bf16(copy, x, n);
        entry->copied = true;
        return copy;
    }
    __nv_bfloat16 *out = (__nv_bfloat16 *)cuda_scratch(slot, (size_t)n * sizeof(__nv_bfloat16));
    cuda_to_bf16(out, x, n);
    return out;
}

void cuda_add_bias(float *out, const float *bias, long N, int OC) {
    add_bias_kernel<<<grid_for(N * OC, 256), 256>>>(out, bias, N, OC);
    CUDA_CHECK_LAUNCH();
}

// A forward product of at most matvec::MAX_ROWS rows (a decode step) by matvec_bf16.cuh:
// out = inp . weight^T (+ bias) (+ addend, which may be out). False, with nothing done, where
// it does not apply -- more rows, IC not a multiple of 8, an operand not 16-byte aligned, an
// output kept as bf16 (hold_stored) -- and cuBLASLt takes the product.
// Whether matvec_bf16.cuh takes a product of N rows of IC from inp (the output's own check,
// stored_entry, is the caller's).
static bool matvec_applies(const float *inp, int N, int IC) {
    return N > 0 && N <= matvec::MAX_ROWS && IC % matvec::GROUP == 0 && (uintptr_t)inp % 16 == 0;
}

// The same for a product whose input an RMSNorm makes (InputRmsNorm), whose rows the kernel
// normalises as it reads them (RowNorm: aligned or not).
static bool matvec_normalises(const InputRmsNorm *norm, int N, int IC) {
    return norm && N > 0 && N <= matvec::MAX_ROWS && IC % matvec::GROUP == 0;
}

// The matvec kernel's input rows: a held input whose copy is made (by its producer, or by a
// product before this one) is read through it, a stored one always (it has no floats); any
// other input's floats are rounded by the kernel, which spares the conversion's launch (the
// attention output's, the final norm's in a decode step).
static matvec::Bf16Rows matvec_rows(const float *inp, int N, int IC) {
    const HeldInput *held = held_entry(inp, (long)N * IC);
    if (held && (held->copied || held->stored))
        return {cuda_activation_bf16(SCRATCH_MATMUL_A, inp, (long)N * IC), NULL};
    return {NULL, inp};
}

static bool matvec_product(float *out, const float *inp, const float *weight, const float *bias, const float *addend,
                           int N, int IC, int OC) {
    // Every check before any work, so that a product left to cuBLASLt does none twice: the
    // weight's bf16 copy and a held input's scratch copy are whole allocations (256-byte
    // aligned), a stored input's copy sits where its floats would (inp).
    if (!matvec_applies(inp, N, IC) || stored_entry(out, (long)N * OC)) return false;
    const __nv_bfloat16 *w = cuda_weight_bf16(weight, (long)OC * IC);
    const matvec::Bf16Rows x = matvec_rows(inp, N, IC);
    matvec::bf16_kernel<<<matvec::blocks_for(OC), matvec::THREADS>>>(matvec::Output{out, OC}, w, x, bias, addend, N,
                                                                      IC, OC);
    CUDA_CHECK_LAUNCH();
    return true;
}

// A weight of up to 3 parts (ops.h's matmul_forward_parts): a decode step's parts as one
// matvec launch, each column's sum the bits of its part's own product, the input's norm
// (where given) applied as the rows are read; otherwise (more rows, a stored output) the
// norm's kernel and a product per part, cuBLASLt's as before. Either way the parts' bf16
// copy is one range of the weight cache, which serves the parts' own products too.
void cuda_matmul_forward_parts(float *const *outs, const int *widths, int parts, const float *inp,
                               const float *weight, const float *bias, int N, int IC, const InputRmsNorm *norm) {
    CHECK(parts >= 1 && parts <= matvec::PartsOutput::MAX_PARTS, "matmul_forward_parts: %d parts", parts);
    int first[matvec::PartsOutput::MAX_PARTS + 1] = {0, INT_MAX, INT_MAX, INT_MAX};
    bool one_launch = norm ? matvec_normalises(norm, N, IC) : matvec_applies(inp, N, IC);
    for (int p = 0; p < parts; p++) {
        first[p + 1] = first[p] + widths[p];
        one_launch = one_launch && !stored_entry(outs[p], (long)N * widths[p]);
    }
    const int OC = first[parts];
    if (!one_launch) {
        ops_input_norm_forward(&ops_cuda, (float *)inp, norm, N, IC); // (InputRmsNorm: the norm's output)
        for (int p = 0; p < parts; p++)
            cuda_matmul_forward(outs[p], inp, weight + (long)first[p] * IC, bias ? bias + first[p] : NULL, N, IC,
                                widths[p]);
        return;
    }
    const matvec::PartsOutput out = {outs[0], parts > 1 ? outs[1] : NULL, parts > 2 ? outs[2] : NULL,
                                     widths[0], parts > 1 ? widths[1] : 0, parts > 2 ? widths[2] : 0,
                                     parts > 1 ? first[1] : INT_MAX, parts > 2 ? first[2] : INT_MAX};
    const __nv_bfloat16 *w = cuda_weight_bf16(weight, (long)OC * IC);
    if (norm) {
        matvec::bf16_normed_kernel<<<matvec::blocks_for(OC), matvec::THREADS>>>(out, w, matvec::row_norm(norm, IC),
                                                                                 bias, N, IC, OC);
    } else {
        const matvec::Bf16Rows x = matvec_rows(inp, N, IC);
        matvec::bf16_kernel<<<matvec::blocks_for(OC), matvec::THREADS>>>(out, w, x, bias, nullptr, N, IC, OC);
    }
    CUDA_CHECK_LAUNCH();
}

// A gated MLP's gate and up products and its activation (ops.h's matmul_forward_glu): in a
// decode step (matvec_applies) one launch, each activation computed beside its two sums
// (matvec.cuh's glu_product) and gate and up left unwritten -- the bits of the parts product
// and the GLU kernel, with the GLU's launch and its reading of gate and up gone, and the
// input's norm (where given) applied as the rows are read; otherwise those ops.
void cuda_matmul_forward_glu(float *act, float *gate, float *up, const float *inp, const float *weight, int N,
                             int IC, int I, bool use_gelu, const InputRmsNorm *norm) {
    if (norm ? !matvec_normalises(norm, N, IC) : !matvec_applies(inp, N, IC)) {
        ops_matmul_forward_glu_in_calls(&ops_cuda, act, gate, up, inp, weight, N, IC, I, use_gelu, norm);
        return;
    }
    __nv_bfloat16 *act_copy = cuda_held_output(&act, (long)N * I);
    const __nv_bfloat16 *w = cuda_weight_bf16(weight, 2L * I * IC);
    if (norm) {
        matvec::bf16_normed_glu_kernel<<<matvec::blocks_for(I), matvec::THREADS>>>(
            act, act_copy, w, matvec::row_norm(norm, IC), N, IC, I, use_gelu);
    } else {
        const matvec::Bf16Rows x = matvec_rows(inp, N, IC);
        matvec::bf16_glu_kernel<<<matvec::blocks_for(I), matvec::THREADS>>>(act, act_copy, w, x, N, IC, I, use_gelu);
    }
    CUDA_CHECK_LAUNCH();
}

// out[N, OC] = inp[N, IC] . weight[OC, IC]^T:  out^T (OC x N) = W^T^T ... in column-major
// terms D(OC x N) = op_T(W stored IC x OC) * inp stored (IC x N).
// A stored output (hold_stored: the gate and up products, which only the activations read)
// is written as bf16 in its own memory, rounded from the fp32 accumulators.
void cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int IC, int OC) {
    if (matvec_product(out, inp, weight, bias, NULL, N, IC, OC)) return;
    const __nv_bfloat16 *w = cuda_weight_bf16(weight, (long)OC * IC);
    const __nv_bfloat16 *x = cuda_activation_bf16(SCRATCH_MATMUL_A, inp, (long)N * IC);
    __nv_bfloat16 *stored = stored_output(out, (long)N * OC);
    CHECK(!stored || !bias, "a stored product output (hold_stored) with a bias");
    void *target = stored ? (void *)stored : (void *)out;
    gemm_bf16(true, false, OC, N, IC, 1.0f, w, IC, x, IC, 0.0f, target, target, OC, 1, 0, 0, 0,
              stored ? CUDA_R_16BF : CUDA_R_32F);
    if (bias) cuda_add_bias(out, bias, N, OC);
}

// Adds to out's floats: a stored out (hold_stored) has none, an internal error (the CPU,
// which keeps floats, could not show it).
void cuda_matmul_accumulate(float *out, const float *inp, const float *weight, int N, int IC, int OC) {
    CHECK(!stored_entry(out, (long)N * OC), "matmul_accumulate into a stored buffer (hold_stored)");
    if (matvec_product(out, inp, weight, NULL, out, N, IC, OC)) return;
    const __nv_bfloat16 *w = cuda_weight_bf16(weight, (long)OC * IC);
    const __nv_bfloat16 *x = cuda_activation_bf16(SCRATCH_MATMUL_A, inp, (long)N * IC);
    cuda_gemm_bf16(true, false, OC, N, IC, 1.0f, w, IC, x, IC, 1.0f, out, OC, 1, 0, 0, 0);
}

// The residual read as the product's C (out of place): the stream is not read, added and
// written again by a separate op. With a bias the product, the bias and then the residual,
// in the CPU's order.
void cuda_matmul_forward_residual(float *out, const float *inp, const float *weight, const float *bias,
                                  const float *residual, int N, int IC, int OC) {
    if (matvec_product(out, inp, weight, bias, residual, N, IC, OC)) return;
    if (bias) {
        cuda_matmul_forward(out, inp, weight, bias, N, IC, OC);
        ops_cuda.accumulate(out, residual, (long)N * OC);
        return;
    }
    CHECK(!stored_entry(out, (long)N * OC), "matmul_forward_residual into a stored buffer (hold_stored)");
    const __nv_bfloat16 *w = cuda_weight_bf16(weight, (long)OC * IC);
    const __nv_bfloat16 *x = cuda_activation_bf16(SCRATCH_MATMUL_A, inp, (long)N * IC);
    gemm_bf16(true, false, OC, N, IC, 1.0f, w, IC, x, IC, 1.0f, residual, out, OC, 1, 0, 0, 0);
}

struct DoutColumn {
    const float *dout;
    int OC;
    __device__ float operator()(int i, int c) const { return dout[(long)i * OC + c]; }
};

void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int IC, int OC, WriteMode dinp_mode,
                          WriteMode weight_mode) {
    const __nv_bfloat16 *g = cuda_activation_bf16(SCRATCH_MATMUL_A, dout, (long)N * OC);
    if (dinp) {
        // dinp[N, IC] (+)= dout[N, OC] . W[OC, IC]:  D(IC x N) (+)= W stored (IC x OC) * dout stored (OC x N);
        // beta 0 overwrites without reading D. A stored dinp (down's, which only the
        // activation's backward reads) is written as bf16, over what it held.
        const __nv_bfloat16 *w = cuda_weight_bf16(weight, (long)OC * IC);
        __nv_bfloat16 *stored = stored_output(dinp, (long)N * IC);
        CHECK(!stored || dinp_mode == WRITE_OVERWRITE, "a stored input gradient (hold_stored) added to");
        void *target = stored ? (void *)stored : (void *)dinp;
        gemm_bf16(false, false, IC, N, OC, 1.0f, w, IC, g, OC, dinp_mode == WRITE_ADD ? 1.0f : 0.0f, target, target,
                  IC, 1, 0, 0, 0, stored ? CUDA_R_16BF : CUDA_R_32F);
    }
    if (dweight) {
        // dW[OC, IC] (+)= dout^T . inp:  D(IC x OC) (+)= inp stored (IC x N) * op_T(dout stored OC x N)
        const __nv_bfloat16 *x = cuda_activation_bf16(SCRATCH_MATMUL_B, inp, (long)N * IC);
        cuda_gemm_bf16(false, true, IC, OC, N, 1.0f, x, IC, g, OC, weight_mode == WRITE_ADD ? 1.0f : 0.0f, dweight, IC,
                       1, 0, 0, 0);
    }
    if (dbias) {
        // The bias gradient sums dout's floats, which a stored dout does not have.
        CHECK(!stored_entry(dout, (long)N * OC), "a bias gradient of a stored output gradient (hold_stored)");
        // column_reduce adds; overwritten, its sums start from 0 (OC floats, no more to fill)
        if (weight_mode == WRITE_OVERWRITE) CUDA_CHECK(cudaMemsetAsync(dbias, 0, (size_t)OC * sizeof(float)));
        column_reduce(dbias, N, OC, DoutColumn{dout, OC});
    }
}
