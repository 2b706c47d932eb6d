#include <cblas.h>
#include <omp.h>

#include "cli/commands.h"

void cli_set_threads(long threads) {
    if (threads <= 0) return; // keep the OpenMP default: one thread per core
    omp_set_num_threads((int)threads);
    openblas_set_num_threads((int)threads);
}
