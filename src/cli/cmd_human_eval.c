// marlhf human-eval: a blind pairwise comparison of two results files by a person (spec
// §9.5, the released human-eval.py without its unseeded order), on a local web page
// served by marlhf or in the terminal. eval/human_eval.h is the session (order, verdicts,
// resume, statistics); this file is how a person sees the rows and answers.
//
// The web page is one self-contained HTML document (inline CSS and JS, nothing fetched
// from elsewhere) and talks to a small JSON API:
//   GET  /api/next      the row to judge: {done: false, index, judged, total, prompt,
//                       response_1, response_2}, or {done: true, judged, total, summary}
//   POST /api/verdict   {index, choice: "1"|"2"|"tie"|"skip"} -> as /api/next, plus
//                       "recorded": index
//   GET  /api/progress  {judged, total, done}
// Errors are {"error": message}: 400 for a malformed request, 409 for a verdict on a row
// that is not the one being judged (a second tab, a double click), 404, 405, 413. Neither
// the page nor the API says which model wrote which response until every row is judged.
//
// A test hook: the page loaded with ?autoplay=1,2,t,s answers the rows in that order with
// its own buttons: each step waits for its row to be shown, then dispatches a click event
// on the button, so the real handler sends the real request; a step "key1", "key2", "keyt"
// or "keys" presses that key instead (a keydown on the document: the shortcut handler). It
// logs each row it answered, with the texts it showed, in #autoplay-log.
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "core/timer.h"
#include "eval/human_eval.h"
#include "eval/judge.h"
#include "io/fs.h"
#include "serve/listener.h"
#include "io/jsonl.h"

// After the last verdict the server stays up this long, so a page reloaded at that moment
// still gets its done screen.
#define DONE_GRACE_S 2.0
// A verdict is a few dozen bytes; anything much larger is not one.
#define MAX_BODY_BYTES 65536

// The rows of a results file and the line each came from (blank lines are skipped).
static json_t **load_results(const char *path, long **lines, long *count) {
    JsonlReader reader;
    if (jsonl_open(&reader, path, 0) != 0) die_from_err();
    json_t **rows = NULL, *row;
    long n = 0;
    int rc;
    *lines = NULL;
    while ((rc = jsonl_next(&reader, &row)) == 1) {
        if (!json_is_string(json_object_get(row, "prompt")) || !json_is_string(json_object_get(row, "response")))
            die_user("row without \"prompt\" and \"response\" strings (%s:%ld)", path, reader.line_number);
        rows = xrealloc(rows, (size_t)(n + 1) * sizeof *rows);
        *lines = xrealloc(*lines, (size_t)(n + 1) * sizeof **lines);
        (*lines)[n] = reader.line_number;
        rows[n++] = row;
    }
    if (rc < 0) die_from_err();
    jsonl_close(&reader);
    *count = n;
    return rows;
}

// --- the end of a session ------------------------------------------------------------

typedef struct {
    const char *a, *b, *output;
    long seed;
} RunNames;

static json_t *summary_json(const HumanEvalSession *session, const RunNames *names) {
    HumanEvalSummary summary;
    human_eval_summarize(session, &summary);
    json_t *o = json_pack("{s:s, s:s, s:I}", "a", names->a, "b", names->b, "seed", (json_int_t)names->seed);
    json_t *numbers = human_eval_summary_json(&summary);
    json_object_update(o, numbers);
    json_decref(numbers);
    return o;
}

static void finish(HumanEvalSession *session, const RunNames *names) {
    json_t *summary = summary_json(session, names);
    if (human_eval_write_results(session, names->output, summary) != 0) die_from_err();
    json_decref(summary);
    HumanEvalSummary m;
    human_eval_summarize(session, &m);
    char *summary_file = judge_summary_path(names->output);
    printf("human-eval: %ld rows, %s (A) vs %s (B), seed %ld\n", m.rows, names->a, names->b, names->seed);
    printf("A wins %ld, B wins %ld, ties %ld, skipped %ld\n", m.wins_a, m.wins_b, m.ties, m.skipped);
    if (m.valid)
        printf("win rate of A %.3f (95%% Wilson interval %.3f-%.3f, ties count half) over %ld verdicts\n",
               m.win_rate_a, m.low, m.high, m.valid);
    else
        printf("win rate of A: no verdicts (every row skipped)\n");
    printf("verdicts -> %s, summary -> %s\n", names->output, summary_file);
    fflush(stdout);
    free(summary_file);
}

