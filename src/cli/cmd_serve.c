// marlhf serve: an OpenAI-compatible HTTP server for one model (serve/server.h has the
// routes and limits, serve/openai.h the schema), or with --reward-model a reward model
// behind OpenRLHF's /get_reward (serve/reward_api.h). Runs until SIGINT or SIGTERM, then
// answers what it can, closes every connection and exits 0.
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "gen/text_model.h"
#include "core/check.h"
#include "serve/listener.h"
#include "serve/server.h"

// The name a model is served under by default: the last component of its path.
static char *default_model_name(const char *path) {
    char *copy = xstrdup(path);
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
    const char *slash = strrchr(copy, '/');
    char *name = xstrdup(slash && slash[1] ? slash + 1 : copy);
    free(copy);
    return name;
}

int cmd_serve(int argc, char **argv) {
    const char *quantize = NULL; // quantize_default
    const char *kv_cache = "f32";
    const char *pooling_option = "mean";
    char *model_path = NULL, *reward_path = NULL, *host = "127.0.0.1", *model_name = NULL, *device = "cpu", *chat_template = NULL;
    long port = 8080, threads = 0, max_body_bytes = 1048576, max_tokens_limit = 2048, max_concurrent = 4;
    long request_timeout_s = 600, parallel = 4, prompt_cache = 0, prefill_chunk = 256, reward_batch = 16;
    char *lora_adapter = NULL;
    bool no_thinking = false;
    bool batch_invariant = false;
    Option options[] = {
        {"model", NULL, OPT_STRING, &model_path, "Hugging Face folder or .gguf file", false, false},
        {"reward-model", "reward_pretrain", OPT_STRING, &reward_path,
         "serve this reward model instead (value head): POST /get_reward scores texts (OpenRLHF's remote reward "
         "protocol; --parallel sequences per forward)",
         false, false},
        {"reward-batch", NULL, OPT_INT, &reward_batch,
         "with --reward-model: the most /get_reward requests that arrived while the model was busy scored together, "
         "their texts sorted by length into forwards of --parallel rows (1: one request at a time)",
         false, false},
        {"host", NULL, OPT_STRING, &host, "address to listen on", false, false},
        {"port", NULL, OPT_INT, &port, "TCP port (0 = any free port, printed when ready)", false, false},
        {"model-name", "model_name", OPT_STRING, &model_name, "name in the API (default: the model path's last component)", false, false},
        {"max-body-bytes", "max_body_bytes", OPT_INT, &max_body_bytes, "larger request bodies get 413", false, false},
        {"max-tokens-limit", "max_tokens_limit", OPT_INT, &max_tokens_limit, "largest max_tokens a request may ask for", false, false},
        {"max-concurrent", "max_concurrent", OPT_INT, &max_concurrent, "requests in progress or queued at once (generation and embeddings); more get 429", false, false},
        {"prompt-cache", "cache_prompt", OPT_INT, &prompt_cache,
         "finished answers kept for prompts that continue them: a chat's next turn computes only its new tokens "
         "(answers then depend on earlier requests up to float rounding; 0: off)",
         false, false},
        {"prefill-chunk", NULL, OPT_INT, &prefill_chunk,
         "prompt tokens prefilled per decode step: a long prompt joins over several steps while the running answers "
         "go on (0: a prompt's whole prefill at once, the others waiting)",
         false, false},
        {"parallel", "n_parallel", OPT_INT, &parallel, "rows of the continuous batch: requests' choices (OpenAI n), one row each, join it between decode steps and leave when they end (1: one at a time); also the /v1/embeddings inputs run per forward", false, false},
        {"request-timeout-s", "request_timeout_s", OPT_INT, &request_timeout_s, "seconds a request may wait and generate; then it is answered 503", false, false},
        {"chat-template", "chat_template", OPT_STRING, &chat_template, "chat template name or file (default: the model's own)", false, false},
        {"no-thinking", NULL, OPT_BOOL, &no_thinking,
         "render chat requests with enable_thinking=False (Qwen3: answers start after an empty think block)", false,
         false},
        {"lora-adapter", "lora_path", OPT_STRING, &lora_adapter,
         "a saved LoRA adapter applied to --model (a marlhf model folder or a PEFT adapter folder)", false, false},
        {"device", NULL, OPT_STRING, &device, "cpu (cuda when built with it)", false, false},
        {"quantize", NULL, OPT_STRING, &quantize, QUANTIZE_OPTION_HELP, false, false},
        {"kv-cache", NULL, OPT_STRING, &kv_cache, "f32, f16 or q8_0: the KV cache in half floats (half its memory) or in 8-bit blocks (about 0.28 of it): faster decoding of long contexts; the prompt itself is attended in f32", false, false},
        {"pooling", NULL, OPT_STRING, &pooling_option,
         "how /v1/embeddings pools a text's final hidden states: mean, last (the last token's) or cls (the first "
         "token's); the vector is then L2-normalised. none: no pooling, POST /embeddings (llama.cpp's route) answers "
         "every token's states unnormalised and /v1/embeddings refuses",
         false, false},
        {"threads", NULL, OPT_INT, &threads, "CPU threads (0 = all cores)", false, false},
        cli_batch_invariant_option(&batch_invariant),
    };
    OptionSet set = {"serve",
                     "Serve a model over HTTP with the OpenAI API (/v1/chat/completions, /v1/completions, /v1/embeddings, "
                     "/v1/models), "
                     "or a reward model with /get_reward.",
                     "marlhf serve --model PATH | --reward-model PATH [--host 127.0.0.1] [--port 8080]", options,
                     sizeof options / sizeof options[0], NULL, 0, 0};
    options_parse(&set, argc, argv);
    cli_set_batch_invariant(&set, device);
    if (port < 0 || port > 65535) die_user("--port must be in [0, 65535], got %ld", port);
    if (max_body_bytes < 64 || max_body_bytes > 1L << 30) die_user("--max-body-bytes must be in [64, 1073741824], got %ld", max_body_bytes);
    if (max_tokens_limit < 1 || max_tokens_limit > 1 << 20) die_user("--max-tokens-limit must be in [1, 1048576], got %ld", max_tokens_limit);
    if (max_concurrent < 1 || max_concurrent > 4096) die_user("--max-concurrent must be in [1, 4096], got %ld", max_concurrent);
    if (parallel < 1 || parallel > 256) die_user("--parallel must be in [1, 256], got %ld", parallel);
    if (prompt_cache < 0 || prompt_cache > 256) die_user("--prompt-cache must be in [0, 256], got %ld", prompt_cache);
    if (prefill_chunk < 0 || prefill_chunk > 1 << 20)
        die_user("--prefill-chunk must be in [0, 1048576] (0: whole prompts), got %ld", prefill_chunk);
    if (request_timeout_s < 1 || request_timeout_s > 86400) die_user("--request-timeout-s must be in [1, 86400], got %ld", request_timeout_s);
    if (reward_batch < 1 || reward_batch > 4096) die_user("--reward-batch must be in [1, 4096], got %ld", reward_batch);
    if (threads < 0 || threads > 4096) die_user("--threads must be in [0, 4096], got %ld", threads);
    if (model_name && !*model_name) die_user("--model-name must not be empty");
    quantize = quantize_default(quantize, model_path);
    if (quantize_type_check(quantize, "--quantize") != 0) die_from_err();
    if (kv_cache_type_set(NULL, kv_cache, "--kv-cache") != 0) die_from_err();
    Pooling pooling;
    if (pooling_parse(pooling_option, "--pooling", &pooling) != 0) die_from_err();
    if (!model_path == !reward_path) die_user("give one of --model (a generative model) and --reward-model");
    if (!reward_path && options_given(&set, "reward-batch"))
        die_user("option --reward-batch applies to --reward-model only (a generative server batches by --parallel)");
    if (reward_path) {
        static const char *const generation_only[] = {"chat-template", "no-thinking", "lora-adapter", "kv-cache",
                                                      "prompt-cache", "max-tokens-limit", "pooling",
                                                      "prefill-chunk"};
        for (size_t i = 0; i < sizeof generation_only / sizeof generation_only[0]; i++)
            if (options_given(&set, generation_only[i]))
                die_user("option --%s does not apply to --reward-model (it is for a generative model's routes)",
                         generation_only[i]);
    }
    cli_set_threads(threads);

    // The model: generative (TextModel) or a reward model with its tokenizer.
    TextModel tm = {0};
    Model reward_model;
    Tokenizer *reward_tokenizer = NULL;
    if (reward_path) {
        const OpsBackend *ops = ops_backend_by_name(device);
        if (!ops) die_from_err();
        ModelLoadOptions load = {.with_value_head = true, .require_value_head = true, .quantize = quantize};
        if (tokenizer_load(&reward_tokenizer, reward_path) != 0 || model_load(&reward_model, reward_path, ops, &load) != 0)
            die_from_err();
    } else {
        if (text_model_load(&tm, model_path, lora_adapter, device, quantize, chat_template,
                            chat_template != NULL || no_thinking) != 0)
            die_from_err();
        if (no_thinking && text_model_disable_thinking(&tm) != 0) die_user("--no-thinking: %s", err_msg());
        if (kv_cache_type_set(&tm.model, kv_cache, "--kv-cache") != 0) die_from_err();
        if (!tm.has_chat) fprintf(stderr, "serve: %s; /v1/chat/completions will answer 400\n", err_msg());
    }
    char *name = model_name ? xstrdup(model_name) : default_model_name(reward_path ? reward_path : model_path);

    // Every thread started from here on inherits the blocked signals, so only sigwait below
    // sees them and shutdown happens on this thread, in order.
    sigset_t stop_signals;
    listener_block_stop_signals(&stop_signals);

    ServerOptions server_options = {
        .host = host,
        .port = (int)port,
        .model_name = name,
        .max_body_bytes = max_body_bytes,
        .max_tokens_limit = (int)max_tokens_limit,
        .default_max_tokens = max_tokens_limit < 256 ? (int)max_tokens_limit : 256,
        .max_concurrent = (int)max_concurrent,
        .parallel = (int)parallel,
        .prompt_cache_rows = (int)prompt_cache,
        .prefill_chunk = (int)prefill_chunk,
        .request_timeout_s = (int)request_timeout_s,
        .threads = (int)threads,
        .pooling = pooling,
        .reward_batch = (int)reward_batch,
    };
    Server *server;
    if ((reward_path ? server_start_reward(&server, &reward_model, reward_tokenizer, &server_options)
                     : server_start(&server, &tm, &server_options)) != 0)
        die_from_err();
    bool ipv6_literal = strchr(host, ':') != NULL;
    fprintf(stderr, "serve: listening on http://%s%s%s:%d (%s %s)\n", ipv6_literal ? "[" : "", host,
            ipv6_literal ? "]" : "", server_port(server), reward_path ? "reward model" : "model", name);
    fflush(stderr);

    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    fprintf(stderr, "serve: %s, shutting down\n", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
    server_stop(server);
    fprintf(stderr, "serve: stopped\n");
    free(name);
    if (reward_path) {
        model_free(&reward_model);
        tokenizer_free(reward_tokenizer);
    } else {
        text_model_free(&tm);
    }
    return 0;
}
