#include "eval/http_client.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core/check.h"

struct HttpClient {
    HttpClientOptions options;
    char *url, *api_key;
    CURL *curl; // one handle for every request, so a kept-alive connection is reused
};

// curl_global_init is not thread-safe and must precede every handle; clients are made
// from one thread (the command line), so a counter is enough.
static int global_users;

HttpClient *http_client_new(const HttpClientOptions *options) {
    if (global_users++ == 0) CHECK(curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK, "curl_global_init failed");
    HttpClient *client = xcalloc(1, sizeof *client);
    client->options = *options;
    client->url = xstrdup(options->url);
    client->api_key = options->api_key && *options->api_key ? xstrdup(options->api_key) : NULL;
    client->options.url = client->url, client->options.api_key = client->api_key;
    client->curl = curl_easy_init();
    CHECK(client->curl, "curl_easy_init failed");
    return client;
}

void http_client_free(HttpClient *client) {
    if (!client) return;
    curl_easy_cleanup(client->curl);
    if (client->api_key) memset(client->api_key, 0, strlen(client->api_key)); // keys do not linger in freed memory
    free(client->url), free(client->api_key), free(client);
    if (--global_users == 0) curl_global_cleanup();
}

typedef struct {
    char *data;
    size_t size, capacity;
} Buffer;

// Bodies larger than this are not an answer to a chat request; refusing them keeps a
// misbehaving server from exhausting memory.
#define MAX_BODY_BYTES ((size_t)64 << 20)

static size_t on_body(char *data, size_t size, size_t count, void *user) {
    Buffer *b = user;
    size_t n = size * count;
    if (b->size + n + 1 > MAX_BODY_BYTES) return 0; // aborts the transfer (CURLE_WRITE_ERROR)
    if (b->size + n + 1 > b->capacity) {
        while (b->size + n + 1 > b->capacity) b->capacity = b->capacity ? b->capacity * 2 : 4096;
        b->data = xrealloc(b->data, b->capacity);
    }
    memcpy(b->data + b->size, data, n);
    b->size += n;
    b->data[b->size] = '\0';
    return n;
}

// Reads "Retry-After: <seconds>" (the HTTP-date form is rare for APIs and ignored).
static size_t on_header(char *data, size_t size, size_t count, void *user) {
    size_t n = size * count;
    static const char name[] = "retry-after:";
    if (n > sizeof name - 1 && !strncasecmp(data, name, sizeof name - 1)) {
        char value[32];
        size_t length = n - (sizeof name - 1) < sizeof value - 1 ? n - (sizeof name - 1) : sizeof value - 1;
        memcpy(value, data + sizeof name - 1, length);
        value[length] = '\0';
        char *end;
        double seconds = strtod(value, &end);
        if (end != value && seconds >= 0 && isfinite(seconds)) *(double *)user = seconds;
    }
    return n;
}

static void sleep_seconds(double seconds) {
    if (seconds <= 0) return;
    struct timespec t = {(time_t)seconds, (long)((seconds - floor(seconds)) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

char *http_error_message(const char *body) {
    char *message = NULL;
    json_t *root = json_loads(body ? body : "", 0, NULL);
    if (root) {
        json_t *error = json_object_get(root, "error");
        const char *text = json_string_value(json_object_get(error, "message"));
        if (!text) text = json_string_value(error);
        if (!text) text = json_string_value(json_object_get(root, "message"));
        if (!text) text = json_string_value(json_object_get(root, "detail"));
        if (text) message = xstrdup(text);
        json_decref(root);
    }
    if (!message) message = xstrdup(body ? body : "");
    if (strlen(message) > 300) strcpy(message + 297, "...");
    for (char *p = message; *p; p++)
        if (*p == '\n' || *p == '\r' || *p == '\t') *p = ' ';
    return message;
}

int http_post_json(HttpClient *client, const char *json_body, HttpAcceptFn accept, void *context, char **response) {
    const HttpClientOptions *o = &client->options;
    CURL *curl = client->curl;
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Accept: application/json");
    // libcurl sends "Expect: 100-continue" for large bodies and waits for it; some small
    // servers never answer it, costing a second per request.
    headers = curl_slist_append(headers, "Expect:");
    if (client->api_key) {
        size_t size = strlen(client->api_key) + 32;
        char *line = xmalloc(size);
        snprintf(line, size, "Authorization: Bearer %s", client->api_key);
        headers = curl_slist_append(headers, line);
        memset(line, 0, size);
        free(line);
    }
    CHECK(headers, "curl_slist_append failed");

    char reason[512] = "";
    int attempts = o->retries + 1, rc = -1;
    double backoff = o->backoff_s;
    for (int attempt = 1; attempt <= attempts; attempt++) {
        Buffer body = {0};
        double retry_after = -1;
        char curl_error[CURL_ERROR_SIZE] = "";
        curl_easy_reset(curl);
        curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_error);
        curl_easy_setopt(curl, CURLOPT_URL, o->url);
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, json_body);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(json_body));
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
        curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(curl, CURLOPT_HEADERDATA, &retry_after);
        curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)ceil(o->timeout_s * 1000));
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L); // no SIGALRM for DNS timeouts: safe with threads
        curl_easy_setopt(curl, CURLOPT_USERAGENT, "marlhf");
        CURLcode code = curl_easy_perform(curl);
        long status = 0;
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
        const char *text = body.data ? body.data : "";
        if (code != CURLE_OK) {
            snprintf(reason, sizeof reason, "%s", curl_error[0] ? curl_error : curl_easy_strerror(code));
        } else if (status >= 200 && status < 300) {
            err_clear();
            if (!accept || accept(text, context)) {
                *response = body.data ? body.data : xstrdup("");
                body.data = NULL;
                rc = 0;
                break;
            }
            snprintf(reason, sizeof reason, "%s", err_msg()[0] ? err_msg() : "unusable answer");
        } else {
            char *message = http_error_message(text);
            if (status != 408 && status != 429 && status < 500) {
                err_set("HTTP %ld from %s: %s", status, o->url, message);
                free(message), free(body.data);
                break;
            }
            snprintf(reason, sizeof reason, "HTTP %ld: %s", status, message);
            free(message);
        }
        free(body.data);
        if (attempt == attempts) {
            err_set("no answer from %s after %d attempt%s: %s", o->url, attempts, attempts == 1 ? "" : "s", reason);
            break;
        }
        double wait = backoff;
        if (retry_after > wait) wait = retry_after;
        sleep_seconds(fmin(wait, o->max_backoff_s));
        backoff = fmin(backoff * 2, o->max_backoff_s);
    }
    curl_slist_free_all(headers);
    return rc;
}