static void report_stopped(const HumanEvalSession *session, const char *why) {
    if (session->judged == 0) {
        fprintf(stderr, "human-eval: %s; no row judged\n", why);
        return;
    }
    fprintf(stderr, "human-eval: %s; %ld of %ld rows judged, saved in %s: run the same command again to continue\n",
            why, session->judged, session->n, session->partial_path);
}

// --- terminal mode ---------------------------------------------------------------------

// 0 when every row is judged, 1 when the person quit, 2 when the input ended first.
static int run_terminal(HumanEvalSession *session) {
    char *line = NULL;
    size_t capacity = 0;
    int quit = 0;
    for (long index = human_eval_next(session); index < session->n && !quit; index = human_eval_next(session)) {
        const char *first, *second;
        human_eval_shown(session, index, &first, &second);
        printf("\n=== Row %ld of %ld ===\n\nPrompt:\n%s\n\n--- Response 1 ---\n%s\n\n--- Response 2 ---\n%s\n\n", index + 1,
               session->n, session->rows[index].prompt, first, second);
        for (;;) {
            printf("Which is better? 1 (Response 1), 2 (Response 2), t (tie), s (skip), q (quit): ");
            fflush(stdout);
            if (getline(&line, &capacity, stdin) < 0) {
                printf("\n");
                quit = 2;
                break;
            }
            size_t end = strlen(line);
            while (end > 0 && strchr(" \t\r\n", line[end - 1])) line[--end] = '\0';
            const char *word = line + strspn(line, " \t");
            if (!strcasecmp(word, "q") || !strcasecmp(word, "quit")) {
                quit = 1;
                break;
            }
            HumanChoice choice;
            if (human_choice_parse(word, &choice) == 0) {
                if (human_eval_record(session, index, choice, time(NULL)) != 0) die_from_err();
                break;
            }
            printf("Please answer 1, 2, t, s or q.\n");
        }
    }
    free(line);
    return quit;
}

// --- web mode: the page ------------------------------------------------------------------

