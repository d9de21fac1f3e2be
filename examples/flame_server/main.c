/* flame-server: an example HTTP front end for libflame, on libmicrohttpd. It serves
 *   GET  /metrics  the Prometheus text of the engine and its scheduler (flame_metrics_text)
 *   POST /score    {"history": [ids], "candidates": [ids], "priority": -1|0|1, "timeout_us": N}
 *                  -> {"scores": [[task scores of candidate 0], ...]}
 * through a batch-profile scheduler, so concurrent connections are batched.
 *   flame-server [--model FILE] [--bind ADDR] [--port N] [--device D] [--max-wait-us N] [--adaptive]
 *                [--workers N] [--max-connections N]
 * --port 0 (the default) takes a free port; the first line on stdout says which:
 * "listening on http://ADDR:PORT". SIGINT or SIGTERM stops it (queued requests complete).
 * A connection is a thread; past --max-connections (default 1000) new ones are refused, and an
 * idle one is closed after 10 s. Clients that hold connections open can still fill that
 * bound: for untrusted clients, put a reverse proxy in front.
 * Side features, when the model has them, are sent as empty bags (the request format carries
 * ids only). docs/metrics.md. */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "cli_args.h"
#include "flame/flame.h"

#define MAX_BODY (1u << 20)
#define MAX_IDS 65536

typedef struct server {
    flame_engine *engine;
    flame_scheduler *sched;
    int32_t num_side, num_tasks;
} server;

/* One connection's request body, gathered over the handler's calls. */
typedef struct body {
    char *p;
    size_t len;
    bool too_large;
} body;

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *type, char *text)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result error(struct MHD_Connection *c, unsigned code, const char *fmt, const char *detail)
{
    cJSON *o = cJSON_CreateObject();
    char msg[768];
    snprintf(msg, sizeof msg, fmt, detail);
    cJSON_AddStringToObject(o, "error", msg);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text ? reply(c, code, "application/json", text) : MHD_NO;
}

static enum MHD_Result metrics(server *s, struct MHD_Connection *c)
{
    flame_metrics_sources src = {.struct_size = sizeof src, .engine = s->engine, .scheduler = s->sched};
    size_t cap = 1 << 15, need = 0;
    for (int tries = 0; tries < 4; tries++) { /* the text grows between calls only by digits */
        char *buf = malloc(cap);
        if (!buf) return error(c, 500, "%s", "out of memory");
        flame_status st = flame_metrics_text(&src, buf, cap, &need);
        if (st == FLAME_OK) return reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", buf);
        free(buf);
        if (st != FLAME_ERR_BUFFER_TOO_SMALL) return error(c, 500, "metrics: %s", flame_last_error());
        cap = need + 4096;
    }
    return error(c, 500, "%s", "metrics: the text kept growing");
}

/* ids of a JSON array into a new array; NULL with *why set on a bad value. */
static int64_t *ids_of(const cJSON *a, const char *name, size_t *n, char *why, size_t why_len)
{
    if (!cJSON_IsArray(a)) {
        snprintf(why, why_len, "'%s' must be an array of item ids", name);
        return NULL;
    }
    const int len = cJSON_GetArraySize(a);
    if (len > MAX_IDS) {
        snprintf(why, why_len, "'%s' has %d ids, at most %d are accepted", name, len, MAX_IDS);
        return NULL;
    }
    int64_t *ids = malloc(((size_t)len + 1) * sizeof *ids);
    if (!ids) {
        snprintf(why, why_len, "out of memory");
        return NULL;
    }
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        const double v = e->valuedouble; /* range first: casting 1e300 to int64_t is undefined */
        if (!cJSON_IsNumber(e) || !(v >= 0 && v <= 9007199254740992.0) || v != (double)(int64_t)v) {
            snprintf(why, why_len, "'%s'[%d] is not a non-negative integer id", name, i);
            free(ids);
            return NULL;
        }
        ids[i] = (int64_t)v;
    }
    *n = (size_t)len;
    return ids;
}

