// Filesystem helpers: paths, whole-file reads, and crash-safe (atomic) writes.
//
// Every file marlhf produces (weights, configs, checkpoints, logs of record) goes
// through the atomic helpers below, so that a crash or a full disk at any moment
// leaves either the old complete file or the new complete file, never a torn one:
//
//   file:   write "<path>.tmp-<pid>" -> fsync it -> rename over <path> -> fsync the folder
//   folder: fill "<dir>.tmp-<pid>"   -> fsync its contents -> swap it into place
//
// The temporary name carries the process id so that two processes writing the same
// target do not clobber each other's temporary; two threads of one process must not
// write the same target at once. A crash can leave a stale "*.tmp-<pid>" behind; it
// is never mistaken for the real file and may be deleted at any time.
//
// Errors are user errors: -1 with err_set() naming the path (see core/check.h).
#pragma once
#include <stdbool.h>
#include <stddef.h>

// "dir/name" in a new xmalloc'd string (free() it). An absolute `name`, or an empty
// `dir`, gives a copy of `name`; a trailing '/' on `dir` is not doubled.
char *fs_join(const char *dir, const char *name);
// The folder part of `path` in a new xmalloc'd string: "a/b/c" -> "a/b", "c" -> ".",
// "/c" -> "/".
char *fs_dirname(const char *path);

bool fs_exists(const char *path);  // anything at all (follows symlinks)
bool fs_is_dir(const char *path);  // a folder (follows symlinks)
bool fs_is_file(const char *path); // a regular file (follows symlinks)

// Creates `path` and any missing parents (mode 0777 minus umask). An existing folder
// is fine; an existing non-folder is an error.
int fs_mkdir_p(const char *path);

// Reads the regular file `path` into a new xmalloc'd buffer with one extra NUL byte
// after the contents (so text can be used as a C string). Files larger than
// `max_size` bytes are refused, so a wrong path cannot exhaust memory.
int fs_read_file(const char *path, size_t max_size, char **data, size_t *size);

// Removes `path` and everything under it (does not follow symlinks). A missing path
// is not an error.
int fs_remove_tree(const char *path);

// fsyncs the folder itself, so that a rename or a new entry in it is durable.
int fs_fsync_dir(const char *path);

// --- atomic file ---------------------------------------------------------------
// A file written in pieces (e.g. a multi-gigabyte safetensors file) that appears at
// its final path only when complete:
//
//     FsAtomicFile f;
//     if (fs_atomic_file_begin(&f, path) != 0) return -1;
//     if (fs_atomic_file_write(&f, header, n) != 0) return -1;   // f released already
//     ...
//     return fs_atomic_file_commit(&f);
//
// After any call returns -1 the temporary file is already removed and `f` released,
// so the caller only returns; fs_atomic_file_abort() is for giving up on a file for
// reasons of the caller's own (it is a no-op on a released `f`).
typedef struct {
    char *path;     // final destination
    char *tmp_path; // "<path>.tmp-<pid>"
    int fd;         // -1 once released
} FsAtomicFile;

int fs_atomic_file_begin(FsAtomicFile *file, const char *path);
int fs_atomic_file_write(FsAtomicFile *file, const void *data, size_t size);
// fsync, close, rename into place, fsync the folder. Releases `file` either way.
int fs_atomic_file_commit(FsAtomicFile *file);
void fs_atomic_file_abort(FsAtomicFile *file);

// The whole file at once: begin + write + commit.
int fs_write_file_atomic(const char *path, const void *data, size_t size);

// --- atomic folder -------------------------------------------------------------
// A folder (e.g. a checkpoint) that appears at its final path only when complete:
//
//     FsAtomicDir d;
//     if (fs_atomic_dir_begin(&d, "runs/x/checkpoint-100") != 0) return -1;
//     ... write files under d.tmp_path (with the atomic file helpers or not) ...
//     if (failed) { fs_atomic_dir_abort(&d); return -1; }
//     return fs_atomic_dir_commit(&d);
//
// Commit fsyncs every file and folder under the temporary folder, then moves it into
// place. An existing folder at the final path is replaced with one atomic
// renameat2(RENAME_EXCHANGE) where the filesystem supports it, after which the old
// contents are removed. Where it does not, the old folder is first renamed aside to
// "<dir>.old-<pid>"; a crash in the short window between the two renames leaves no
// folder at <dir> but the complete old one at "<dir>.old-<pid>" and the complete new
// one at "<dir>.tmp-<pid>" — nothing is lost, though recovery is by hand.
typedef struct {
    char *path;     // final destination
    char *tmp_path; // "<path>.tmp-<pid>": fill this folder
} FsAtomicDir;

// Creates the parent folders if needed and a fresh, empty temporary folder (removing
// a stale one of the same name first).
int fs_atomic_dir_begin(FsAtomicDir *dir, const char *path);
// Releases `dir` either way; on failure the temporary folder is removed and an
// existing folder at the final path is left as it was.
int fs_atomic_dir_commit(FsAtomicDir *dir);
void fs_atomic_dir_abort(FsAtomicDir *dir);
