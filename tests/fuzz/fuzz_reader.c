// A libFuzzer target for one reader of tests/fuzz/readers.h, chosen at build time:
//   -DFUZZ_READER=read_gguf -DFUZZ_FILE='"x.gguf"' [-DFUZZ_FOLDER]
// `make fuzz` builds one per reader (build-fuzz/fuzz/<target>, the Makefile's FUZZ_TARGETS)
// with clang, libFuzzer, AddressSanitizer and UBSan, and seeds build-fuzz/corpus/<target>/
// from the fixtures; run one on its seed folder, e.g.
//   build-fuzz/fuzz/gguf -max_total_time=300 build-fuzz/corpus/gguf
// (docs/fuzzing.md). The readers take paths, so each input is written to a file first
// (in a folder of this process, beside the reader's companion files when FUZZ_FOLDER).
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz/readers.h"

static char folder[64], path[128];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!folder[0]) {
        snprintf(folder, sizeof folder, "/tmp/marlhf-fuzz-%d", (int)getpid());
        mkdir(folder, 0700);
        snprintf(path, sizeof path, "%s/%s", folder, FUZZ_FILE);
    }
    FILE *out = fopen(path, "wb");
    if (!out) return 0;
    fwrite(data, 1, size, out);
    fclose(out);
#ifdef FUZZ_FOLDER
    FUZZ_READER(folder);
#else
    FUZZ_READER(path);
#endif
    return 0;
}
