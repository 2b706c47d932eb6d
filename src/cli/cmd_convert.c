// marlhf convert IN OUT: a GGUF file or Hugging Face folder in, a Hugging Face folder out.
#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "io/fs.h"
#include "model/weights_io.h"

int cmd_convert(int argc, char **argv) {
    long threads = 0;
    bool overwrite = false;
    Option options[] = {
        {"threads", NULL, OPT_INT, &threads, "CPU threads (0 = all cores)", false, false},
        {"overwrite", NULL, OPT_BOOL, &overwrite, "replace OUT if it exists", false, false},
    };
    const char *positional[2] = {0};
    OptionSet set = {"convert", "Convert a GGUF file or Hugging Face folder into a Hugging Face folder.",
                     "marlhf convert IN OUT", options, sizeof options / sizeof options[0],
                     positional, 2, 0};
    options_parse(&set, argc, argv);
    if (set.num_positional != 2) die_user("convert needs IN and OUT (marlhf convert --help)");
    cli_set_threads(threads);
    const char *in = positional[0], *out = positional[1];
    if (fs_exists(out) && !overwrite)
        die_user("output already exists; pass --overwrite to replace it (%s)", out);
    Model model;
    ModelLoadOptions load = {.with_lm_head = true};
    if (model_load(&model, in, &ops_cpu, &load) != 0) die_from_err();
    const char *tokenizer_source = fs_is_dir(in) ? in : NULL;
    if (model_save_hf(&model, out, tokenizer_source) != 0) die_from_err();
    fprintf(stderr, "wrote %s (%s, %ld parameters)\n", out, model.config.model_type, model_num_params(&model));
    model_free(&model);
    return 0;
}
