// A command's --output file: "-" is standard output; any other path is written as
// "<path>.tmp-<pid>" and renamed over the path only when the command has written all of
// it, so an error or an interrupt midway leaves a file already at that path as it was
// (the exit cleanup removes the temporary). One such file per process.
#pragma once
#include <stdio.h>

// Opens the output (dies with a one-line error naming `path` if it cannot be created).
FILE *cli_output_open(const char *path);
// Closes `out` and, for a path, renames the temporary into place (dies naming `path` if
// that fails).
void cli_output_commit(FILE *out, const char *path);
