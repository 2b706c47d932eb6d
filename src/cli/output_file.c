#include "cli/output_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"

static char *pending_tmp_path; // the temporary while it is being written

static void remove_pending_output(void) {
    if (pending_tmp_path) unlink(pending_tmp_path);
}

FILE *cli_output_open(const char *path) {
    if (strcmp(path, "-") == 0) return stdout;
    CHECK(!pending_tmp_path, "cli_output_open: a second output file (%s) in one process", path);
    pending_tmp_path = xmalloc(strlen(path) + 32);
    sprintf(pending_tmp_path, "%s.tmp-%d", path, (int)getpid());
    cleanup_register(remove_pending_output);
    FILE *out = fopen(pending_tmp_path, "w");
    if (!out) die_user("cannot write %s: %s", path, strerror(errno));
    return out;
}

void cli_output_commit(FILE *out, const char *path) {
    if (out == stdout) return;
    if (fclose(out) != 0 || rename(pending_tmp_path, path) != 0) die_user("cannot write %s: %s", path, strerror(errno));
    free(pending_tmp_path);
    pending_tmp_path = NULL;
}
