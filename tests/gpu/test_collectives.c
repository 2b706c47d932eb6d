// The CUDA backend's collectives (ops.h's OpsCollectives: NCCL) between the ranks of an MPI
// job, one GPU each. tests/cli/gpu_emulated.sh runs it on 2 ranks of the emulated backend
// (build/tests/gpu/test_collectives_emulated with MARLHF_EMULATED_DEVICES=2, the
// collectives then MPI's on host memory: tests/emulated_cuda/nccl.cpp); tests/gpu/run.sh
// runs it on the GPU machine as one process, a communicator of one, which shows that the
// real library loads and takes these calls (its sums between GPUs need a machine with
// several, which no session has had). It checks:
//   - a sum in place of values that differ by rank gives every rank the exact sums (the
//     values are small multiples of 1/4, so any order of addition gives the same bits);
//   - a reduce onto the last rank gives it the sums and leaves the others' values;
//   - a broadcast from the last rank reaches every rank;
//   - a product that read a weight before a broadcast replaced it reads the new values
//     after it: the backend's bf16 copy of the weight (ops/cuda/matmul.cu) is marked stale;
//   - sums and reduces issued "beside" the other ops (the backward's sums, dist/backward_sums.h)
//     take the values an op wrote just before them, leave alone what the ops after them
//     write elsewhere, and are there for the ops after join (under the emulation's late
//     streams, MARLHF_EMULATED_STREAMS=late, a missing join reads them before they ran).
// Says SKIP (exit 0) only when the NCCL library cannot be loaded on a real GPU machine.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test.h"
#include "core/check.h"
#include "dist/dist.h"
#include "ops/ops.h"

static const OpsBackend *gpu;
static int rank, world;

// n floats of device memory holding values[0, n).
static float *device_copy(const float *values, long n) {
    float *device = gpu->alloc((size_t)n * sizeof(float));
    gpu->copy_to_device(device, values, (size_t)n * sizeof(float));
    return device;
}

static void test_sum_floats(void) {
    const long n = 1000003; // not a multiple of 4, nor of any chunk size
    float *host = malloc((size_t)n * sizeof(float)), *expected = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) {
        host[i] = 0.25f * (float)(i % 97) + 1.5f * (float)rank;
        expected[i] = 0.25f * (float)(i % 97) * (float)world + 1.5f * (float)(world * (world - 1) / 2);
    }
    float *device = device_copy(host, n);
    gpu->collectives->sum_floats(device, n);
    gpu->copy_to_host(host, device, (size_t)n * sizeof(float));
    long wrong = 0, first_wrong = -1;
    for (long i = 0; i < n; i++)
        if (host[i] != expected[i] && wrong++ == 0) first_wrong = i;
    EXPECT(wrong == 0, "%ld of %ld sums wrong, the first at %ld: %g, expected %g", wrong, n, first_wrong,
           first_wrong >= 0 ? host[first_wrong] : 0.0, first_wrong >= 0 ? expected[first_wrong] : 0.0);
    gpu->free(device);
    free(host), free(expected);
}

static void test_reduce_floats(void) {
    const long n = 70001;
    const int root = world - 1;
    float *host = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) host[i] = 0.5f * (float)(i % 31) + (float)rank;
    float *device = device_copy(host, n);
    gpu->collectives->reduce_floats(device, n, root);
    gpu->copy_to_host(host, device, (size_t)n * sizeof(float));
    long wrong = 0;
    for (long i = 0; i < n; i++) {
        const float own = 0.5f * (float)(i % 31) + (float)rank;
        const float sum = 0.5f * (float)(i % 31) * (float)world + (float)(world * (world - 1) / 2);
        wrong += host[i] != (rank == root ? sum : own);
    }
    EXPECT(wrong == 0, "%ld of %ld values wrong on %s", wrong, n, rank == root ? "the root (sums)" : "a rank not the root (its own)");
    gpu->free(device);
    free(host);
}

static void test_broadcast_floats(void) {
    const long n = 4099;
    const int root = world - 1;
    float *host = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) host[i] = (float)((rank + 1) * (i % 13));
    float *device = device_copy(host, n);
    gpu->collectives->broadcast_floats(device, n, root);
    gpu->copy_to_host(host, device, (size_t)n * sizeof(float));
    long wrong = 0;
    for (long i = 0; i < n; i++) wrong += host[i] != (float)((root + 1) * (i % 13));
    EXPECT(wrong == 0, "%ld of %ld values are not rank %d's", wrong, n, root);
    gpu->free(device);
    free(host);
}

