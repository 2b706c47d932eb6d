#include <cblas.h>
#include <omp.h>

#include "cli/commands.h"
#include "dist/dist.h"

void cli_set_threads(long threads) {
    if (threads <= 0) {
        // The OpenMP default is one thread per core; several ranks of one mpirun job on
        // this machine share its cores instead of each taking all of them.
        int ranks_here = dist_local_size();
        if (ranks_here <= 1) return;
        threads = omp_get_num_procs() / ranks_here;
        if (threads < 1) threads = 1;
    }
    omp_set_num_threads((int)threads);
    openblas_set_num_threads((int)threads);
}
