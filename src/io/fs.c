#include "io/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/check.h"

char *fs_join(const char *dir, const char *name) {
    if (name[0] == '/' || dir[0] == '\0') return xstrdup(name);
    size_t dir_len = strlen(dir), name_len = strlen(name);
    bool has_slash = dir[dir_len - 1] == '/';
    char *joined = xmalloc(dir_len + name_len + 2);
    memcpy(joined, dir, dir_len);
    size_t at = dir_len;
    if (!has_slash) joined[at++] = '/';
    memcpy(joined + at, name, name_len + 1);
    return joined;
}

char *fs_dirname(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--; // "a/b/" names "a/b"
    while (n > 0 && path[n - 1] != '/') n--; // drop the last component
    if (n == 0) return xstrdup(".");
    while (n > 1 && path[n - 1] == '/') n--; // and the separators before it
    char *dir = xmalloc(n + 1);
    memcpy(dir, path, n);
    dir[n] = '\0';
    return dir;
}

bool fs_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

bool fs_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool fs_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int fs_mkdir_p(const char *path) {
    if (path[0] == '\0') return err_set("cannot create a folder with an empty path");
    char *partial = xstrdup(path);
    size_t n = strlen(partial);
    // Visit every prefix that ends at a separator, then the whole path.
    for (size_t i = 1; i <= n; i++) {
        if (i < n && partial[i] != '/') continue;
        if (i < n && partial[i - 1] == '/') continue; // "a//b"
        char saved = partial[i];
        partial[i] = '\0';
        if (mkdir(partial, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            err_set("cannot create folder '%s': %s (%s)", partial, strerror(e), path);
            free(partial);
            return -1;
        }
        if (!fs_is_dir(partial)) {
            err_set("cannot create folder: '%s' exists and is not a folder (%s)", partial, path);
            free(partial);
            return -1;
        }
        partial[i] = saved;
    }
    free(partial);
    return 0;
}

int fs_read_file(const char *path, size_t max_size, char **data, size_t *size) {
    *data = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set("cannot open file: %s (%s)", strerror(errno), path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return err_set("cannot stat file: %s (%s)", strerror(e), path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set("not a regular file (%s)", path);
    }
    if ((uint64_t)st.st_size > (uint64_t)max_size) {
        close(fd);
        return err_set("file has %lld bytes, more than the limit of %zu (%s)", (long long)st.st_size,
                       max_size, path);
    }
    size_t expected = (size_t)st.st_size;
    char *buffer = xmalloc(expected + 1);
    size_t done = 0;
    // Read until EOF rather than trusting st_size alone: the file may change under us.
    for (;;) {
        if (done == expected) {
            char probe;
            ssize_t extra = read(fd, &probe, 1);
            if (extra == 0) break;
            if (extra < 0 && errno == EINTR) continue;
            free(buffer);
            close(fd);
            if (extra < 0) return err_set("cannot read file: %s (%s)", strerror(errno), path);
            return err_set("file grew while being read (%s)", path);
        }
        ssize_t got = read(fd, buffer + done, expected - done);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int e = errno;
            free(buffer);
            close(fd);
            return err_set("cannot read file: %s (%s)", strerror(e), path);
        }
        if (got == 0) break; // shrank: take what is there
        done += (size_t)got;
    }
    close(fd);
    buffer[done] = '\0';
    *data = buffer;
    *size = done;
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path) == 0 ? 0 : errno;
}

int fs_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        return err_set("cannot remove: %s (%s)", strerror(errno), path);
    }
    int rc = nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (rc != 0) return err_set("cannot remove: %s (%s)", strerror(rc > 0 ? rc : errno), path);
    return 0;
}

int fs_fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return err_set("cannot open folder to sync it: %s (%s)", strerror(errno), path);
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    // Some filesystems cannot fsync a folder at all; that is not our failure to report.
    if (rc != 0 && e != EINVAL && e != ENOTSUP)
        return err_set("cannot sync folder: %s (%s)", strerror(e), path);
    return 0;
}