/* An integer in [lo, hi] from an optional JSON member (absent: *out = 0); false if not one. */
static bool integer_member(const cJSON *m, double lo, double hi, int64_t *out)
{
    *out = 0;
    if (!m) return true;
    const double v = m->valuedouble;
    if (!cJSON_IsNumber(m) || !(v >= lo && v <= hi) || v != (double)(int64_t)v) return false;
    *out = (int64_t)v;
    return true;
}

/* Why member `name` was refused, naming the value received. */
static void number_why(char *why, size_t len, const char *name, const cJSON *m, const char *want)
{
    if (cJSON_IsNumber(m)) snprintf(why, len, "'%s' is %.17g, not %s", name, m->valuedouble, want);
    else snprintf(why, len, "'%s' is not a number (%s)", name, want);
}

/* The offset of the first NUL inside a JSON string of the body, escaped (\u0000) or raw (any
 * raw byte below 0x20, which JSON forbids there), or -1. cJSON decodes or copies both into
 * the C strings it gives, so "history\u0000x" would be read as the member "history". */
static long string_nul(const char *text, size_t len)
{
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        if (!in_string) in_string = text[i] == '"';
        else if (text[i] == '"') in_string = false;
        else if ((unsigned char)text[i] < 0x20) return (long)i;
        else if (text[i] == '\\' && i + 1 < len) {
            if (text[i + 1] == 'u' && len - i >= 6 && !memcmp(text + i + 2, "0000", 4)) return (long)i;
            i++; /* the escaped character */
        }
    }
    return -1;
}

/* The body's members: known names only, each once (readers disagree on which duplicate wins). */
static bool check_members(const cJSON *doc, char *why, size_t why_len)
{
    static const char *const known[] = {"history", "candidates", "priority", "timeout_us"};
    int seen[4] = {0};
    for (const cJSON *m = doc->child; m; m = m->next) {
        size_t k = 0;
        while (k < 4 && strcmp(m->string, known[k])) k++;
        if (k == 4) {
            snprintf(why, why_len, "unknown member '%.60s' (history, candidates, priority, timeout_us)", m->string);
            return false;
        }
        if (seen[k]++) {
            snprintf(why, why_len, "member '%s' appears twice", known[k]);
            return false;
        }
    }
    return true;
}

static unsigned http_status(flame_status st)
{
    switch (st) {
    case FLAME_ERR_INVALID_ARG: case FLAME_ERR_BUFFER_TOO_SMALL: return 400;
    case FLAME_ERR_UNAVAILABLE: return 503; /* shed load: the client may retry elsewhere */
    case FLAME_ERR_TIMEOUT: return 504;
    default: return 500;
    }
}