static const char page_html[] =
    "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
    "<meta name='viewport' content='width=device-width, initial-scale=1'><link rel='icon' href='data:,'><title>marlhf human-eval</title><style>"
    "body{font:15px/1.45 system-ui,sans-serif;margin:0;background:#f5f5f2;color:#222}"
    "header{position:sticky;top:0;display:flex;gap:16px;align-items:center;padding:10px 20px;background:#fff;"
    "border-bottom:1px solid #ddd}"
    "#bar{flex:1;height:8px;background:#e4e4e4;border-radius:4px;overflow:hidden}"
    "#fill{height:100%;width:0;background:#3a7d5c;transition:width .2s}"
    "main{max-width:1280px;margin:0 auto;padding:12px 20px 40px}h2{font-size:15px;margin:16px 0 6px;color:#555}"
    ".text{white-space:pre-wrap;overflow-wrap:anywhere;background:#fff;border:1px solid #d8d8d8;border-radius:6px;"
    "padding:12px}"
    "#pair{display:grid;grid-template-columns:1fr 1fr;gap:16px}@media(max-width:760px){#pair{grid-template-columns:1fr}}"
    "#buttons{display:flex;flex-wrap:wrap;gap:10px;justify-content:center;margin:20px 0 8px}"
    "button{font:inherit;font-size:16px;padding:8px 20px;border:1px solid #888;border-radius:6px;background:#fff;"
    "cursor:pointer}button:hover:not(:disabled){background:#eef5f0}button:disabled{opacity:.45;cursor:default}"
    "kbd{font-family:ui-monospace,monospace;border:1px solid #bbb;border-bottom-width:2px;border-radius:3px;"
    "padding:0 4px;background:#fafafa}"
    ".hint{text-align:center;color:#666;font-size:13px}#error{color:#b00020;text-align:center}"
    "table{border-collapse:collapse;margin:8px 0}td{padding:4px 14px;border-bottom:1px solid #e2e2e2}"
    "td:last-child{text-align:right;font-variant-numeric:tabular-nums}[hidden]{display:none!important}"
    "</style></head>\n<body data-state='loading'>"
    "<header><strong>Which response is better?</strong><div id='bar'><div id='fill'></div></div>"
    "<span id='progress'>&hellip;</span></header><main>"
    "<section id='judge' hidden><h2>Prompt</h2><div id='prompt' class='text'></div><div id='pair'>"
    "<div><h2>Response 1</h2><div id='r1' class='text'></div></div>"
    "<div><h2>Response 2</h2><div id='r2' class='text'></div></div></div>"
    "<div id='buttons'><button id='b1' data-choice='1'><kbd>1</kbd> Response 1</button>"
    "<button id='b2' data-choice='2'><kbd>2</kbd> Response 2</button>"
    "<button id='bt' data-choice='tie'><kbd>t</kbd> Tie</button>"
    "<button id='bs' data-choice='skip'><kbd>s</kbd> Skip</button></div>"
    "<p class='hint'>The two responses come in a random order for each prompt; which model wrote which is shown "
    "only at the end. Skip a prompt you cannot judge.</p></section>"
    "<section id='done' hidden><h2>Done: every row is judged</h2><table id='summary'></table>"
    "<p>The verdicts are saved. You can close this page.</p></section>"
    "<p id='error' role='alert'></p><pre id='autoplay-log' hidden></pre></main>\n<script>\n"
    "'use strict';\n"
    "const $ = id => document.getElementById(id);\n"
    "const buttons = ['b1', 'b2', 'bt', 'bs'].map($);\n"
    "const keys = {'1': 'b1', '2': 'b2', 't': 'bt', 's': 'bs'};\n"
    "const autoplay = (new URLSearchParams(location.search).get('autoplay') || '').split(',').filter(c => c);\n"
    "const played = [];\n"
    "let current = null;\n"
    "function setBusy(busy) { buttons.forEach(b => { b.disabled = busy; }); }\n"
    "function progress(judged, total) {\n"
    "  $('progress').textContent = judged + ' of ' + total;\n"
    "  $('fill').style.width = (total ? 100 * judged / total : 0) + '%';\n"
    "}\n"
    "function fail(message) {\n"
    "  $('error').textContent = 'Error: ' + message;\n"
    "  document.body.dataset.error = message;\n"
    "}\n"
    "async function call(method, path, body) {\n"
    "  const options = {method: method, cache: 'no-store'};\n"
    "  if (body) { options.headers = {'Content-Type': 'application/json'}; options.body = JSON.stringify(body); }\n"
    "  const answer = await fetch(path, options);\n"
    "  let data;\n"
    "  try { data = await answer.json(); } catch (e) { throw new Error('the server answered ' + answer.status); }\n"
    "  if (!answer.ok) { const e = new Error(data.error || 'HTTP ' + answer.status); e.status = answer.status; throw e; }\n"
    "  return data;\n"
    "}\n"
    "function row(table, label, value) {\n"
    "  const tr = table.insertRow();\n"
    "  tr.insertCell().textContent = label;\n"
    "  tr.insertCell().textContent = value;\n"
    "}\n"
    "function showDone(d) {\n"
    "  current = null;\n"
    "  const s = d.summary, t = $('summary'), pct = x => (100 * x).toFixed(1) + '%';\n"
    "  t.textContent = '';\n"
    "  row(t, 'Model A', s.a);\n"
    "  row(t, 'Model B', s.b);\n"
    "  row(t, 'A better', s.wins_a);\n"
    "  row(t, 'B better', s.wins_b);\n"
    "  row(t, 'Ties', s.ties);\n"
    "  row(t, 'Skipped', s.skipped);\n"
    "  row(t, 'Win rate of A (ties count half)', s.win_rate_a === null ? 'no verdicts' : pct(s.win_rate_a));\n"
    "  if (s.win_rate_a_ci95) row(t, '95% interval (Wilson)', pct(s.win_rate_a_ci95[0]) + ' - ' + "
    "pct(s.win_rate_a_ci95[1]));\n"
    "  $('judge').hidden = true;\n"
    "  $('done').hidden = false;\n"
    "  document.body.dataset.state = 'done';\n"
    "}\n"
    "function show(d) {\n"
    "  progress(d.judged, d.total);\n"
    "  if (d.done) { showDone(d); return; }\n"
    "  current = d;\n"
    "  $('prompt').textContent = d.prompt;\n"
    "  $('r1').textContent = d.response_1;\n"
    "  $('r2').textContent = d.response_2;\n"
    "  $('judge').hidden = false;\n"
    "  document.body.dataset.state = 'judging';\n"
    "  document.body.dataset.index = d.index;\n"
    "  setBusy(false);\n"
    "  window.scrollTo(0, 0);\n"
    "  if (autoplay.length) setTimeout(autoplayStep, 0);\n"
    "}\n"
    "async function load() {\n"
    "  setBusy(true);\n"
    "  try { show(await call('GET', '/api/next')); } catch (e) { fail(e.message); }\n"
    "}\n"
    "async function choose(choice) {\n"
    "  if (!current || buttons[0].disabled) return;\n"
    "  setBusy(true);\n"
    "  $('error').textContent = '';\n"
    "  try {\n"
    "    show(await call('POST', '/api/verdict', {index: current.index, choice: choice}));\n"
    "  } catch (e) {\n"
    "    fail(e.message);\n"
    "    if (e.status === 409) load(); else setBusy(false);\n"
    "  }\n"
    "}\n"
    "buttons.forEach(b => b.addEventListener('click', () => choose(b.dataset.choice)));\n"
    "document.addEventListener('keydown', e => {\n"
    "  if (e.ctrlKey || e.metaKey || e.altKey) return;\n"
    "  const id = keys[e.key.toLowerCase()];\n"
    "  if (id && current) { e.preventDefault(); $(id).click(); }\n"
    "});\n"
    "function autoplayStep() {\n"
    "  const step = autoplay.shift(), key = step.startsWith('key') ? step.slice(3) : null;\n"
    "  const choice = key === null ? step : key, id = keys[choice[0]];\n"
    "  if (!id || (key !== null && key.length !== 1)) { fail('autoplay: unknown step ' + step); autoplay.length = 0; return; }\n"
    "  played.push({index: current.index, choice: choice, response_1: current.response_1, "
    "response_2: current.response_2});\n"
    "  $('autoplay-log').textContent = JSON.stringify(played);\n"
    "  if (key !== null) document.dispatchEvent(new KeyboardEvent('keydown', {key: key, bubbles: true, cancelable: true}));\n"
    "  else $(id).dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true, view: window}));\n"
    "}\n"
    "load();\n"
    "</script></body></html>\n";

