// The GPU's attention against a KV cache and its Q8_0 cache write (src/ops/cuda/
// attention_cached.cuh) run on CPU threads through src/ops/cuda/cpu_emulation.h, against the
// CPU backend's ops on the same caches:
//  - write_q8_kernel gives cpu_cache_write_q8's bytes exactly (values, scales, the zeroed
//    padding, and every slot it must not touch left alone), for head sizes that Q8_BLOCK
//    divides and ones it does not (a short last block), and an all-zero block (scale 0);
//  - the attention kernel over float32, half and Q8_0 caches, as a decode step (T = 1) and as
//    several new queries continuing a cached prefix (T > 1), with ragged rows (row_start),
//    grouped K/V heads (groups of up to 8 in a block, larger ones over several), contexts of
//    several tiles, head sizes from 16 to 256, Gemma 2's soft cap and sliding windows; each
//    case with the keys in one run, as the backend plans the runs, and a run per tile (the
//    runs merged by combine_kernel): within 1e-5 of the CPU op's output norm (fp32 sums in
//    another order, the GPU's expf).
// tests/gpu/test_cuda.c checks the same kernels on a GPU.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

extern "C" {
#include "ops/ops.h"
}
#include "ops/cuda/attention_cached.cuh"
#include "emulated_test.h"
#include "test.h"

using namespace attention_cached;

static uint64_t rng_state = 0x6a09e667f3bcc909ull;

// This test's inputs: one sequence from a fixed seed.
static std::vector<float> random_floats(long n, float scale) { return random_floats(rng_state, n, scale); }

// Writes B x T new rows into slots [slot, slot + T) of a Q8_0 cache on both sides, the caches
// starting as the same random bytes; they must then be equal byte for byte.
static void check_write_q8(int B, int T, int capacity, int slot, int n_kv_heads, int head_dim, bool zero_block) {
    const Q8Layout layout = q8_layout(n_kv_heads, head_dim);
    const long cache_bytes = (long)B * capacity * layout.slot_bytes;
    std::vector<float> noise = random_floats(cache_bytes, 1.0f);
    std::vector<uint8_t> gpu((size_t)cache_bytes), cpu((size_t)cache_bytes);
    for (long i = 0; i < cache_bytes; i++) gpu[(size_t)i] = cpu[(size_t)i] = (uint8_t)(noise[(size_t)i] * 127.0f + 128.0f);
    std::vector<float> x = random_floats((long)B * T * n_kv_heads * head_dim, 3.0f);
    if (zero_block) memset(x.data(), 0, Q8_BLOCK * sizeof(float)); // row 0's first block: scale 0
    ops_cpu.cache_write_q8(cpu.data(), x.data(), B, T, capacity, slot, n_kv_heads, head_dim);
    emulation::launch({write_blocks(layout, B, T), 1, 1}, THREADS, 0,
                      [&] { write_q8_kernel(gpu.data(), x.data(), layout, B, T, capacity, slot); });
    long differ = 0;
    for (long i = 0; i < cache_bytes; i++) differ += gpu[(size_t)i] != cpu[(size_t)i];
    printf("# write q8_0 B %d T %d slot %d heads %d head_dim %3d%s: %ld of %ld bytes differ\n", B, T, slot, n_kv_heads,
           head_dim, zero_block ? " (a zero block)" : "", differ, cache_bytes);
    EXPECT(differ == 0, "q8_0 write, head_dim %d: %ld bytes differ from the CPU's", head_dim, differ);
}

static void test_write_q8(void) {
    check_write_q8(3, 2, 7, 3, 2, 64, false);
    check_write_q8(2, 1, 5, 4, 3, 80, true);  // blocks of 32, 32 and 16
    check_write_q8(2, 3, 6, 2, 3, 42, false); // blocks of 32 and 10; 126 values, 2 bytes of padding
    check_write_q8(1, 4, 4, 0, 1, 16, false); // one short block per head, every slot written
}