static void test_broadcast_weight_not_stale(void) {
    enum { N = 4, IC = 64, OC = 32 };
    const int root = world - 1;
    float x[N * IC], w[OC * IC], root_w[OC * IC], out[N * OC], expected[N * OC];
    for (int i = 0; i < N * IC; i++) x[i] = 0.125f * (float)(i % 9) - 0.5f;
    for (int i = 0; i < OC * IC; i++) {
        w[i] = 0.0625f * (float)((i * 7 + rank) % 11) - 0.25f;
        root_w[i] = 0.0625f * (float)((i * 7 + root) % 11) - 0.25f;
    }
    float *device_x = device_copy(x, N * IC), *device_w = device_copy(w, OC * IC);
    float *device_root_w = device_copy(root_w, OC * IC), *device_out = gpu->alloc(sizeof out);
    gpu->matmul_forward(device_out, device_x, device_w, NULL, N, IC, OC); // caches w's bf16 copy
    gpu->matmul_forward(device_out, device_x, device_root_w, NULL, N, IC, OC);
    gpu->copy_to_host(expected, device_out, sizeof expected);
    gpu->collectives->broadcast_floats(device_w, OC * IC, root);
    gpu->matmul_forward(device_out, device_x, device_w, NULL, N, IC, OC);
    gpu->copy_to_host(out, device_out, sizeof out);
    EXPECT(!memcmp(out, expected, sizeof out), "after the broadcast the product used %s weights",
           rank == root ? "other" : "this rank's old (a stale bf16 copy)");
    gpu->free(device_x), gpu->free(device_w), gpu->free(device_root_w), gpu->free(device_out);
}

static void test_beside_then_join(void) {
    const long n = 50021, half = n / 2;
    const int root = world - 1;
    float *host = malloc((size_t)n * sizeof(float)), *other = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) host[i] = 0.25f * (float)(i % 41) + (float)rank, other[i] = 1.0f;
    float *device = device_copy(host, n), *device_other = device_copy(other, n);
    gpu->scale(device, 2.0f, n); // queued on the default stream just before the sums
    gpu->collectives->sum_floats_beside(device, half);
    gpu->collectives->reduce_floats_beside(device + half, n - half, root);
    gpu->scale(device_other, 3.0f, n); // beside the sums, on other memory
    gpu->collectives->join();
    gpu->copy_to_host(host, device, (size_t)n * sizeof(float));
    gpu->copy_to_host(other, device_other, (size_t)n * sizeof(float));
    long wrong = 0, first_wrong = -1;
    for (long i = 0; i < n; i++) {
        const float own = 2.0f * (0.25f * (float)(i % 41) + (float)rank);
        const float sum = 2.0f * (0.25f * (float)(i % 41) * (float)world + (float)(world * (world - 1) / 2));
        const float expected = i < half || rank == root ? sum : own;
        if ((host[i] != expected || other[i] != 3.0f) && wrong++ == 0) first_wrong = i;
    }
    EXPECT(wrong == 0, "%ld of %ld values wrong after the join, the first at %ld: %g (other buffer %g)", wrong, n,
           first_wrong, first_wrong >= 0 ? host[first_wrong] : 0.0, first_wrong >= 0 ? other[first_wrong] : 0.0);
    gpu->free(device), gpu->free(device_other);
    free(host), free(other);
}

int main(int argc, char **argv) {
    if (dist_init(&argc, &argv) != 0) {
        fprintf(stderr, "test_collectives: %s\n", err_msg());
        return 2;
    }
    rank = dist_rank(), world = dist_world_size();
    char label[64], error_label[80];
    snprintf(label, sizeof label, "rank %d of %d", rank, world);
    snprintf(error_label, sizeof error_label, "[%s] ", label);
    err_set_process_label(error_label);
#ifdef MARLHF_CUDA
    gpu = ops_backend_by_name("cuda");
#endif
    if (!gpu) {
        fprintf(stderr, "test_collectives: %s\n", err_msg());
        printf("FAIL cuda_device_available\n");
        return 1;
    }
    char device_key[OPS_DEVICE_KEY_BYTES] = "";
    if (!gpu->collectives || gpu->collectives->available(device_key) != 0) {
        // Every rank of a job on one machine sees the same library: all skip together.
        printf("SKIP test_collectives (%s): %s\n", label, gpu->collectives ? err_msg() : "no collectives");
        dist_finalize();
        return 0;
    }
    unsigned char id[OPS_COLLECTIVES_ID_BYTES] = {0};
    if (rank == 0 && gpu->collectives->make_id(id) != 0) die_internal(__FILE__, __LINE__, "%s", err_msg());
    dist_broadcast(id, sizeof id, 0);
    if (gpu->collectives->open(id, rank, world) != 0) die_internal(__FILE__, __LINE__, "%s", err_msg());
    printf("# %s: %s on %s\n", label, gpu->collectives->describe(), device_key);
    RUN(test_sum_floats);
    RUN(test_reduce_floats);
    RUN(test_broadcast_floats);
    RUN(test_broadcast_weight_not_stale);
    RUN(test_beside_then_join);
    const bool failed = dist_any_failed(test_total_failed != 0);
    dist_finalize();
    return failed ? 1 : 0;
}