// --- web mode: the API -------------------------------------------------------------------

typedef struct {
    HumanEvalSession *session;
    const RunNames *names;
    pthread_mutex_t lock; // the session, between MHD's thread and the main one
} Web;

typedef struct {
    char *body;
    size_t size;
    bool too_big;
} Upload;

// Takes ownership of json.
static enum MHD_Result respond(struct MHD_Connection *connection, int status, json_t *json) {
    char *body = json_dumps(json, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(json);
    struct MHD_Response *response = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!response) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    enum MHD_Result result = MHD_queue_response(connection, (unsigned int)status, response);
    MHD_destroy_response(response);
    return result;
}

// Bad requests are logged: whoever runs the session sees why a page misbehaves.
static enum MHD_Result respond_error(struct MHD_Connection *connection, const char *method, const char *url,
                                     int status, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result respond_error(struct MHD_Connection *connection, const char *method, const char *url,
                                     int status, const char *fmt, ...) {
    char message[256], shown[96];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    size_t n = 0;
    for (const char *p = url; *p && n + 1 < sizeof shown; p++) shown[n++] = (unsigned char)*p < 0x20 ? '?' : *p;
    shown[n] = '\0';
    fprintf(stderr, "human-eval: %.10s %s %d %s\n", method, shown, status, message);
    return respond(connection, status, json_pack("{s:s}", "error", message));
}

// What the page shows next; the caller holds the lock. Blind: no model names or order.
static json_t *next_json(Web *web) {
    HumanEvalSession *s = web->session;
    long index = human_eval_next(s);
    if (index >= s->n)
        return json_pack("{s:b, s:I, s:I, s:o}", "done", 1, "judged", (json_int_t)s->judged, "total", (json_int_t)s->n,
                         "summary", summary_json(s, web->names));
    const char *first, *second;
    human_eval_shown(s, index, &first, &second);
    return json_pack("{s:b, s:I, s:I, s:I, s:s, s:s, s:s}", "done", 0, "index", (json_int_t)index, "judged",
                     (json_int_t)s->judged, "total", (json_int_t)s->n, "prompt", s->rows[index].prompt, "response_1",
                     first, "response_2", second);
}

static enum MHD_Result post_verdict(Web *web, struct MHD_Connection *connection, const char *url, Upload *upload) {
    const char *method = MHD_HTTP_METHOD_POST;
    if (upload->too_big)
        return respond_error(connection, method, url, 413, "the body is over %d bytes", MAX_BODY_BYTES);
    json_error_t error;
    json_t *request = json_loadb(upload->body ? upload->body : "", upload->size, 0, &error);
    if (!request) return respond_error(connection, method, url, 400, "the body is not JSON: %s", error.text);
    json_t *index_json = json_object_get(request, "index");
    const char *choice_text = json_string_value(json_object_get(request, "choice"));
    HumanChoice choice;
    enum MHD_Result result;
    if (!json_is_object(request) || !json_is_integer(index_json)) {
        result = respond_error(connection, method, url, 400, "give {\"index\": row, \"choice\": \"1\"|\"2\"|\"tie\"|\"skip\"}");
    } else if (human_choice_parse(choice_text, &choice) != 0) {
        result = respond_error(connection, method, url, 400, "%s", err_msg());
    } else {
        long index = (long)json_integer_value(index_json);
        pthread_mutex_lock(&web->lock);
        long next = human_eval_next(web->session);
        if (next >= web->session->n) {
            pthread_mutex_unlock(&web->lock);
            result = respond_error(connection, method, url, 409, "every row is judged already");
        } else if (index != next) {
            pthread_mutex_unlock(&web->lock);
            result = respond_error(connection, method, url, 409, "row %ld is not the one being judged (row %ld is)",
                                   index, next);
        } else if (human_eval_record(web->session, index, choice, time(NULL)) != 0) {
            pthread_mutex_unlock(&web->lock);
            result = respond_error(connection, method, url, 500, "%s", err_msg());
        } else {
            json_t *answer = next_json(web);
            pthread_mutex_unlock(&web->lock);
            json_object_set_new(answer, "recorded", json_integer(index));
            result = respond(connection, 200, answer);
        }
    }
    json_decref(request);
    return result;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **request_state) {
    Web *web = cls;
    bool is_get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    bool is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
    bool page = !strcmp(url, "/") || !strcmp(url, "/index.html");
    bool next = !strcmp(url, "/api/next"), progress = !strcmp(url, "/api/progress");
    bool verdict = !strcmp(url, "/api/verdict");
    Upload *upload = *request_state;
    if (!upload) { // the headers have arrived
        if (!page && !next && !progress && !verdict) return respond_error(connection, method, url, 404, "no such page");
        if (verdict ? !is_post : !is_get)
            return respond_error(connection, method, url, 405, "use %s", verdict ? "POST" : "GET");
        if (page) {
            struct MHD_Response *response =
                MHD_create_response_from_buffer(sizeof page_html - 1, (void *)page_html, MHD_RESPMEM_PERSISTENT);
            if (!response) return MHD_NO;
            MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
            MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
            enum MHD_Result result = MHD_queue_response(connection, MHD_HTTP_OK, response);
            MHD_destroy_response(response);
            return result;
        }
        if (next || progress) {
            pthread_mutex_lock(&web->lock);
            HumanEvalSession *s = web->session;
            json_t *answer = next ? next_json(web)
                                  : json_pack("{s:I, s:I, s:b}", "judged", (json_int_t)s->judged, "total",
                                              (json_int_t)s->n, "done", s->judged >= s->n);
            pthread_mutex_unlock(&web->lock);
            return respond(connection, 200, answer);
        }
        const char *length = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (length && strtoull(length, NULL, 10) > MAX_BODY_BYTES)
            return respond_error(connection, method, url, 413, "the body is over %d bytes", MAX_BODY_BYTES);
        *request_state = xcalloc(1, sizeof(Upload));
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        // A chunked body is only known to be too big as it comes; the rest is read and dropped.
        if (!upload->too_big && upload->size + *upload_data_size > MAX_BODY_BYTES) {
            upload->too_big = true;
            free(upload->body);
            upload->body = NULL;
        }
        if (!upload->too_big) {
            upload->body = xrealloc(upload->body, upload->size + *upload_data_size + 1);
            memcpy(upload->body + upload->size, upload_data, *upload_data_size);
            upload->size += *upload_data_size;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    return post_verdict(web, connection, url, upload);
}

static void on_completed(void *cls, struct MHD_Connection *connection, void **request_state,
                         enum MHD_RequestTerminationCode code) {
    Upload *upload = *request_state;
    if (!upload) return;
    free(upload->body);
    free(upload);
    *request_state = NULL;
}

static void run_web(HumanEvalSession *session, const RunNames *names, const char *host, int port) {
    // Blocked before MHD starts its thread, which inherits the mask: only the sigtimedwait
    // below takes the signals, so the session is never interrupted mid-write.
    sigset_t stop_signals;
    listener_block_stop_signals(&stop_signals);

    int fd = -1;
    bool ipv6 = false;
    if (listener_open(host, port, 64, &fd, &ipv6) != 0) die_from_err();
    Web web = {.session = session, .names = names};
    pthread_mutex_init(&web.lock, NULL);
    // One internal thread polls every connection: requests are tiny, and the session is
    // then only touched by it and (under the lock) by this thread.
    unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    if (ipv6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *daemon =
        MHD_start_daemon(flags, 0, NULL, NULL, on_request, &web, MHD_OPTION_LISTEN_SOCKET, fd,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, &web, MHD_OPTION_CONNECTION_TIMEOUT, 60u,
                         MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_END);
    if (!daemon) {
        close(fd);
        die_user("cannot start the HTTP server on %s:%d (libmicrohttpd)", host, port);
    }
    bool ipv6_literal = strchr(host, ':') != NULL;
    fprintf(stderr, "human-eval: %ld of %ld rows to judge\n", session->n - session->judged, session->n);
    fprintf(stderr, "human-eval: open http://%s%s%s:%d/\n", ipv6_literal ? "[" : "", host, ipv6_literal ? "]" : "",
            listener_port(fd));
    fflush(stderr);

    const struct timespec tick = {0, 100 * 1000 * 1000};
    double finished_at = -1;
    int signal_number = 0;
    for (;;) {
        int got = sigtimedwait(&stop_signals, NULL, &tick);
        if (got == SIGINT || got == SIGTERM) {
            signal_number = got;
            break;
        }
        if (finished_at < 0) {
            pthread_mutex_lock(&web.lock);
            bool done = human_eval_next(session) >= session->n;
            if (done) finish(session, names);
            pthread_mutex_unlock(&web.lock);
            if (done) finished_at = now_seconds();
        }
        if (finished_at >= 0 && now_seconds() - finished_at >= DONE_GRACE_S) break;
    }
    MHD_stop_daemon(daemon);
    close(fd);
    pthread_mutex_destroy(&web.lock);
    if (finished_at < 0) report_stopped(session, signal_number == SIGINT ? "SIGINT" : "SIGTERM");
}

// --- the command -------------------------------------------------------------------------

int cmd_human_eval(int argc, char **argv) {
    char *output = NULL, *host = "127.0.0.1";
    long seed = 1234, port = 0, limit = 0;
    bool terminal = false, overwrite = false;
    Option options[] = {
        {"output", "save_path", OPT_STRING, &output, "JSONL of verdicts, one per row (also OUTPUT.summary.json)", true, false},
        {"seed", NULL, OPT_INT, &seed, "seed of the per-row order of the two responses", false, false},
        {"host", NULL, OPT_STRING, &host, "address the web page is served on", false, false},
        {"port", NULL, OPT_INT, &port, "TCP port of the web page (0 = any free port, printed when ready)", false, false},
        {"terminal", NULL, OPT_BOOL, &terminal, "ask in the terminal instead of on a web page", false, false},
        {"limit", NULL, OPT_INT, &limit, "judge only the first N rows (0: all)", false, false},
        {"overwrite", NULL, OPT_BOOL, &overwrite, "replace an existing output; discard saved verdicts of a different session", false, false},
    };
    const char *inputs[2];
    OptionSet set = {"human-eval", "Blind pairwise comparison of two results files by a person, on a local web page or in the terminal.",
                     "marlhf human-eval A.jsonl B.jsonl --output VERDICTS.jsonl [--terminal] [--port 0] [--seed 1234]",
                     options, sizeof options / sizeof options[0], inputs, 2, 0};
    options_parse(&set, argc, argv);
    if (set.num_positional != 2)
        die_user("give two results files: marlhf human-eval A.jsonl B.jsonl --output FILE (--help)");
    if (port < 0 || port > 65535) die_user("--port must be in [0, 65535], got %ld", port);
    if (limit < 0) die_user("--limit must be >= 0, got %ld", limit);
    if (seed < 0) die_user("--seed must be >= 0, got %ld", seed);
    if (!*output) die_user("--output must not be empty");
    if (fs_is_dir(output)) die_user("%s is a folder (--output)", output);
    if (fs_is_file(output) && !overwrite) die_user("%s exists; give --overwrite to replace it (--output)", output);

    long count_a, count_b, *lines_a, *lines_b;
    json_t **a = load_results(inputs[0], &lines_a, &count_a), **b = load_results(inputs[1], &lines_b, &count_b);
    if (count_a != count_b)
        die_user("%s has %ld rows but %s has %ld; compare results on the same prompts", inputs[0], count_a, inputs[1],
                 count_b);
    if (count_a == 0) die_user("no rows in %s", inputs[0]);
    long n = limit > 0 && limit < count_a ? limit : count_a;
    HumanEvalRow *rows = xcalloc((size_t)count_a, sizeof *rows);
    for (long i = 0; i < count_a; i++) {
        const char *prompt = json_string_value(json_object_get(a[i], "prompt"));
        if (strcmp(prompt, json_string_value(json_object_get(b[i], "prompt"))))
            die_user("the prompts of row %ld differ (%s:%ld, %s:%ld); compare results on the same prompts", i,
                     inputs[0], lines_a[i], inputs[1], lines_b[i]);
        json_t *reward_a = json_object_get(a[i], "reward"), *reward_b = json_object_get(b[i], "reward");
        rows[i] = (HumanEvalRow){prompt, json_string_value(json_object_get(a[i], "response")),
                                 json_string_value(json_object_get(b[i], "response")),
                                 json_is_number(reward_a) && json_is_number(reward_b), json_number_value(reward_a),
                                 json_number_value(reward_b)};
    }

    char *dir = fs_dirname(output);
    if (fs_mkdir_p(dir) != 0) die_from_err();
    size_t partial_size = strlen(output) + 16;
    char *partial_path = xmalloc(partial_size);
    snprintf(partial_path, partial_size, "%s.partial", output);
    // Saved verdicts of this very session are continued even with --overwrite (which then
    // only replaces the finished output), so "run the same command again" always resumes.
    HumanEvalSession session;
    if (human_eval_open(&session, rows, n, (uint64_t)seed, partial_path, overwrite) != 0) die_from_err();
    if (session.judged > 0)
        fprintf(stderr, "human-eval: continuing after %ld saved verdicts in %s\n", session.judged, partial_path);

    RunNames names = {inputs[0], inputs[1], output, seed};
    if (human_eval_next(&session) >= n) finish(&session, &names); // an earlier session judged everything
    else if (!terminal) run_web(&session, &names, host, (int)port);
    else {
        int stopped = run_terminal(&session);
        if (stopped) report_stopped(&session, stopped == 1 ? "quit" : "end of input");
        else finish(&session, &names);
    }

    human_eval_close(&session);
    for (long i = 0; i < count_a; i++) json_decref(a[i]), json_decref(b[i]);
    free(a), free(b), free(lines_a), free(lines_b), free(rows), free(dir), free(partial_path);
    return 0;
}
