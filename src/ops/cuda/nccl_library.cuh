// NCCL, loaded the first time a data-parallel job with `--device cuda` sums gradients
// (dist/model_sync.c through ops/cuda/collectives.cu), never at start: like cuBLASLt
// (cublaslt_library.cuh), a run that needs no collective never maps it, and a machine
// without it still runs everything else (the sums then go through host memory and MPI).
//
// The project does not build against nccl.h, which many CUDA installs lack: the few types
// and constants of NCCL 2's C interface that the backend uses are declared here, and
// nccl_library.cu checks them against nccl.h at compile time where the toolkit has it.
// Enums travel as int, as a C enum does in the calling convention.
#pragma once
#include <cuda_runtime_api.h>
#include <stddef.h>

namespace nccl_abi {
typedef struct Communicator *Comm; // ncclComm_t
constexpr int unique_id_bytes = 128; // NCCL_UNIQUE_ID_BYTES
struct UniqueId {                    // ncclUniqueId, passed by value to CommInitRank
    char internal[unique_id_bytes];
};
typedef int Result;                  // ncclResult_t
constexpr Result success = 0;        // ncclSuccess
constexpr int float32 = 7;           // ncclFloat32
constexpr int sum = 0;               // ncclSum
} // namespace nccl_abi

struct NcclLibrary {
    char description[64]; // "NCCL 2.27.3", for the note saying which path sums the gradients
    nccl_abi::Result (*GetVersion)(int *version);
    nccl_abi::Result (*GetUniqueId)(nccl_abi::UniqueId *id);
    nccl_abi::Result (*CommInitRank)(nccl_abi::Comm *comm, int ranks, nccl_abi::UniqueId id, int rank);
    nccl_abi::Result (*AllReduce)(const void *send, void *receive, size_t count, int data_type, int operation,
                                  nccl_abi::Comm comm, cudaStream_t stream);
    nccl_abi::Result (*Reduce)(const void *send, void *receive, size_t count, int data_type, int operation, int root,
                               nccl_abi::Comm comm, cudaStream_t stream);
    nccl_abi::Result (*Broadcast)(const void *send, void *receive, size_t count, int data_type, int root,
                                  nccl_abi::Comm comm, cudaStream_t stream);
    const char *(*GetErrorString)(nccl_abi::Result result);
};

// Filled by nccl_library_open; all NULL before.
extern NcclLibrary nccl;

// Opens the library ($MARLHF_NCCL_LIBRARY if set, else libnccl.so.2, found as the dynamic
// loader finds libraries: LD_LIBRARY_PATH, the binary's run path, the system's) and
// resolves the functions. 0, or -1 with err_set() naming the library or the missing
// function. Once it succeeded, later calls return 0. The emulated backend
// (tests/emulated_cuda/nccl.cpp) provides its own.
extern "C" int nccl_library_open(void);
