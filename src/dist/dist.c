#include "dist/dist.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

#ifdef MARLHF_MPI
#include <mpi.h>
#endif

static long collective_floats = 1L << 21;
static DistNcclSetting nccl_setting = DIST_NCCL_AUTO;
static int world_rank = 0;
static int world_size = 1;
static int local_size = 1;
#ifdef MARLHF_MPI
static bool mpi_started = false;
#endif

// The world size a process manager announced in the environment, or 0 if none did.
// Open MPI's mpirun, MPICH's hydra and Slurm's srun (PMI) each set one of these.
static int launcher_world_size(void) {
    const char *names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *value = getenv(names[i]);
        if (value && atoi(value) > 0) return atoi(value);
    }
    return 0;
}

#ifdef MARLHF_MPI
static int launcher_local_size(void) {
    const char *names[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *value = getenv(names[i]);
        if (value && atoi(value) > 0) return atoi(value);
    }
    return 1;
}
#endif

int dist_init(int *argc, char ***argv) {
    int announced = launcher_world_size();
    const char *floats = getenv("MARLHF_COLLECTIVE_FLOATS");
    if (floats) {
        char *end;
        long value = strtol(floats, &end, 10);
        if (*floats == '\0' || *end != '\0' || value < 1 || value > INT_MAX / 2)
            return err_set("environment variable MARLHF_COLLECTIVE_FLOATS must be a count in [1, %d], got '%s'",
                           INT_MAX / 2, floats);
        collective_floats = value;
    }
    const char *nccl = getenv("MARLHF_NCCL");
    if (nccl && *nccl) {
        if (!strcmp(nccl, "auto")) nccl_setting = DIST_NCCL_AUTO;
        else if (!strcmp(nccl, "1")) nccl_setting = DIST_NCCL_REQUIRED;
        else if (!strcmp(nccl, "0")) nccl_setting = DIST_NCCL_OFF;
        else return err_set("MARLHF_NCCL is '%s'; expected auto, 1 or 0 (environment)", nccl);
    }
#ifdef MARLHF_MPI
    // Slurm sets SLURM_NTASKS for a plain `marlhf` inside an allocation too; only an
    // MPI launcher's own variables (or PMI) mean we were started as one rank of many.
    bool launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
    if (!launched) return 0;
    int provided = 0;
    // FUNNELED: OpenMP threads compute, only the main thread calls MPI.
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return err_set("MPI_Init failed (started by mpirun with %d processes)", announced);
    mpi_started = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    // Errors are reported by marlhf itself, one line; a failed collective is a bug.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    local_size = launcher_local_size();
    if (world_size > 1) {
        char label[64];
        snprintf(label, sizeof label, "[rank %d of %d] ", world_rank, world_size);
        err_set_process_label(label);
    }
    return 0;
#else
    (void)argc, (void)argv;
    if (announced > 1 && (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK")))
        return err_set("this marlhf was built without MPI (make MPI=0 or no libopenmpi-dev), so it cannot run "
                       "as one of %d processes; rebuild with MPI or run one process", announced);
    return 0;
#endif
}

void dist_finalize(void) {
#ifdef MARLHF_MPI
    if (mpi_started) MPI_Finalize();
    mpi_started = false;
#endif
}

long dist_collective_floats(void) { return collective_floats; }
DistNcclSetting dist_nccl_setting(void) { return nccl_setting; }
int dist_rank(void) { return world_rank; }
int dist_world_size(void) { return world_size; }
int dist_local_size(void) { return local_size; }

#ifdef MARLHF_MPI
// MPI counts are ints: large broadcasts go in chunks.
static const long max_chunk = INT_MAX / 2;

static void reduce_in_place(void *values, long n, MPI_Datatype type, size_t element_size, MPI_Op op) {
    for (long first = 0; first < n; first += collective_floats) {
        long count = n - first < collective_floats ? n - first : collective_floats;
        char *chunk = (char *)values + (size_t)first * element_size;
        CHECK(MPI_Allreduce(MPI_IN_PLACE, chunk, (int)count, type, op, MPI_COMM_WORLD) == MPI_SUCCESS,
              "MPI_Allreduce of %ld values", count);
    }
}

static void sum_in_place(void *values, long n, MPI_Datatype type, size_t element_size) {
    reduce_in_place(values, n, type, element_size, MPI_SUM);
}
#endif

void dist_sum_floats(float *values, long n) {
#ifdef MARLHF_MPI
    if (world_size > 1) sum_in_place(values, n, MPI_FLOAT, sizeof(float));
#else
    (void)values, (void)n;
#endif
}

void dist_sum_doubles(double *values, long n) {
#ifdef MARLHF_MPI
    if (world_size > 1) sum_in_place(values, n, MPI_DOUBLE, sizeof(double));
#else
    (void)values, (void)n;
#endif
}

void dist_sum_ints(int *values, long n) {
#ifdef MARLHF_MPI
    if (world_size > 1) sum_in_place(values, n, MPI_INT, sizeof(int));
#else
    (void)values, (void)n;
#endif
}

void dist_max_ints(int *values, long n) {
#ifdef MARLHF_MPI
    if (world_size > 1) reduce_in_place(values, n, MPI_INT, sizeof(int), MPI_MAX);
#else
    (void)values, (void)n;
#endif
}

// One tag for requests (longs) and one for the floats that answer them, so that neither is
// taken for the other.
enum { TAG_LONGS = 71, TAG_FLOATS = 72 };

// A message of n longs (requests) or floats (their answers), each kind with its own tag.
static void send_values(const void *values, long n, bool floats, int to) {
#ifdef MARLHF_MPI
    CHECK(n <= INT_MAX, "message of %ld values is too large for MPI", n);
    CHECK(MPI_Send(values, (int)n, floats ? MPI_FLOAT : MPI_LONG, to, floats ? TAG_FLOATS : TAG_LONGS,
                   MPI_COMM_WORLD) == MPI_SUCCESS,
          "MPI_Send to rank %d", to);
#else
    (void)values, (void)n, (void)floats;
    CHECK(false, "a message to rank %d in a build without MPI", to);
#endif
}

static void receive_values(void *values, long n, bool floats, int from) {
#ifdef MARLHF_MPI
    CHECK(n <= INT_MAX, "message of %ld values is too large for MPI", n);
    CHECK(MPI_Recv(values, (int)n, floats ? MPI_FLOAT : MPI_LONG, from, floats ? TAG_FLOATS : TAG_LONGS,
                   MPI_COMM_WORLD, MPI_STATUS_IGNORE) == MPI_SUCCESS,
          "MPI_Recv from rank %d", from);
#else
    (void)values, (void)n, (void)floats;
    CHECK(false, "a message from rank %d in a build without MPI", from);
#endif
}

void dist_send_longs(const long *values, int n, int to) { send_values(values, n, false, to); }
void dist_receive_longs(long *values, int n, int from) { receive_values(values, n, false, from); }
void dist_send_floats(const float *values, long n, int to) { send_values(values, n, true, to); }
void dist_receive_floats(float *values, long n, int from) { receive_values(values, n, true, from); }

#ifdef MARLHF_MPI
// MPI's count and displacement arrays are ints: a shard of over 2^31 floats (8 GB) is
// beyond what one rank of this trainer holds.
static void int_counts(const long *counts, const long *displs, int **counts_out, int **displs_out) {
    *counts_out = xmalloc((size_t)world_size * sizeof(int));
    if (displs_out) *displs_out = xmalloc((size_t)world_size * sizeof(int));
    for (int r = 0; r < world_size; r++) {
        CHECK(counts[r] <= INT_MAX && (!displs || displs[r] <= INT_MAX), "shard of %ld floats is too large for MPI",
              counts[r]);
        (*counts_out)[r] = (int)counts[r];
        if (displs_out) (*displs_out)[r] = (int)displs[r];
    }
}
#endif

void dist_reduce_scatter_floats(const float *full, float *mine, const long *counts) {
#ifdef MARLHF_MPI
    if (world_size > 1) {
        int *c;
        int_counts(counts, NULL, &c, NULL);
        CHECK(MPI_Reduce_scatter(full, mine, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS,
              "MPI_Reduce_scatter");
        free(c);
        return;
    }
#endif
    memcpy(mine, full, (size_t)counts[0] * sizeof(float));
}

void dist_allgather_floats(float *full, const long *counts, const long *displs) {
#ifdef MARLHF_MPI
    if (world_size <= 1) return;
    int *c, *d;
    int_counts(counts, displs, &c, &d);
    CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, full, c, d, MPI_FLOAT, MPI_COMM_WORLD) == MPI_SUCCESS,
          "MPI_Allgatherv");
    free(c), free(d);
#else
    (void)full, (void)counts, (void)displs;
#endif
}

void dist_gather_bytes(const char *mine, long n, char **all, long *all_n) {
    *all = NULL, *all_n = 0;
#ifdef MARLHF_MPI
    if (world_size > 1) {
        CHECK(n <= INT_MAX, "%ld bytes are too many for one MPI gather", n);
        int count = (int)n, *counts = NULL, *displs = NULL;
        if (world_rank == 0) counts = xmalloc((size_t)world_size * sizeof(int)), displs = xmalloc((size_t)world_size * sizeof(int));
        CHECK(MPI_Gather(&count, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD) == MPI_SUCCESS, "MPI_Gather");
        long total = 0;
        if (world_rank == 0) {
            for (int r = 0; r < world_size; r++) {
                CHECK(total <= INT_MAX, "gathered output is too large for MPI");
                displs[r] = (int)total;
                total += counts[r];
            }
            *all = xmalloc((size_t)total + 1);
            (*all)[total] = '\0';
            *all_n = total;
        }
        CHECK(MPI_Gatherv(mine, count, MPI_BYTE, *all, counts, displs, MPI_BYTE, 0, MPI_COMM_WORLD) == MPI_SUCCESS,
              "MPI_Gatherv");
        free(counts), free(displs);
        return;
    }
#endif
    *all = xmalloc((size_t)n + 1);
    memcpy(*all, mine, (size_t)n);
    (*all)[n] = '\0';
    *all_n = n;
}

void dist_broadcast(void *data, size_t bytes, int root) {
#ifdef MARLHF_MPI
    if (world_size <= 1) return;
    for (size_t first = 0; first < bytes; first += (size_t)max_chunk) {
        size_t count = bytes - first < (size_t)max_chunk ? bytes - first : (size_t)max_chunk;
        CHECK(MPI_Bcast((char *)data + first, (int)count, MPI_BYTE, root, MPI_COMM_WORLD) == MPI_SUCCESS,
              "MPI_Bcast of %zu bytes", count);
    }
#else
    (void)data, (void)bytes, (void)root;
#endif
}

bool dist_find_shared_string(const char *mine, char *shared, size_t shared_bytes, int *first, int *second) {
    CHECK(!strchr(mine, '\n') && shared_bytes > 0, "dist_find_shared_string: a newline in '%s'", mine);
    // Rank 0 reads every rank's string, one a line, and finds the first pair.
    const size_t length = strlen(mine);
    char *line = xmalloc(length + 2);
    memcpy(line, mine, length);
    line[length] = '\n', line[length + 1] = '\0';
    char *all = NULL;
    long all_bytes = 0;
    dist_gather_bytes(line, (long)length + 1, &all, &all_bytes);
    free(line);
    int pair[2] = {-1, -1};
    if (all && world_size > 1) {
        char **strings = xmalloc((size_t)world_size * sizeof(char *));
        char *next = all;
        for (int r = 0; r < world_size; r++) {
            strings[r] = next;
            next = strchr(next, '\n');
            *next++ = '\0';
        }
        for (int a = 0; a < world_size && pair[0] < 0; a++)
            for (int b = a + 1; b < world_size && pair[0] < 0; b++)
                if (!strcmp(strings[a], strings[b])) pair[0] = a, pair[1] = b;
        if (pair[0] >= 0) snprintf(shared, shared_bytes, "%s", strings[pair[0]]);
        free(strings);
    }
    free(all);
    dist_broadcast(pair, sizeof pair, 0);
    if (pair[0] < 0) return false;
    dist_broadcast(shared, shared_bytes, 0);
    *first = pair[0], *second = pair[1];
    return true;
}

bool dist_any_failed(bool failed) {
#ifdef MARLHF_MPI
    if (world_size <= 1) return failed;
    int mine = failed ? 1 : 0, any = 0;
    CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) == MPI_SUCCESS, "MPI_Allreduce");
    return any != 0;
#else
    return failed;
#endif
}

bool dist_all_equal(unsigned long long value) {
#ifdef MARLHF_MPI
    if (world_size <= 1) return true;
    unsigned long long low = 0, high = 0;
    CHECK(MPI_Allreduce(&value, &low, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD) == MPI_SUCCESS,
          "MPI_Allreduce");
    CHECK(MPI_Allreduce(&value, &high, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD) == MPI_SUCCESS,
          "MPI_Allreduce");
    return low == high;
#else
    (void)value;
    return true;
#endif
}

DistChunks dist_chunks(long count, int chunk) {
    CHECK(chunk >= 1 && chunk <= 64, "dist_chunks: chunk %d", chunk);
    return (DistChunks){.next = (long)chunk * world_rank, .count = count, .stride = (long)chunk * world_size,
                        .chunk = chunk};
}

int dist_chunks_next(DistChunks *chunks, long *which) {
    if (chunks->next >= chunks->count) return 0;
    const long left = chunks->count - chunks->next;
    const int n = left < chunks->chunk ? (int)left : chunks->chunk;
    for (int i = 0; i < n; i++) which[i] = chunks->next + i;
    chunks->next += chunks->stride;
    return n;
}
