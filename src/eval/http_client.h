// JSON POSTs to an HTTP(S) endpoint with libcurl: a time limit per attempt, and retries
// with exponential backoff where waiting can help (the endpoint unreachable or timing
// out, HTTP 408, 429 and 5xx, or a 2xx body the caller cannot use). Other 4xx answers
// fail at once with the server's own message: retrying a bad key or a bad request only
// delays the error.
//
// Errors are user errors: -1 with err_set() naming the URL (see core/check.h).
#pragma once
#include <stdbool.h>

typedef struct {
    const char *url;        // the full endpoint, e.g. "http://127.0.0.1:8080/v1/chat/completions"
    const char *api_key;    // sent as "Authorization: Bearer <key>"; NULL or "": no header
    double timeout_s;       // per attempt, connection included
    int retries;            // attempts after the first
    double backoff_s;       // the first wait; each further wait doubles, up to max_backoff_s
    double max_backoff_s;   // also bounds a server's Retry-After
} HttpClientOptions;

typedef struct HttpClient HttpClient;

// The options are copied. Never NULL (out of memory is an internal error).
HttpClient *http_client_new(const HttpClientOptions *options);
void http_client_free(HttpClient *client);

// Decides whether a 2xx body is usable. Returning false (after err_set() saying why)
// makes the attempt count as failed and be retried like a 5xx.
typedef bool (*HttpAcceptFn)(const char *body, void *context);

// POSTs `json_body` (Content-Type: application/json). 0 with *response set to the body of
// the accepted 2xx answer (xmalloc'd, the caller frees it); -1 with err_set() when a 4xx
// other than 408/429 came back ("HTTP 401 from URL: <server message>") or when every
// attempt failed ("no answer from URL after N attempts: <last reason>"). `accept` may be
// NULL (every 2xx body is accepted).
int http_post_json(HttpClient *client, const char *json_body, HttpAcceptFn accept, void *context, char **response);

// The human-readable message of an error body: OpenAI's {"error": {"message": ...}},
// {"error": "..."}, {"message": ...}, {"detail": ...}, or else the start of the body
// itself. xmalloc'd, at most about 300 bytes, on one line.
char *http_error_message(const char *body);