enum CacheKind { FLOAT_CACHE, HALF_CACHE, Q8_CACHE };
static const char *const kind_names[] = {"f32", "f16", "q8_0"};

// Caches of `capacity` slots per row holding random keys and values (written by the CPU's
// cache ops for the half and Q8_0 kinds), queries for T new slots from first_slot on, and the
// kernel's output against the CPU op's.
static void check_attention(CacheKind kind, int B, int T, int capacity, int first_slot, int n_heads, int n_kv_heads,
                            int head_dim, float softcap = 0.0f, int window = 0, int row_start_step = 7) {
    const int width = n_kv_heads * head_dim;
    const long slots = (long)B * capacity;
    std::vector<float> keys = random_floats(slots * width, 1.0f), values = random_floats(slots * width, 1.0f);
    std::vector<float> q = random_floats((long)B * T * n_heads * head_dim, 1.0f);
    std::vector<int> row_start((size_t)B);
    for (int b = 0; b < B; b++) row_start[(size_t)b] = (b * row_start_step) % (first_slot + 1); // ragged: left padding
    const long n_out = (long)B * T * n_heads * head_dim;
    std::vector<float> want((size_t)n_out);
    // Each launch three ways: one run of keys per query (the kernel writes the output), as the
    // backend plans it (TARGET_BLOCKS), and a run per tile of keys (the most splits), each
    // against the CPU op.
    const long targets[] = {1, TARGET_BLOCKS, 1L << 30};
    std::vector<float> got[3];
    int splits[3];
    const float scale = 1.0f / sqrtf((float)head_dim);
    auto run = [&](auto key_slots, auto value_slots) {
        for (int way = 0; way < 3; way++) {
            const Plan p = plan(B, T, first_slot, n_heads, n_kv_heads, head_dim, window, targets[way]);
            splits[way] = p.splits;
            got[way].assign((size_t)n_out, NAN);
            std::vector<float> partial(partial_bytes(p, n_heads) / sizeof(float), NAN);
            emulation::launch({blocks_x(p, n_kv_heads), (unsigned)p.splits, 1}, THREADS, shared_bytes(p), [&] {
                attention_kernel(got[way].data(), partial.data(), q.data(), key_slots, value_slots, row_start.data(), T,
                                 capacity, first_slot, n_heads, n_kv_heads, scale, softcap, window, p);
            });
            if (p.splits > 1)
                emulation::launch({(unsigned)(p.queries * n_heads), 1, 1}, THREADS, 0,
                                  [&] { combine_kernel(got[way].data(), partial.data(), p); });
        }
    };
    if (kind == FLOAT_CACHE) {
        if (T == 1)
            ops_cpu.attention_decode(want.data(), q.data(), keys.data(), values.data(), row_start.data(), B, capacity,
                                     first_slot + 1, n_heads, n_kv_heads, head_dim, softcap, window);
        else
            ops_cpu.attention_extend(want.data(), q.data(), keys.data(), values.data(), row_start.data(), B, T, capacity,
                                     first_slot, n_heads, n_kv_heads, head_dim, softcap, window);
        run(FloatSlots{keys.data(), width, head_dim}, FloatSlots{values.data(), width, head_dim});
    } else if (kind == HALF_CACHE) {
        std::vector<uint16_t> k16((size_t)(slots * width)), v16((size_t)(slots * width));
        ops_cpu.cache_write_f16(k16.data(), keys.data(), B, capacity, capacity, 0, width);
        ops_cpu.cache_write_f16(v16.data(), values.data(), B, capacity, capacity, 0, width);
        if (T == 1)
            ops_cpu.attention_decode_f16(want.data(), q.data(), k16.data(), v16.data(), row_start.data(), B, capacity,
                                         first_slot + 1, n_heads, n_kv_heads, head_dim, softcap, window);
        else
            ops_cpu.attention_extend_f16(want.data(), q.data(), k16.data(), v16.data(), row_start.data(), B, T,
                                         capacity, first_slot, n_heads, n_kv_heads, head_dim, softcap, window);
        run(HalfSlots{k16.data(), width, head_dim}, HalfSlots{v16.data(), width, head_dim});
    } else {
        const Q8Layout layout = q8_layout(n_kv_heads, head_dim);
        std::vector<uint8_t> k8((size_t)(slots * layout.slot_bytes)), v8((size_t)(slots * layout.slot_bytes));
        ops_cpu.cache_write_q8(k8.data(), keys.data(), B, capacity, capacity, 0, n_kv_heads, head_dim);
        ops_cpu.cache_write_q8(v8.data(), values.data(), B, capacity, capacity, 0, n_kv_heads, head_dim);
        if (T == 1)
            ops_cpu.attention_decode_q8(want.data(), q.data(), k8.data(), v8.data(), row_start.data(), B, capacity,
                                        first_slot + 1, n_heads, n_kv_heads, head_dim, softcap, window);
        else
            ops_cpu.attention_extend_q8(want.data(), q.data(), k8.data(), v8.data(), row_start.data(), B, T, capacity,
                                        first_slot, n_heads, n_kv_heads, head_dim, softcap, window);
        run(Q8Slots{k8.data(), layout}, Q8Slots{v8.data(), layout});
    }
    for (int way = 0; way < 3; way++) {
        const double error = relative_error(got[way].data(), want.data(), n_out);
        printf("# attention %-4s B %d T %d slots %3d..%-3d heads %2d/%d head_dim %3d%s window %3d, %2d splits: error %.2e\n",
               kind_names[kind], B, T, first_slot, first_slot + T - 1, n_heads, n_kv_heads, head_dim,
               softcap > 0.0f ? " soft cap" : "", window, splits[way], error);
        EXPECT(error <= 1e-5, "attention over a %s cache (T %d, head_dim %d, %d splits): error %.3g", kind_names[kind], T,
               head_dim, splits[way], error);
    }
}

