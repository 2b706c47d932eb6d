// The CUDA build opens cuBLASLt when the backend opens (ops/cuda/cublaslt_library.cuh), so
// a CPU run never maps the 500 MB library: not in this process's memory at the start, there
// after cublaslt_library_open (which needs the library, not a GPU). A build without CUDA
// has nothing to check and runs no test.
#include <stdbool.h>
#include <stdio.h>
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

static void test_opened_on_demand(void) {
    EXPECT(!mapped("libcublasLt"), "libcublasLt is mapped before the CUDA backend opens (linked, not loaded on demand)");
    EXPECT(cublaslt_library_open() == 0, "cublaslt_library_open: %s", err_msg());
    EXPECT(mapped("libcublasLt"), "libcublasLt is not mapped after cublaslt_library_open");
    EXPECT(cublaslt_library_open() == 0, "a second cublaslt_library_open: %s", err_msg());
}
#endif

int main(void) {
#ifdef MARLHF_CUDA
    RUN(test_opened_on_demand);
#else
    (void)test_current_failures, (void)test_total_passed; // no test: the harness's counters go unused
#endif
    TEST_EXIT();
}
