// marlhf report: an HTML page of one or more runs' metrics and samples (eval/report.c).
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "eval/report.h"
#include "io/fs.h"

int cmd_report(int argc, char **argv) {
    char *output = NULL, *title = "marlhf run report";
    Option options[] = {
        {"output", NULL, OPT_STRING, &output, "the HTML file (default: FIRST_RUN/report.html)", false, false},
        {"title", NULL, OPT_STRING, &title, "the page title", false, false},
    };
    const char *runs[16];
    OptionSet set = {"report", "A self-contained HTML page with every metric of one or more runs, overlaid, and their samples.",
                     "marlhf report RUN_DIR [RUN_DIR ...] [--output FILE.html]", options,
                     sizeof options / sizeof options[0], runs, 16, 0};
    options_parse(&set, argc, argv);
    if (set.num_positional == 0) die_user("give one or more run folders: marlhf report RUN_DIR ... (--help)");
    char *default_output = NULL;
    if (!output) output = default_output = fs_join(runs[0], "report.html");
    if (report_write(runs, set.num_positional, output, title) != 0) die_from_err();
    fprintf(stderr, "report: %s\n", output);
    free(default_output);
    return 0;
}