// Each cache kind: a decode step and three queries continuing a prefix; a context of 300
// slots (several tiles of keys) at head_dim 64; head_dim 80 (a short Q8_0 block) and 16;
// GQA groups of 2 and 4 heads.
static void test_attention(void) {
    for (int kind = FLOAT_CACHE; kind <= Q8_CACHE; kind++) {
        check_attention((CacheKind)kind, 3, 1, 40, 33, 4, 2, 64);
        check_attention((CacheKind)kind, 2, 3, 40, 20, 4, 2, 64);
        check_attention((CacheKind)kind, 2, 1, 320, 299, 2, 1, 64);
        check_attention((CacheKind)kind, 2, 2, 24, 17, 4, 1, 80);
        check_attention((CacheKind)kind, 3, 1, 24, 9, 2, 2, 16);
        // Gemma 2's soft cap on the scores (0.5: the scores here reach about 2), against the
        // CPU ops given the same cap.
        check_attention((CacheKind)kind, 3, 1, 40, 33, 4, 2, 64, 0.5f);
        check_attention((CacheKind)kind, 2, 3, 40, 20, 4, 2, 64, 0.5f);
        // A sliding window (Mistral, Gemma 2/3's sliding layers) shorter than the rows, for a
        // decode step and an extension whose queries' windows start at different slots.
        check_attention((CacheKind)kind, 3, 1, 40, 33, 4, 2, 64, 0.0f, 8);
        check_attention((CacheKind)kind, 2, 5, 40, 20, 4, 2, 64, 0.0f, 6);
        check_attention((CacheKind)kind, 2, 1, 320, 299, 2, 1, 64, 0.0f, 257);
        // Runs of keys (splits) over long contexts: a row whose keys start 150 slots later has
        // no keys in the last runs; queries continuing a prefix see different numbers of keys.
        check_attention((CacheKind)kind, 2, 1, 310, 299, 4, 2, 64, 0.0f, 0, 150);
        check_attention((CacheKind)kind, 1, 5, 310, 290, 4, 2, 64, 0.5f);
        // Heads per block: a group of 9 query heads is two blocks of 5 and 4; head sizes that
        // take two columns a thread (256), one (128, 96: some threads idle) and four threads a
        // column (32).
        check_attention((CacheKind)kind, 1, 1, 200, 180, 18, 2, 64);
        check_attention((CacheKind)kind, 2, 1, 150, 140, 4, 2, 256);
        check_attention((CacheKind)kind, 1, 2, 200, 190, 12, 1, 128);
        check_attention((CacheKind)kind, 1, 1, 150, 129, 3, 3, 96);
        check_attention((CacheKind)kind, 2, 1, 150, 149, 8, 4, 32);
    }
}

