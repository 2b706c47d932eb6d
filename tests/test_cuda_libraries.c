// The CUDA build's libraries that are opened when first needed, not linked: cuBLASLt when
// the CUDA backend opens (ops/cuda/cublaslt_library.cuh), NCCL when GPU ranks first sum
// (ops/cuda/nccl_library.cuh). So a CPU run never maps the 500 MB cuBLASLt, and a machine
// without NCCL runs everything else: neither is in this process's memory at the start,
// each is after its open (which needs the library, not a GPU). A library named in
// MARLHF_NCCL_LIBRARY that cannot be loaded is an error naming it; where the default
// libnccl.so.2 is not installed the NCCL half says SKIP (such a machine sums through host
// memory, dist/model_sync.c). A build without CUDA has nothing to check and runs no test.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "ops/ops.h"
#include "test.h"

#ifdef MARLHF_CUDA
// Whether a file whose path contains `name` is mapped into this process.
static bool mapped(const char *name) {
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return false;
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, maps)) found = strstr(line, name) != NULL;
    fclose(maps);
    return found;
}

static void test_cublaslt_opened_on_demand(void) {
    EXPECT(!mapped("libcublasLt"), "libcublasLt is mapped before the CUDA backend opens (linked, not loaded on demand)");
    EXPECT(cublaslt_library_open() == 0, "cublaslt_library_open: %s", err_msg());
    EXPECT(mapped("libcublasLt"), "libcublasLt is not mapped after cublaslt_library_open");
    EXPECT(cublaslt_library_open() == 0, "a second cublaslt_library_open: %s", err_msg());
}

static void test_nccl_named_library_missing(void) {
    setenv("MARLHF_NCCL_LIBRARY", "no-such-dir/libnccl-missing.so.2", 1);
    EXPECT(nccl_library_open() == -1, "a missing library opened");
    EXPECT(strstr(err_msg(), "libnccl-missing.so.2") && strstr(err_msg(), "MARLHF_NCCL_LIBRARY"),
           "the error does not name the file and the variable: %s", err_msg());
    unsetenv("MARLHF_NCCL_LIBRARY");
}

static void test_nccl_opened_on_demand(void) {
    EXPECT(!mapped("libnccl"), "libnccl is mapped before anything opened it (linked, not loaded on demand)");
    if (nccl_library_open() != 0) {
        printf("SKIP test_nccl_opened_on_demand: %s\n", err_msg());
        return;
    }
    EXPECT(mapped("libnccl"), "libnccl is not mapped after nccl_library_open");
    EXPECT(nccl_library_open() == 0, "a second nccl_library_open: %s", err_msg());
}
#endif

int main(void) {
#ifdef MARLHF_CUDA
    RUN(test_cublaslt_opened_on_demand);
    RUN(test_nccl_named_library_missing);
    RUN(test_nccl_opened_on_demand);
#else
    (void)test_current_failures, (void)test_total_passed; // no test: the harness's counters go unused
#endif
    TEST_EXIT();
}
