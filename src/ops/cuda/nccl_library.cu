#include "ops/cuda/nccl_library.cuh"

#include <stdio.h>
#include <stdlib.h>

#include "ops/cuda/library_symbols.cuh"

// Where the toolkit ships nccl.h (pip's CUDA 13 does), the declarations of
// nccl_library.cuh are checked against it; elsewhere they stand on NCCL 2's stable ABI.
#if __has_include(<nccl.h>)
#include <nccl.h>
static_assert(sizeof(ncclUniqueId) == sizeof(nccl_abi::UniqueId), "ncclUniqueId's size");
static_assert(NCCL_UNIQUE_ID_BYTES == nccl_abi::unique_id_bytes, "NCCL_UNIQUE_ID_BYTES");
static_assert(sizeof(ncclResult_t) == sizeof(nccl_abi::Result) && sizeof(ncclDataType_t) == sizeof(int) &&
                  sizeof(ncclRedOp_t) == sizeof(int),
              "NCCL's enums are not int-sized");
static_assert(ncclSuccess == nccl_abi::success && ncclFloat32 == nccl_abi::float32 && ncclSum == nccl_abi::sum,
              "NCCL's enum values");
#endif

NcclLibrary nccl;

static const char *library_name(void) {
    const char *named = getenv("MARLHF_NCCL_LIBRARY");
    return named && *named ? named : "libnccl.so.2";
}

template <typename Function> static bool resolve(void *library, const char *name, Function *function) {
    return resolve_function(library, library_name(), name, function, "NCCL 2.x expected");
}

extern "C" int nccl_library_open(void) {
    if (nccl.AllReduce) return 0;
    void *library = dlopen(library_name(), RTLD_NOW | RTLD_LOCAL);
    if (!library)
        return err_set("cannot load NCCL (%s); name its file in MARLHF_NCCL_LIBRARY or put its folder on "
                       "LD_LIBRARY_PATH",
                       dlerror());
    NcclLibrary found;
    const bool all = resolve(library, "ncclGetVersion", &found.GetVersion) &&
                     resolve(library, "ncclGetUniqueId", &found.GetUniqueId) &&
                     resolve(library, "ncclCommInitRank", &found.CommInitRank) &&
                     resolve(library, "ncclAllReduce", &found.AllReduce) &&
                     resolve(library, "ncclReduce", &found.Reduce) &&
                     resolve(library, "ncclBroadcast", &found.Broadcast) &&
                     resolve(library, "ncclGetErrorString", &found.GetErrorString);
    if (!all) {
        dlclose(library);
        return -1;
    }
    int version = 0; // 2.19 and later: major * 10000 + minor * 100 + patch
    found.GetVersion(&version);
    snprintf(found.description, sizeof found.description, "NCCL %d.%d.%d", version / 10000, version / 100 % 100,
             version % 100);
    nccl = found; // the library stays open for the process's life
    return 0;
}
