// marlhf convert IN OUT: a GGUF file or Hugging Face folder in; a Hugging Face folder out,
// or, when OUT ends in .gguf, one GGUF file for llama.cpp (--outtype
// f32|f16|q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl|iq4_xs|q2_k|q3_k_m|q4_k_m|q5_k_m).
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "io/fs.h"
#include "io/gguf.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "tokenizer/tokenizer.h"

// Whether the GGUF file holds a tokenizer (tokenizer.ggml.model).
static bool gguf_has_tokenizer(const char *path) {
    GgufFile f;
    if (!path_is_gguf(path) || gguf_open(&f, path) != 0) return false;
    bool has = gguf_find(&f, "tokenizer.ggml.model") != NULL;
    gguf_close(&f);
    return has;
}

int cmd_convert(int argc, char **argv) {
    long threads = 0;
    bool overwrite = false;
    char *outtype = "f16", *lora_adapter = NULL;
    bool adapter_only = false;
    Option options[] = {
        {"threads", NULL, OPT_INT, &threads, "CPU threads (0 = all cores)", false, false},
        {"overwrite", NULL, OPT_BOOL, &overwrite, "replace OUT if it exists", false, false},
        {"outtype", NULL, OPT_STRING, &outtype,
         "GGUF output: f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q2_k, q3_k_m, q4_k_m or q5_k_m for the matrices (vectors stay f32), as llama.cpp's tools", false, false},
        {"lora-adapter", "lora_path", OPT_STRING, &lora_adapter,
         "a saved LoRA adapter on IN: written merged into OUT, or alone with --adapter-only", false, false},
        {"adapter-only", "adapter_only", OPT_BOOL, &adapter_only,
         "with --lora-adapter and OUT.gguf: write only the adapter, as a llama.cpp LoRA file (llama-cli --lora)", false, false},
    };
    const char *positional[2] = {0};
    OptionSet set = {"convert", "Convert a GGUF file or Hugging Face folder into a Hugging Face folder, or into a GGUF file.",
                     "marlhf convert IN OUT_FOLDER | OUT.gguf [--outtype f16]", options, sizeof options / sizeof options[0],
                     positional, 2, 0};
    options_parse(&set, argc, argv);
    if (set.num_positional != 2) die_user("convert needs IN and OUT (marlhf convert --help)");
    cli_set_threads(threads);
    const char *in = positional[0], *out = positional[1];
    if (fs_exists(out) && !overwrite)
        die_user("output already exists; pass --overwrite to replace it (%s)", out);
    const size_t out_len = strlen(out);
    const bool to_gguf = out_len > 5 && !strcmp(out + out_len - 5, ".gguf");
    GgufOutType type;
    if (gguf_out_type_from_name(outtype, &type) != 0)
        die_user("option --outtype must be f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q2_k, q3_k_m, q4_k_m or "
                 "q5_k_m, got '%s'",
                 outtype);
    Model model;
    ModelLoadOptions load = {.with_lm_head = true};
    if (adapter_only && (!lora_adapter || !to_gguf))
        die_user("option --adapter-only needs --lora-adapter DIR and an OUT ending in .gguf");
    if (model_load(&model, in, &ops_cpu, &load) != 0) die_from_err();
    // A bitsandbytes 4-bit checkpoint loads with its own codes: written as its dequantized
    // floats (what PEFT's merge_and_unload on a 4-bit model saves).
    model_dequantize(&model);
    if (lora_adapter && model_load_lora_adapter(&model, lora_adapter, false, 0) != 0) die_user("%s", err_msg());
    if (adapter_only) {
        if (model_write_gguf_adapter(&model, out, type) != 0) die_from_err();
        fprintf(stderr, "wrote %s (LoRA adapter of rank %d for %s, %s)\n", out, model.lora.rank, in, outtype);
        model_free(&model);
        return 0;
    }
    if (to_gguf) {
        Tokenizer *tok;
        if (tokenizer_load(&tok, in) != 0) die_from_err();
        if (model_write_gguf(&model, tok, out, type) != 0) die_from_err();
        fprintf(stderr, "wrote %s (%s, %ld parameters, %s)\n", out, model.config.model_type, model_num_params(&model),
                outtype);
        tokenizer_free(tok);
        model_free(&model);
        return 0;
    }
    const char *tokenizer_source = fs_is_dir(in) ? in : NULL;
    // A GGUF keeps its tokenizer in metadata: write it as tokenizer.json + tokenizer_config.json
    // into a staging folder that model_save_hf copies from, so the tokenizer files are part of
    // the output folder's atomic commit. A GGUF without tokenizer metadata gets none.
    char *tokenizer_staging = NULL;
    if (!tokenizer_source && gguf_has_tokenizer(in)) {
        Tokenizer *tok;
        if (tokenizer_load(&tok, in) != 0) die_from_err();
        tokenizer_staging = xmalloc(strlen(out) + 48);
        sprintf(tokenizer_staging, "%s.tokenizer-tmp-%d", out, (int)getpid());
        if (fs_remove_tree(tokenizer_staging) != 0 || fs_mkdir_p(tokenizer_staging) != 0 ||
            tokenizer_write_hf(tok, tokenizer_staging) != 0) {
            fs_remove_tree(tokenizer_staging);
            die_from_err();
        }
        tokenizer_free(tok);
        tokenizer_source = tokenizer_staging;
    }
    int saved = model_save_hf(&model, out, tokenizer_source);
    if (tokenizer_staging) fs_remove_tree(tokenizer_staging), free(tokenizer_staging);
    if (saved != 0) die_from_err();
    fprintf(stderr, "wrote %s (%s, %ld parameters)\n", out, model.config.model_type, model_num_params(&model));
    model_free(&model);
    return 0;
}