// rotate_and_store_kernel against the CPU's rotate_and_cache_write (rope_forward of q and k,
// then two cache writes) on caches that start as the same random bytes: q and k rotated within
// 1e-6 of the largest value (both compute the angles with the same float formulas), the bf16
// copies of held q and k the rounding of the kernel's floats, and the caches byte for byte what
// the CPU's cache write makes of the kernel's rotated k and of v (so every slot it must not
// touch is left alone); without a table (learned positions) the CPU's bytes of the whole op.
static void check_rotate_and_store(CacheKind kind, int B, int T, int capacity, int slot, int n_heads, int n_kv_heads,
                                   int head_dim, bool rotate) {
    const long N = (long)B * T, q_width = (long)n_heads * head_dim, kv_width = (long)n_kv_heads * head_dim;
    std::vector<int> positions((size_t)N);
    for (long i = 0; i < N; i++) positions[(size_t)i] = slot + (int)(i % T) + 1000 * (int)(i / T); // rows apart
    std::vector<float> inv_freq((size_t)(head_dim / 2));
    for (int i = 0; i < head_dim / 2; i++) inv_freq[(size_t)i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)head_dim);
    const float *table = rotate ? inv_freq.data() : NULL;
    const std::vector<float> q = random_floats(N * q_width, 2.0f), k = random_floats(N * kv_width, 2.0f),
                             v = random_floats(N * kv_width, 2.0f);
    const long slot_bytes = kind == FLOAT_CACHE  ? kv_width * 4
                            : kind == HALF_CACHE ? kv_width * 2
                                                 : kv_q8_slot_bytes(n_kv_heads, head_dim);
    const long cache_bytes = (long)B * capacity * slot_bytes;
    std::vector<uint8_t> noise((size_t)cache_bytes);
    for (long i = 0; i < cache_bytes; i++) noise[(size_t)i] = (uint8_t)(i * 131 % 251); // not NaN-free: compared as bytes
    std::vector<uint8_t> gpu_keys = noise, gpu_values = noise, cpu_keys = noise, cpu_values = noise;
    std::vector<float> gpu_q = q, gpu_k = k, cpu_q = q, cpu_k = k;
    std::vector<bf16> q_copy((size_t)(N * q_width), bf16{0xffff}), k_copy((size_t)(N * kv_width), bf16{0xffff});
    const KvCacheType type = kind == FLOAT_CACHE ? KV_CACHE_F32 : kind == HALF_CACHE ? KV_CACHE_F16 : KV_CACHE_Q8_0;
    ops_cpu.rotate_and_cache_write(cpu_q.data(), cpu_k.data(), v.data(), cpu_keys.data(), cpu_values.data(), type,
                                   positions.data(), B, T, capacity, slot, n_heads, n_kv_heads, head_dim, table);
    auto run = [&](auto keys, auto values) {
        emulation::launch({(unsigned)N, 1, 1}, THREADS, (size_t)head_dim * sizeof(float), [&] {
            rotate_and_store_kernel(gpu_q.data(), rotate ? q_copy.data() : nullptr, gpu_k.data(),
                                    rotate ? k_copy.data() : nullptr, v.data(), keys, values, positions.data(), T,
                                    capacity, slot, n_heads, n_kv_heads, head_dim, table);
        });
    };
    if (kind == FLOAT_CACHE)
        run(FloatStore{(float *)gpu_keys.data(), (int)kv_width}, FloatStore{(float *)gpu_values.data(), (int)kv_width});
    else if (kind == HALF_CACHE)
        run(HalfStore{(uint16_t *)gpu_keys.data(), (int)kv_width}, HalfStore{(uint16_t *)gpu_values.data(), (int)kv_width});
    else
        run(Q8Store{gpu_keys.data(), q8_layout(n_kv_heads, head_dim)}, Q8Store{gpu_values.data(), q8_layout(n_kv_heads, head_dim)});
    // The reference caches: the CPU's writes of the kernel's own k (and v) over the same noise.
    std::vector<uint8_t> want_keys = noise, want_values = noise;
    ops_cpu.rotate_and_cache_write(std::vector<float>(gpu_q).data(), std::vector<float>(gpu_k).data(), v.data(),
                                   want_keys.data(), want_values.data(), type, positions.data(), B, T, capacity, slot,
                                   n_heads, n_kv_heads, head_dim, NULL);
    if (!rotate) want_keys = cpu_keys, want_values = cpu_values;
    long differ = 0;
    for (long i = 0; i < cache_bytes; i++)
        differ += (gpu_keys[(size_t)i] != want_keys[(size_t)i]) + (gpu_values[(size_t)i] != want_values[(size_t)i]);
    const double q_error = worst_error_of_largest(gpu_q, cpu_q), k_error = worst_error_of_largest(gpu_k, cpu_k);
    const long wrong_copies = rotate ? wrong_bf16_copies(q_copy, gpu_q) + wrong_bf16_copies(k_copy, gpu_k) : 0;
    printf("# rotate and store %-4s B %d T %d slot %2d heads %d/%d head_dim %3d%s: q %.2g, k %.2g of the largest, "
           "%ld cache bytes differ, %ld copies wrong\n",
           kind_names[kind], B, T, slot, n_heads, n_kv_heads, head_dim, rotate ? "" : " (no rotation)", q_error, k_error,
           differ, wrong_copies);
    EXPECT(q_error <= 1e-6 && k_error <= 1e-6, "rotate and store (%s): q %.3g, k %.3g off the CPU's", kind_names[kind],
           q_error, k_error);
    EXPECT(differ == 0, "rotate and store (%s, head_dim %d): %ld cache bytes differ", kind_names[kind], head_dim, differ);
    EXPECT(wrong_copies == 0, "rotate and store (%s): %ld bf16 copies wrong", kind_names[kind], wrong_copies);
}

// Each cache kind: a decode step (T 1) of 3 rows and a 4-slot extension of 2 rows, GQA 4/2 at
// head_dim 64, a head size with a short Q8_0 block (80) and more pairs than the block has
// threads (9 heads of 64: 288 pairs of q), and GPT-2's learned positions (no rotation).
static void test_rotate_and_store(void) {
    for (int kind = FLOAT_CACHE; kind <= Q8_CACHE; kind++) {
        check_rotate_and_store((CacheKind)kind, 3, 1, 12, 7, 4, 2, 64, true);
        check_rotate_and_store((CacheKind)kind, 2, 4, 12, 5, 4, 2, 64, true);
        check_rotate_and_store((CacheKind)kind, 2, 2, 6, 3, 2, 1, 80, true);
        check_rotate_and_store((CacheKind)kind, 1, 1, 9, 8, 9, 3, 64, true);
        check_rotate_and_store((CacheKind)kind, 2, 3, 8, 2, 4, 4, 32, false);
    }
}

int main(void) {
    RUN(test_write_q8);
    RUN(test_rotate_and_store);
    RUN(test_attention);
    TEST_EXIT();
}
