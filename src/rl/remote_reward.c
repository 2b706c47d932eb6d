#include "rl/remote_reward.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "eval/http_client.h"

struct RemoteReward {
    HttpClient *client;
    char *url;
};

int remote_reward_open(RemoteReward **out, const char *url, double timeout_seconds, int retries) {
    *out = NULL;
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
        return err_set("--reward-url must start with http:// or https://, got '%s'", url);
    RemoteReward *reward = xcalloc(1, sizeof *reward);
    reward->url = xstrdup(url);
    HttpClientOptions options = {.url = url,
                                 .api_key = NULL,
                                 .timeout_s = timeout_seconds,
                                 .retries = retries,
                                 .backoff_s = 1,
                                 .max_backoff_s = 30};
    reward->client = http_client_new(&options);
    *out = reward;
    return 0;
}

void remote_reward_close(RemoteReward *reward) {
    if (!reward) return;
    http_client_free(reward->client);
    free(reward->url), free(reward);
}

char *remote_reward_label(const char *row, const char *key) {
    if (!row || !key) return NULL;
    json_t *root = json_loads(row, 0, NULL);
    json_t *value = json_is_object(root) ? json_object_get(root, key) : NULL;
    char *text = value ? json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(root);
    if (!text) return NULL;
    char *copy = xstrdup(text); // jansson's allocation, handed out as ours
    free(text);
    return copy;
}

int remote_reward_parse_answer(const char *body, int count, double *scores) {
    json_t *root = json_loads(body, 0, NULL);
    json_t *rewards = json_is_object(root) ? json_object_get(root, "rewards") : NULL;
    int rc = 0;
    if (!json_is_array(rewards)) {
        rc = err_set("the answer has no \"rewards\" list");
    } else if (json_array_size(rewards) != (size_t)count) {
        rc = err_set("%zu rewards for %d queries", json_array_size(rewards), count);
    } else {
        for (int i = 0; i < count && rc == 0; i++) {
            json_t *value = json_array_get(rewards, i);
            if (json_is_number(value) && isfinite(json_number_value(value))) scores[i] = json_number_value(value);
            else rc = err_set("rewards[%d] is not a finite number", i);
        }
    }
    json_decref(root);
    return rc;
}

// What an answer must be (remote_reward_parse_answer); http_post_json retries another.
typedef struct {
    int count;
    double *scores;
} Expected;

static bool accept_rewards(const char *body, void *context) {
    Expected *expected = context;
    return remote_reward_parse_answer(body, expected->count, expected->scores) == 0;
}

static int score_chunk(RemoteReward *reward, int count, const char *const *prompts, const char *const *responses,
                       const char *const *labels_json, double *scores) {
    json_t *queries = json_array(), *prompt_list = json_array(), *labels = json_array();
    for (int i = 0; i < count; i++) {
        size_t prompt_bytes = strlen(prompts[i]), response_bytes = strlen(responses[i]);
        char *query = xmalloc(prompt_bytes + response_bytes + 1);
        memcpy(query, prompts[i], prompt_bytes);
        memcpy(query + prompt_bytes, responses[i], response_bytes + 1);
        json_array_append_new(queries, json_string(query));
        json_array_append_new(prompt_list, json_string(prompts[i]));
        json_t *label = labels_json && labels_json[i] ? json_loads(labels_json[i], JSON_DECODE_ANY, NULL) : NULL;
        json_array_append_new(labels, label ? label : json_null());
        free(query);
    }
    json_t *root = json_pack("{s:o, s:o, s:o}", "query", queries, "prompts", prompt_list, "labels", labels);
    char *body = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    CHECK(body, "a reward request could not be written as JSON (text that is not UTF-8?)");
    Expected expected = {count, scores};
    char *answer = NULL;
    int rc = http_post_json(reward->client, body, accept_rewards, &expected, &answer);
    free(body), free(answer);
    return rc;
}

int remote_reward_score(RemoteReward *reward, int count, const char *const *prompts, const char *const *responses,
                        const char *const *labels_json, double *scores) {
    for (int first = 0; first < count; first += REMOTE_REWARD_CHUNK) {
        int n = count - first < REMOTE_REWARD_CHUNK ? count - first : REMOTE_REWARD_CHUNK;
        if (score_chunk(reward, n, prompts + first, responses + first, labels_json ? labels_json + first : NULL,
                        scores + first) != 0)
            return -1;
    }
    return 0;
}