static char *temporary_name(const char *path, const char *tag) {
    size_t n = strlen(path) + strlen(tag) + 32;
    char *name = xmalloc(n);
    snprintf(name, n, "%s.%s-%ld", path, tag, (long)getpid());
    return name;
}

static void atomic_file_release(FsAtomicFile *file) {
    if (file->fd >= 0) {
        close(file->fd);
        unlink(file->tmp_path);
    }
    file->fd = -1;
    free(file->path);
    free(file->tmp_path);
    file->path = file->tmp_path = NULL;
}

int fs_atomic_file_begin(FsAtomicFile *file, const char *path) {
    file->fd = -1;
    file->path = file->tmp_path = NULL;
    if (fs_is_dir(path)) return err_set("cannot write file: a folder is in the way (%s)", path);
    char *tmp_path = temporary_name(path, "tmp");
    int fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        int e = errno;
        free(tmp_path);
        return err_set("cannot create file: %s (%s)", strerror(e), path);
    }
    file->fd = fd;
    file->path = xstrdup(path);
    file->tmp_path = tmp_path;
    return 0;
}

int fs_atomic_file_write(FsAtomicFile *file, const void *data, size_t size) {
    CHECK(file->fd >= 0, "write to a released atomic file");
    const char *bytes = data;
    while (size > 0) {
        ssize_t written = write(file->fd, bytes, size);
        if (written < 0 && errno == EINTR) continue;
        if (written <= 0) {
            int e = written < 0 ? errno : EIO;
            err_set("cannot write file: %s (%s)", strerror(e), file->path);
            atomic_file_release(file);
            return -1;
        }
        bytes += written;
        size -= (size_t)written;
    }
    return 0;
}

int fs_atomic_file_commit(FsAtomicFile *file) {
    CHECK(file->fd >= 0, "commit of a released atomic file");
    if (fsync(file->fd) != 0) {
        err_set("cannot sync file: %s (%s)", strerror(errno), file->path);
        atomic_file_release(file);
        return -1;
    }
    int fd = file->fd;
    file->fd = -1;
    if (close(fd) != 0) {
        err_set("cannot close file: %s (%s)", strerror(errno), file->path);
        unlink(file->tmp_path);
        atomic_file_release(file);
        return -1;
    }
    if (rename(file->tmp_path, file->path) != 0) {
        err_set("cannot rename temporary file into place: %s (%s)", strerror(errno), file->path);
        unlink(file->tmp_path);
        atomic_file_release(file);
        return -1;
    }
    char *dir = fs_dirname(file->path);
    int rc = fs_fsync_dir(dir);
    free(dir);
    atomic_file_release(file);
    return rc;
}

void fs_atomic_file_abort(FsAtomicFile *file) { atomic_file_release(file); }

int fs_write_file_atomic(const char *path, const void *data, size_t size) {
    FsAtomicFile file;
    if (fs_atomic_file_begin(&file, path) != 0) return -1;
    if (fs_atomic_file_write(&file, data, size) != 0) return -1;
    return fs_atomic_file_commit(&file);
}

// --- atomic folder -------------------------------------------------------------

static void atomic_dir_release(FsAtomicDir *dir) {
    free(dir->path);
    free(dir->tmp_path);
    dir->path = dir->tmp_path = NULL;
}

int fs_atomic_dir_begin(FsAtomicDir *dir, const char *path) {
    dir->path = dir->tmp_path = NULL;
    if (fs_exists(path) && !fs_is_dir(path))
        return err_set("cannot write folder: a file is in the way (%s)", path);
    char *parent = fs_dirname(path);
    int rc = fs_mkdir_p(parent);
    free(parent);
    if (rc != 0) return -1;
    char *tmp_path = temporary_name(path, "tmp");
    if (fs_remove_tree(tmp_path) != 0 || mkdir(tmp_path, 0777) != 0) {
        if (fs_exists(tmp_path)) fs_remove_tree(tmp_path);
        err_set("cannot create temporary folder '%s': %s (%s)", tmp_path, strerror(errno), path);
        free(tmp_path);
        return -1;
    }
    dir->path = xstrdup(path);
    dir->tmp_path = tmp_path;
    return 0;
}

