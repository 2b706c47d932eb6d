// The CUDA backend's collectives (ops.h's OpsCollectives): NCCL (nccl_library.cuh) on the
// stream every op runs on, so a sum starts after the backward that wrote the gradients and
// the next op starts after it, with no host wait between. The "beside" ones run on a
// stream of their own (collectives_stream), behind an event of the default stream, so that
// the sums of a backward's last layers go on while it computes the earlier ones
// (dist/backward_sums.c); join makes the default stream wait for them. dist/model_sync.c
// decides, with every rank, whether they are used; ops/cuda knows nothing of MPI.
#include <string.h>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/nccl_library.cuh"

static nccl_abi::Comm communicator;
// Non-blocking: the legacy default stream, which every op runs on, neither waits for it nor
// makes it wait, except through the two events.
static cudaStream_t collectives_stream;
static cudaEvent_t default_reached, collectives_done;

#define NCCL_CHECK(call)                                                                          \
    do {                                                                                          \
        nccl_abi::Result nccl_result_ = (call);                                                   \
        if (nccl_result_ != nccl_abi::success)                                                    \
            die_internal(__FILE__, __LINE__, "NCCL: %s (%s)", nccl.GetErrorString(nccl_result_), #call); \
    } while (0)

static int cuda_collectives_available(char device_key[OPS_DEVICE_KEY_BYTES]) {
    if (nccl_library_open() != 0) return -1;
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetPCIBusId(device_key, OPS_DEVICE_KEY_BYTES, device));
    return 0;
}

static int cuda_collectives_make_id(unsigned char id[OPS_COLLECTIVES_ID_BYTES]) {
    static_assert(OPS_COLLECTIVES_ID_BYTES == sizeof(nccl_abi::UniqueId), "the id's size");
    nccl_abi::UniqueId unique;
    nccl_abi::Result result = nccl.GetUniqueId(&unique);
    if (result != nccl_abi::success) return err_set("NCCL cannot make a communicator's id: %s", nccl.GetErrorString(result));
    memcpy(id, &unique, sizeof unique);
    return 0;
}

static int cuda_collectives_open(const unsigned char id[OPS_COLLECTIVES_ID_BYTES], int rank, int world) {
    nccl_abi::UniqueId unique;
    memcpy(&unique, id, sizeof unique);
    nccl_abi::Result result = nccl.CommInitRank(&communicator, world, unique, rank);
    if (result != nccl_abi::success)
        return err_set("NCCL cannot join rank %d of %d: %s", rank, world, nccl.GetErrorString(result));
    CUDA_CHECK(cudaStreamCreateWithFlags(&collectives_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&default_reached, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&collectives_done, cudaEventDisableTiming));
    return 0;
}

// In place on `stream`; root < 0: every rank gets the sums (an all-reduce), else `root` only.
static void sum_on(cudaStream_t stream, float *values, long n, int root) {
    if (n <= 0) return;
    if (root < 0)
        NCCL_CHECK(nccl.AllReduce(values, values, (size_t)n, nccl_abi::float32, nccl_abi::sum, communicator, stream));
    else
        NCCL_CHECK(nccl.Reduce(values, values, (size_t)n, nccl_abi::float32, nccl_abi::sum, root, communicator, stream));
}

static void cuda_collectives_sum_floats(float *values, long n) { sum_on(0, values, n, -1); }

static void cuda_collectives_reduce_floats(float *values, long n, int root) { sum_on(0, values, n, root); }

static void cuda_collectives_broadcast_floats(float *values, long n, int root) {
    if (n <= 0) return;
    cuda_weights_written(values, (size_t)n * sizeof(float)); // their bf16 copies are stale
    NCCL_CHECK(nccl.Broadcast(values, values, (size_t)n, nccl_abi::float32, root, communicator, 0));
}

// The collectives stream's next work waits for what the default stream has been given so far.
static void collectives_stream_follows_default(void) {
    CUDA_CHECK(cudaEventRecord(default_reached, 0));
    CUDA_CHECK(cudaStreamWaitEvent(collectives_stream, default_reached, 0));
}

static void cuda_collectives_sum_floats_beside(float *values, long n) {
    if (n <= 0) return;
    collectives_stream_follows_default();
    sum_on(collectives_stream, values, n, -1);
}

static void cuda_collectives_reduce_floats_beside(float *values, long n, int root) {
    if (n <= 0) return;
    collectives_stream_follows_default();
    sum_on(collectives_stream, values, n, root);
}

static void cuda_collectives_join(void) {
    CUDA_CHECK(cudaEventRecord(collectives_done, collectives_stream));
    CUDA_CHECK(cudaStreamWaitEvent(0, collectives_done, 0));
}

static const char *cuda_collectives_describe(void) { return nccl.description; }

extern "C" const OpsCollectives cuda_collectives = {
    .available = cuda_collectives_available,
    .make_id = cuda_collectives_make_id,
    .open = cuda_collectives_open,
    .sum_floats = cuda_collectives_sum_floats,
    .reduce_floats = cuda_collectives_reduce_floats,
    .broadcast_floats = cuda_collectives_broadcast_floats,
    .sum_floats_beside = cuda_collectives_sum_floats_beside,
    .reduce_floats_beside = cuda_collectives_reduce_floats_beside,
    .join = cuda_collectives_join,
    .describe = cuda_collectives_describe,
};
