// The smallest program on the embedding API: load a model, generate one response.
//
//   build/examples/generate MODEL PROMPT [--chat] [--max-new-tokens N] [--temperature T] [--seed S]
//
// With the same options it prints what `marlhf generate` puts in "response" for the same
// prompt (tests/cli/embedding.sh checks that).
#include <marlhf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void) {
    fprintf(stderr, "usage: generate MODEL PROMPT [--chat] [--max-new-tokens N] [--temperature T] [--seed S]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 3) return usage();
    marlhf_generate_params params = marlhf_generate_default_params();
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--chat")) params.chat = 1;
        else if (!strcmp(argv[i], "--max-new-tokens") && i + 1 < argc) params.max_new_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--temperature") && i + 1 < argc) params.temperature = strtof(argv[++i], NULL);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) params.seed = strtoull(argv[++i], NULL, 10);
        else return usage();
    }
    if (marlhf_api_version() != MARLHF_API_VERSION) {
        fprintf(stderr, "generate: library API %d, header %d\n", marlhf_api_version(), MARLHF_API_VERSION);
        return 1;
    }
    marlhf_model_params model_params = marlhf_model_default_params();
    marlhf_model *model = marlhf_model_load(argv[1], &model_params);
    if (!model) {
        fprintf(stderr, "generate: %s\n", marlhf_last_error());
        return 2;
    }
    char *response = marlhf_generate(model, argv[2], &params);
    if (!response) {
        fprintf(stderr, "generate: %s\n", marlhf_last_error());
        marlhf_model_free(model);
        return 2;
    }
    printf("%s\n", response);
    marlhf_free(response);
    marlhf_model_free(model);
    return 0;
}
