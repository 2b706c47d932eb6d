// Data parallelism over processes: the handful of collectives the training loops need.
//
// marlhf scales past one machine the way DeepSpeed and torch DDP do: `mpirun -np W
// marlhf sft ...` starts W copies of the binary, each holding the whole model; every
// optimizer step each rank runs its share of the micro-batches, the gradients are summed
// across ranks, and every rank takes the same AdamW step, so the weights stay identical
// everywhere. Rank 0 alone writes metrics, checkpoints and the final model.
//
// MPI is initialised only when the process was started by a process manager (mpirun,
// srun: the environment says so); a plain `marlhf sft ...` is world size 1 and every
// function here is then a no-op, so the single-process path is exactly the code it was
// before data parallelism existed. A build without MPI (`make MPI=0`) is always world
// size 1 and refuses to run under mpirun with more than one process.
//
// Every collective is called by all ranks in the same order: a rank that skips one
// would hang the others, so callers never return early between collectives on one rank
// only (errors are agreed on first, see dist_any_failed).
#pragma once
#include <stdbool.h>
#include <stddef.h>

// Initialises MPI when launched by a process manager. Returns 0, or -1 with err_set()
// (a build without MPI started as one of several ranks). Call once, first thing in main.
int dist_init(int *argc, char ***argv);
// Ends MPI (no-op at world size 1). Call once before a normal exit.
void dist_finalize(void);

int dist_rank(void);
int dist_world_size(void);
static inline bool dist_is_main(void) { return dist_rank() == 0; }
// Processes of this job on this machine (1 when not under a process manager): the default
// thread count divides the cores among them.
int dist_local_size(void);

// The most elements one collective message carries (environment MARLHF_COLLECTIVE_FLOATS,
// default 2^21 = 8 MB of floats): larger arrays go in pieces, because MPI implementations
// allocate temporaries as large as a message, and a whole gradient buffer at once would
// double the memory it takes. The pieces change no result.
long dist_collective_floats(void);

// Whether ranks whose backend has collectives of its own (NCCL with --device cuda) sum
// gradients with them: environment MARLHF_NCCL, "auto" (or unset: when every rank can,
// else through host memory and MPI, with a note saying why), "1" (required: an error when
// a rank cannot) or "0" (never). dist_init refuses another value. dist/model_sync.c
// decides, with every rank, at the first sum.
typedef enum { DIST_NCCL_AUTO, DIST_NCCL_REQUIRED, DIST_NCCL_OFF } DistNcclSetting;
DistNcclSetting dist_nccl_setting(void);

// In-place sum across ranks of host arrays; every rank receives the same bits.
void dist_sum_floats(float *values, long n);
void dist_sum_doubles(double *values, long n);

// This rank's share of items [0, count) in chunks of `chunk` (at most 64): rank r takes
// chunks r, r + W, r + 2W, ... (all of them with one process). Evaluations and DPO's
// reference log-probs walk their rows this way and then sum their results across ranks:
//   DistChunks chunks = dist_chunks(count, 8);
//   long which[64];
//   for (int n; (n = dist_chunks_next(&chunks, which)) > 0;) work(which, n);
typedef struct {
    long next, count, stride;
    int chunk;
} DistChunks;
DistChunks dist_chunks(long count, int chunk);
// Fills which[0..n) with the next chunk's consecutive item indices and returns n (0 when done).
int dist_chunks_next(DistChunks *chunks, long *which);
void dist_sum_ints(int *values, long n);
// In place: each element's largest value over the ranks.
void dist_max_ints(int *values, long n);
// Shards of a host array split across ranks: rank r owns [displs[r], displs[r] + counts[r]).
// Sums `full` (every rank's whole array) and gives each rank its shard's sums in `mine`.
void dist_reduce_scatter_floats(const float *full, float *mine, const long *counts);
// In place: every rank's shard of `full` (already at its place) reaches every rank.
void dist_allgather_floats(float *full, const long *counts, const long *displs);
// Every rank's `n` bytes, concatenated in rank order, on rank 0: *all (xmalloc'd, NUL
// terminated) and *all_n. Elsewhere *all is NULL. One process: a copy of its own bytes.
void dist_gather_bytes(const char *mine, long n, char **all, long *all_n);
// Whether two ranks hold the same string (a GPU's address with its host's name: NCCL takes
// one GPU for each rank): true on every rank when they do, with the first such pair's
// ranks in *first < *second and their string in `shared` (at most shared_bytes, NUL
// terminated). `mine` holds no newline. False at world size 1.
bool dist_find_shared_string(const char *mine, char *shared, size_t shared_bytes, int *first, int *second);
// Copies `bytes` of host memory from rank `root` to every other rank.
void dist_broadcast(void *data, size_t bytes, int root);
// Point to point, for one rank's requests to another (dist/zero.c: rank 0 reads the other
// ranks' moment shards this way while writing a checkpoint). A receive expects exactly the
// count sent. Not available (an internal error) in a build without MPI.
void dist_send_longs(const long *values, int n, int to);
void dist_receive_longs(long *values, int n, int from);
void dist_send_floats(const float *values, long n, int to);
void dist_receive_floats(float *values, long n, int from);
// True on every rank when `failed` is true on any rank: how ranks agree to stop together
// after a step that can fail on one of them (rank 0 writing a checkpoint).
bool dist_any_failed(bool failed);
// True on every rank when `value` is the same on every rank.
bool dist_all_equal(unsigned long long value);