static enum MHD_Result score(server *s, struct MHD_Connection *c, const body *b)
{
    if (b->too_large) return error(c, 413, "request body over %s bytes", "1048576");
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(b->p ? b->p : "", b->len, &end, 0);
    if (!cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return error(c, 400, "%s", "the body is not a JSON object");
    }
    char why[256] = "";
    for (const char *t = end; t < b->p + b->len && !why[0]; t++)
        if (*t != ' ' && *t != '\n' && *t != '\r' && *t != '\t')
            snprintf(why, sizeof why, "bytes after the JSON object (at offset %td)", t - b->p);
    const long nul = why[0] ? -1 : string_nul(b->p, (size_t)(end - b->p));
    if (nul >= 0)
        snprintf(why, sizeof why, "a NUL or raw control byte inside a string at offset %ld (\\u0000 or a byte below "
                                  "0x20)", nul);
    if (!why[0]) check_members(doc, why, sizeof why);
    size_t nh = 0, nc = 0;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(doc, "history");
    int64_t *hist = why[0] ? NULL : h ? ids_of(h, "history", &nh, why, sizeof why) : calloc(1, sizeof *hist);
    int64_t *cand = hist ? ids_of(cJSON_GetObjectItemCaseSensitive(doc, "candidates"), "candidates", &nc, why,
                                  sizeof why)
                         : NULL;
    /* read before the document is freed: the members point into it */
    int64_t priority = 0, timeout_us = 0;
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(doc, "priority"),
                *to = cJSON_GetObjectItemCaseSensitive(doc, "timeout_us");
    if (cand && !integer_member(pr, -1, 1, &priority))
        number_why(why, sizeof why, "priority", pr, "-1, 0 or 1");
    if (cand && !integer_member(to, 0, 1e12, &timeout_us))
        number_why(why, sizeof why, "timeout_us", to, "an integer number of microseconds in 0..1e12 (0: none)");
    cJSON_Delete(doc);
    if (!cand || why[0]) {
        free(hist), free(cand);
        return error(c, 400, "%s", why[0] ? why : "out of memory");
    }
    flame_submit_options o = {.struct_size = sizeof o, .priority = (int32_t)priority, .timeout_us = timeout_us};
    /* empty bags for the side slots: offsets of zeros, long enough for either token list */
    const size_t longest = (nh > nc ? nh : nc) + 1;
    int64_t *zeros = calloc(longest, sizeof *zeros);
    flame_bags *bags = calloc((size_t)s->num_side + 1, sizeof *bags);
    float *scores = malloc((nc * (size_t)s->num_tasks + 1) * sizeof *scores);
    if (!zeros || !bags || !scores) {
        free(hist), free(cand), free(zeros), free(bags), free(scores);
        return error(c, 500, "%s", "out of memory");
    }
    for (int32_t k = 0; k < s->num_side; k++) bags[k] = (flame_bags){zeros, NULL, 0};
    flame_request r = {.struct_size = sizeof r, .history = hist, .history_len = nh, .candidates = cand,
                       .num_candidates = nc, .history_side = s->num_side ? bags : NULL,
                       .candidate_side = s->num_side ? bags : NULL, .num_side_features = (size_t)s->num_side};
    const flame_status st = flame_scheduler_score_ex(s->sched, &r, scores, nc * (size_t)s->num_tasks, &o);
    enum MHD_Result ret;
    if (st) {
        ret = error(c, http_status(st), "%s", flame_last_error());
    } else {
        cJSON *o2 = cJSON_CreateObject(), *rows = cJSON_AddArrayToObject(o2, "scores");
        for (size_t i = 0; i < nc; i++) {
            cJSON *row = cJSON_CreateArray();
            for (int32_t t = 0; t < s->num_tasks; t++)
                cJSON_AddItemToArray(row, cJSON_CreateNumber(scores[i * (size_t)s->num_tasks + (size_t)t]));
            cJSON_AddItemToArray(rows, row);
        }
        char *text = cJSON_PrintUnformatted(o2);
        cJSON_Delete(o2);
        ret = text ? reply(c, 200, "application/json", text) : MHD_NO;
    }
    free(hist), free(cand), free(zeros), free(bags), free(scores);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    server *s = cls;
    (void)version;
    const bool post = !strcmp(method, "POST");
    if (!*con_cls) { /* first call: headers only */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (post && cl && strtoull(cl, NULL, 10) > MAX_BODY) /* refused before the body is read */
            return error(c, 413, "request body over %s bytes", "1048576");
        body *b = calloc(1, sizeof *b);
        if (!b) return MHD_NO;
        *con_cls = b;
        return MHD_YES;
    }
    body *b = *con_cls;
    if (*upload_size) { /* a piece of the body */
        if (b->len + *upload_size > MAX_BODY) {
            b->too_large = true;
        } else if (!b->too_large) {
            char *p = realloc(b->p, b->len + *upload_size + 1);
            if (!p) return MHD_NO;
            memcpy(p + b->len, upload, *upload_size);
            b->p = p;
            b->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!strcmp(url, "/metrics") && !strcmp(method, "GET")) return metrics(s, c);
    if (!strcmp(url, "/score") && post) return score(s, c, b);
    if (!strcmp(url, "/metrics") || !strcmp(url, "/score")) return error(c, 405, "method %s not allowed", method);
    return error(c, 404, "no such endpoint: %s (/metrics, /score)", url);
}

static void done_connection(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t)
{
    (void)cls, (void)c, (void)t;
    body *b = *con_cls;
    if (b) free(b->p), free(b);
    *con_cls = NULL;
}

static void usage(void)
{
    fprintf(stderr, "usage: flame-server [--model FILE] [--bind ADDR] [--port N] [--device cpu|cuda|cuda:N]\n"
                    "                    [--max-wait-us N] [--adaptive] [--workers N] [--max-connections N]\n");
}

static bool number_arg(const char *flag, const char *v, long lo, long hi, long *out)
{
    long long x;
    if (!cli_int("flame-server", flag, v, lo, hi, &x)) return false;
    *out = (long)x;
    return true;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *bind = "127.0.0.1", *device = "cpu";
    long port = 0, max_wait = 500, workers = 0, max_connections = 1000;
    bool adaptive = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "--adaptive")) {
            adaptive = true;
            continue;
        }
        if (!v) return usage(), 2;
        i++;
        if (!strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--bind")) bind = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--port")) ok = number_arg(a, v, 0, 65535, &port);
        else if (!strcmp(a, "--max-wait-us")) ok = number_arg(a, v, 0, 10000000, &max_wait);
        else if (!strcmp(a, "--workers")) ok = number_arg(a, v, 0, 256, &workers);
        else if (!strcmp(a, "--max-connections")) ok = number_arg(a, v, 1, 100000, &max_connections);
        else return usage(), 2;
        if (!ok) return 2;
    }
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, bind, &addr.sin_addr) != 1) {
        fprintf(stderr, "flame-server: --bind %s is not an IPv4 address\n", bind);
        return 2;
    }
    flame_model *m = NULL;
    flame_config *cfg = NULL;
    server s = {0};
    flame_status st = model_path ? flame_model_load(model_path, &m)
                                 : flame_model_create_random(flame_default_model_config(), 1, &m);
    if (!st) st = flame_config_create(&cfg);
    if (!st) st = flame_config_set_string(cfg, FLAME_OPT_DEVICE, device);
    if (!st) st = flame_engine_create(m, cfg, &s.engine);
    flame_scheduler_params sp = {.struct_size = sizeof sp, .max_wait_us = max_wait, .workers = (uint32_t)workers,
                                 .adaptive_wait = adaptive};
    if (!st) st = flame_scheduler_create(s.engine, &sp, &s.sched);
    flame_model_info info = {.struct_size = sizeof info};
    if (!st) st = flame_model_get_info(m, &info);
    flame_config_destroy(cfg);
    if (st) {
        fprintf(stderr, "flame-server: %s\n", flame_last_error());
        flame_scheduler_destroy(s.sched);
        flame_engine_destroy(s.engine);
        flame_model_destroy(m);
        return 1;
    }
    s.num_side = info.num_side_features;
    s.num_tasks = info.num_tasks;
    /* SIGINT/SIGTERM are taken by sigwait below, so every thread blocks them */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    /* MHD_USE_AUTO: poll or epoll, not select, whose FD_SETSIZE (1024) turned away every
     * connection once that many were open */
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                                MHD_USE_AUTO | MHD_USE_ERROR_LOG,
                                            0, NULL, NULL, handle, &s, MHD_OPTION_SOCK_ADDR, &addr,
                                            MHD_OPTION_NOTIFY_COMPLETED, done_connection, NULL,
                                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_connections,
                                            MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "flame-server: cannot listen on %s:%ld: %s\n", bind, port, strerror(errno));
        flame_scheduler_destroy(s.sched);
        flame_engine_destroy(s.engine);
        flame_model_destroy(m);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf("listening on http://%s:%u\n", bind, di ? (unsigned)di->port : (unsigned)port);
    fflush(stdout);
    int sig = 0;
    sigwait(&sigs, &sig);
    MHD_stop_daemon(d); /* joins the connection threads: no request is in the scheduler after this */
    flame_scheduler_destroy(s.sched);
    flame_engine_destroy(s.engine);
    flame_model_destroy(m);
    return 0;
}