static int sync_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    if (type != FTW_F && type != FTW_DP) return 0; // symlinks and the like: nothing to sync
    int fd = open(path, (type == FTW_DP ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return errno;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL && e != ENOTSUP) return e;
    return 0;
}

int fs_atomic_dir_commit(FsAtomicDir *dir) {
    CHECK(dir->path && dir->tmp_path, "commit of a released atomic folder");
    int rc = nftw(dir->tmp_path, sync_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (rc != 0) {
        err_set("cannot sync folder contents: %s (%s)", strerror(rc > 0 ? rc : errno), dir->path);
        fs_atomic_dir_abort(dir);
        return -1;
    }
    char *parent = fs_dirname(dir->path);
    if (!fs_exists(dir->path)) {
        if (rename(dir->tmp_path, dir->path) != 0) {
            err_set("cannot rename temporary folder into place: %s (%s)", strerror(errno), dir->path);
            free(parent);
            fs_atomic_dir_abort(dir);
            return -1;
        }
    } else if (!fs_is_dir(dir->path)) {
        err_set("cannot replace: not a folder (%s)", dir->path);
        free(parent);
        fs_atomic_dir_abort(dir);
        return -1;
    } else if (renameat2(AT_FDCWD, dir->tmp_path, AT_FDCWD, dir->path, RENAME_EXCHANGE) == 0) {
        // The old contents now live at tmp_path. Make the swap durable before deleting them.
        if (fs_fsync_dir(parent) != 0) {
            free(parent);
            atomic_dir_release(dir);
            return -1;
        }
        int removed = fs_remove_tree(dir->tmp_path);
        free(parent);
        atomic_dir_release(dir);
        return removed;
    } else if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
        err_set("cannot swap new folder into place: %s (%s)", strerror(errno), dir->path);
        free(parent);
        fs_atomic_dir_abort(dir);
        return -1;
    } else {
        // No RENAME_EXCHANGE on this filesystem: move the old folder aside first.
        char *old_path = temporary_name(dir->path, "old");
        if (fs_remove_tree(old_path) != 0 || rename(dir->path, old_path) != 0) {
            err_set("cannot move old folder aside: %s (%s)", strerror(errno), dir->path);
            free(old_path);
            free(parent);
            fs_atomic_dir_abort(dir);
            return -1;
        }
        if (rename(dir->tmp_path, dir->path) != 0) {
            int e = errno;
            rename(old_path, dir->path); // put the old one back
            err_set("cannot rename temporary folder into place: %s (%s)", strerror(e), dir->path);
            free(old_path);
            free(parent);
            fs_atomic_dir_abort(dir);
            return -1;
        }
        if (fs_fsync_dir(parent) != 0) {
            free(old_path);
            free(parent);
            atomic_dir_release(dir);
            return -1;
        }
        int removed = fs_remove_tree(old_path);
        free(old_path);
        free(parent);
        atomic_dir_release(dir);
        return removed;
    }
    rc = fs_fsync_dir(parent);
    free(parent);
    atomic_dir_release(dir);
    return rc;
}

void fs_atomic_dir_abort(FsAtomicDir *dir) {
    if (dir->tmp_path) {
        // Keep the caller's error message: cleanup failure is secondary.
        char saved[1024];
        snprintf(saved, sizeof saved, "%s", err_msg());
        fs_remove_tree(dir->tmp_path);
        err_set("%s", saved);
    }
    atomic_dir_release(dir);
}
