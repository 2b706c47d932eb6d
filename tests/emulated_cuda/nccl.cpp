// NCCL for the emulated CUDA backend, in place of src/ops/cuda/nccl_library.cu's dlopen of
// the real library: the table of nccl_library.cuh filled with collectives over marlhf's
// own MPI layer (dist/dist.h), since emulated device memory is host memory.
//
// It refuses what the real library refuses and stops on what would fault on a GPU: a
// buffer that is not device memory or runs past its allocation, a data type or operation
// other than a float sum, a rank or world size that is not the MPI job's, ranks joining
// with different ids, two ranks of one machine on one GPU (NCCL's "Duplicate GPU
// detected"), a collective without a communicator. Its sums are MPI's, so a run through
// it gives the same bits as one through the host path (dist/model_sync.c); on GPUs NCCL
// adds in its own order (a ring), and the two agree to rounding only.
#include <cuda_runtime_api.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops/cuda/nccl_library.cuh"

extern "C" {
#include "core/check.h"
#include "core/hash.h"
#include "dist/dist.h"
}

struct nccl_abi::Communicator {
    int rank, ranks;
};

namespace {
// ncclResult_t's values.
constexpr nccl_abi::Result internal_error = 3, invalid_argument = 4, invalid_usage = 5;

nccl_abi::Result get_version(int *version) {
    *version = 0;
    return nccl_abi::success;
}

// Unique to the run, as a real id is to its bootstrap address.
nccl_abi::Result get_unique_id(nccl_abi::UniqueId *id) {
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "emulated NCCL %ld %ld", (long)getpid(), (long)time(NULL));
    return nccl_abi::success;
}

// Whether two ranks on one machine (host name) sit on one device, as NCCL checks it
// itself: by the device's number here, not marlhf's PCI addresses.
bool devices_shared() {
    int device = 0, first, second;
    cudaGetDevice(&device);
    char host[256] = "", mine[300], shared[300];
    gethostname(host, sizeof host - 1);
    snprintf(mine, sizeof mine, "%s device %d", host, device);
    return dist_find_shared_string(mine, shared, sizeof shared, &first, &second);
}

nccl_abi::Result comm_init_rank(nccl_abi::Comm *comm, int ranks, nccl_abi::UniqueId id, int rank) {
    *comm = NULL;
    if (ranks != dist_world_size() || rank != dist_rank()) return invalid_argument;
    const uint64_t id_hash = hash_floats(HASH_FNV1A_START, (const float *)id.internal, sizeof id.internal / sizeof(float));
    if (!dist_all_equal(id_hash)) return invalid_argument; // a rank got another id than rank 0 made
    if (devices_shared()) return invalid_usage;
    *comm = new nccl_abi::Communicator{rank, ranks};
    return nccl_abi::success;
}

// Runs a collective's work on `stream` as a kernel would run there: now, or (with
// MARLHF_EMULATED_STREAMS=late, on a stream other than the default one) queued until
// another stream waits for it (tests/emulated_cuda/emulated_runtime.h). So a missing
// OpsCollectives.join shows as sums that have not happened yet.
template <typename Work> nccl_abi::Result on_stream(cudaStream_t stream, Work work) {
    if (stream && emulation::streams_late()) {
        stream->pending.push_back(work);
        stream->queued++;
    } else {
        work();
    }
    return nccl_abi::success;
}

// Stops, as a GPU would fault, when [p, p + bytes) is not inside one device allocation.
void require_device_range(const void *p, size_t bytes, const char *what) {
    const uintptr_t first = (uintptr_t)p;
    auto after = emulation::allocations().upper_bound(first);
    if (after != emulation::allocations().begin()) {
        --after;
        if (first >= after->first && first + bytes <= after->first + after->second) return;
    }
    fprintf(stderr, "emulation: %s [%p, +%zu bytes) is not inside one device allocation (a GPU faults)\n", what, p,
            bytes);
    abort();
}

nccl_abi::Result all_reduce(const void *send, void *receive, size_t count, int data_type, int operation,
                            nccl_abi::Comm comm, cudaStream_t stream) {
    if (!comm) return invalid_usage;
    if (data_type != nccl_abi::float32 || operation != nccl_abi::sum) return invalid_argument;
    const size_t bytes = count * sizeof(float);
    require_device_range(send, bytes, "ncclAllReduce's send buffer");
    require_device_range(receive, bytes, "ncclAllReduce's receive buffer");
    return on_stream(stream, [=] {
        emulation::DeviceAccess access;
        if (send != receive) memmove(receive, send, bytes);
        dist_sum_floats((float *)receive, (long)count);
    });
}

// The sums reach `root` only: another rank's receive buffer is neither read nor written.
nccl_abi::Result reduce(const void *send, void *receive, size_t count, int data_type, int operation, int root,
                        nccl_abi::Comm comm, cudaStream_t stream) {
    if (!comm) return invalid_usage;
    if (data_type != nccl_abi::float32 || operation != nccl_abi::sum || root < 0 || root >= comm->ranks)
        return invalid_argument;
    const size_t bytes = count * sizeof(float);
    require_device_range(send, bytes, "ncclReduce's send buffer");
    const bool is_root = comm->rank == root;
    if (is_root) require_device_range(receive, bytes, "ncclReduce's receive buffer");
    return on_stream(stream, [=] {
        float *sums = (float *)xmalloc(bytes ? bytes : 1);
        emulation::DeviceAccess access;
        memcpy(sums, send, bytes);
        dist_sum_floats(sums, (long)count);
        if (is_root) memcpy(receive, sums, bytes);
        free(sums);
    });
}

nccl_abi::Result broadcast(const void *send, void *receive, size_t count, int data_type, int root,
                           nccl_abi::Comm comm, cudaStream_t) {
    if (!comm) return invalid_usage;
    if (data_type != nccl_abi::float32 || root < 0 || root >= comm->ranks) return invalid_argument;
    const size_t bytes = count * sizeof(float);
    if (comm->rank == root) require_device_range(send, bytes, "ncclBroadcast's send buffer");
    require_device_range(receive, bytes, "ncclBroadcast's receive buffer");
    emulation::DeviceAccess access;
    if (comm->rank == root && send != receive) memmove(receive, send, bytes);
    dist_broadcast(receive, bytes, root);
    return nccl_abi::success;
}

const char *error_string(nccl_abi::Result result) {
    switch (result) {
    case nccl_abi::success: return "no error";
    case internal_error: return "internal error (emulated)";
    case invalid_argument: return "invalid argument (emulated)";
    case invalid_usage: return "invalid usage (emulated: two ranks of one machine on one GPU?)";
    }
    return "unknown error (emulated)";
}
} // namespace

NcclLibrary nccl;

extern "C" int nccl_library_open(void) {
    nccl = NcclLibrary{"NCCL (emulated: MPI on host memory)", get_version, get_unique_id, comm_init_rank, all_reduce,
                       reduce, broadcast, error_string};
    return 0;
}
