/* The Redis feature source and loader (hiredis, blocking API). Keys are prefix + decimal id;
 * values are the record encoding (docs/features.md). A fetch sends its keys as MGETs of
 * keys_per_command keys, all written before any reply is read (one round trip per fetch).
 * hiredis's timeout bounds one read(), so a server sending a byte at a time could hold a fetch
 * (and the connection's lock) for ever: a fetch instead polls the socket against one deadline
 * for all its replies, and waits for the lock no longer than that timeout either. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "features/source.h"
#include "core/abi.h"

typedef struct redis_source {
    struct flame_feature_source base;
    pthread_mutex_t lock; /* one connection: fetches are serialized */
    redisContext *ctx;
    char host[256], prefix[128];
    int port, connect_ms, read_ms, per_cmd, backoff_min, backoff_max;
    int backoff_ms;         /* current delay; 0 after a success */
    uint64_t next_try_us;   /* no connect attempt before this (monotonic us) */
    redisReplyObjectFunctions reply_fn; /* the reader's, with array lengths bounded (below) */
} redis_source;

/* An array reply announces its length before its elements, and hiredis 0.x allocates that
 * many element pointers at once: a server answering "*300000000" would cost 2.4 GB. No reply
 * a fetch reads holds more than keys_per_command (at most 65536) elements, so a longer one is
 * refused before anything is allocated (the reader reports it as out of memory, the fetch
 * fails with FLAME_ERR_UNAVAILABLE). hiredis 1.x bounds it too (maxelements); this holds for
 * both. */
#define MAX_REPLY_ELEMENTS 65536
#if HIREDIS_MAJOR >= 1
typedef size_t fl_array_len; /* createArray's length parameter: size_t from hiredis 1.0, int before */
#else
typedef int fl_array_len;
#endif
static void *(*default_create_array)(const redisReadTask *, fl_array_len);
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void *bounded_create_array(const redisReadTask *task, fl_array_len elements)
{
    if ((long long)elements < 0 || (unsigned long long)elements > MAX_REPLY_ELEMENTS) return NULL;
    return default_create_array(task, elements);
}
/* hiredis's own object functions (the same table for every reader) */
static void remember_default(void)
{
    redisReader *rd = redisReaderCreate();
    if (rd) default_create_array = rd->fn->createArray;
    redisReaderFree(rd);
}

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static struct timeval ms_tv(int ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

static void drop_conn(redis_source *r)
{
    if (r->ctx) redisFree(r->ctx);
    r->ctx = NULL;
}

/* Connects if needed, honouring the backoff. Lock held. */
static flame_status ensure_conn(redis_source *r)
{
    if (r->ctx) return FLAME_OK;
    uint64_t now = mono_us();
    if (now < r->next_try_us)
        return fl_error(FLAME_ERR_UNAVAILABLE, "redis %s:%d: reconnect backing off, next attempt in %llu ms", r->host,
                        r->port, (unsigned long long)((r->next_try_us - now + 999) / 1000));
    redisContext *c = redisConnectWithTimeout(r->host, r->port, ms_tv(r->connect_ms));
    if (!c || c->err || redisSetTimeout(c, ms_tv(r->read_ms)) != REDIS_OK) {
        char why[128];
        snprintf(why, sizeof why, "%s", c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        r->backoff_ms = r->backoff_ms ? r->backoff_ms * 2 : r->backoff_min;
        if (r->backoff_ms > r->backoff_max) r->backoff_ms = r->backoff_max;
        r->next_try_us = now + (uint64_t)r->backoff_ms * 1000u;
        return fl_error(FLAME_ERR_UNAVAILABLE, "redis %s:%d: cannot connect: %s (next attempt in %d ms)", r->host,
                        r->port, why, r->backoff_ms);
    }
    pthread_once(&default_once, remember_default);
    if (default_create_array && c->reader->fn) { /* array replies bounded (MAX_REPLY_ELEMENTS) */
        r->reply_fn = *c->reader->fn;
        r->reply_fn.createArray = bounded_create_array;
        c->reader->fn = &r->reply_fn;
    }
    r->ctx = c;
    r->backoff_ms = 0;
    return FLAME_OK;
}

static flame_status io_error(redis_source *r, const char *what)
{
    const char *why = !r->ctx || !r->ctx->err        ? "unexpected reply"
                      : r->ctx->err == REDIS_ERR_OOM ? "an array reply longer than 65536 elements, or out of memory"
                                                     : r->ctx->errstr;
    flame_status st = fl_error(FLAME_ERR_UNAVAILABLE, "redis %s:%d: %s: %s", r->host, r->port, what, why);
    drop_conn(r);
    return st;
}

/* Waits until the connection's socket is ready for `events` or the deadline passes: 1 ready,
 * 0 deadline passed, -1 poll failed. */
static int wait_socket(const redisContext *c, short events, uint64_t deadline_us)
{
    for (;;) {
        uint64_t now = mono_us();
        if (now >= deadline_us) return 0;
        uint64_t left_ms = (deadline_us - now + 999) / 1000;
        struct pollfd p = {.fd = c->fd, .events = events};
        int rc = poll(&p, 1, (int)(left_ms > 600000 ? 600000 : left_ms));
        if (rc > 0) return 1;
        if (rc < 0 && errno != EINTR) return -1;
    }
}

static flame_status timed_out(redis_source *r, const char *what)
{
    flame_status st = fl_error(FLAME_ERR_UNAVAILABLE, "redis %s:%d: %s: no complete reply within the read timeout "
                               "(%d ms)", r->host, r->port, what, r->read_ms);
    drop_conn(r);
    return st;
}

/* redisBufferWrite with SIGPIPE kept from the process: hiredis writes with write(2), and a
 * write to a connection the server has closed (it sent FIN, then reset the connection as more
 * bytes came) raises SIGPIPE, whose default action kills the whole host process. The signal
 * is blocked in this thread around the write (the kernel sends it to the writing thread) and
 * one the write raised is consumed; one already pending stays for the host. */
static int buffer_write(redisContext *c, int *done)
{
    sigset_t pipe_set, old, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    if (pthread_sigmask(SIG_BLOCK, &pipe_set, &old) != 0) return redisBufferWrite(c, done);
    const bool was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
    const int rc = redisBufferWrite(c, done);
    if (!was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
        const struct timespec now = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &now) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* Sends what the pipeline holds before deadline_us; with progress_ms > 0, the deadline is
 * instead progress_ms after the last write that moved bytes. On failure the connection is
 * dropped (its pipeline is out of step). */
static flame_status send_pending(redis_source *r, uint64_t deadline_us, int progress_ms)
{
    redisContext *c = r->ctx;
    for (int done = 0; !done;) {
        if (progress_ms > 0) deadline_us = mono_us() + (uint64_t)progress_ms * 1000u;
        int w = wait_socket(c, POLLOUT, deadline_us);
        if (w <= 0) return w ? io_error(r, "send (poll)") : timed_out(r, "send");
        if (buffer_write(c, &done) != REDIS_OK) return io_error(r, "send");
    }
    return FLAME_OK;
}

/* Reads one reply (the pipeline already sent) before deadline_us. On failure the connection
 * is dropped. */
static flame_status read_reply(redis_source *r, uint64_t deadline_us, redisReply **out)
{
    redisContext *c = r->ctx;
    void *rep = NULL;
    if (redisGetReplyFromReader(c, &rep) != REDIS_OK) return io_error(r, "read");
    while (!rep) {
        int w = wait_socket(c, POLLIN, deadline_us);
        if (w <= 0) return w ? io_error(r, "read (poll)") : timed_out(r, "read");
        if (redisBufferRead(c) != REDIS_OK || redisGetReplyFromReader(c, &rep) != REDIS_OK)
            return io_error(r, "read");
    }
    *out = rep;
    return FLAME_OK;
}

/* Sends what the pipeline holds, then reads one reply, all before deadline_us. */
static flame_status get_reply(redis_source *r, uint64_t deadline_us, redisReply **out)
{
    flame_status st = send_pending(r, deadline_us, 0);
    return st ? st : read_reply(r, deadline_us, out);
}

/* Bytes the server sent that no reply read so far has consumed. */
static size_t unread_bytes(const redisContext *c)
{
    return c->reader && c->reader->len > c->reader->pos ? c->reader->len - c->reader->pos : 0;
}

/* Whether an idle connection is still in step: 0 when nothing is unread in its buffer nor
 * arriving on its socket; else 1 when the server closed it, 2 when it sent bytes nobody asked
 * for, which the next fetch would take for the replies to its own MGETs. */
static int idle_state(const redisContext *c)
{
    if (unread_bytes(c)) return 2;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return 0;
    char b;
    return recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0 ? 2 : 1;
}

static const char *reply_type(int type)
{
    switch (type) {
    case REDIS_REPLY_STRING: return "a string";
    case REDIS_REPLY_ARRAY: return "an array";
    case REDIS_REPLY_INTEGER: return "an integer";
    case REDIS_REPLY_NIL: return "nil";
    case REDIS_REPLY_STATUS: return "a status";
    case REDIS_REPLY_ERROR: return "an error";
    default: return "a reply of unknown type";
    }
}

/* One attempt over the current connection; every reply is in by deadline_us. */
static flame_status fetch_once(redis_source *r, const int64_t *ids, size_t n, flame_feature_batch *out,
                               uint64_t deadline_us)
{
    size_t per = (size_t)r->per_cmd < n ? (size_t)r->per_cmd : n;
    char *keys = malloc(per * 160);
    const char **argv = malloc((per + 1) * sizeof *argv);
    size_t *lens = malloc((per + 1) * sizeof *lens);
    flame_status st = keys && argv && lens ? FLAME_OK : fl_error(FLAME_ERR_NOMEM, "out of memory for a redis fetch");
    size_t cmds = 0;
    for (size_t i0 = 0; !st && i0 < n; i0 += per, cmds++) {
        size_t k = n - i0 < per ? n - i0 : per;
        argv[0] = "MGET", lens[0] = 4;
        for (size_t j = 0; j < k; j++) {
            char *key = keys + j * 160;
            lens[j + 1] = (size_t)snprintf(key, 160, "%s%lld", r->prefix, (long long)ids[i0 + j]);
            argv[j + 1] = key;
        }
        if (redisAppendCommandArgv(r->ctx, (int)k + 1, argv, lens) != REDIS_OK) st = io_error(r, "send");
    }
    for (size_t c = 0, i0 = 0; !st && c < cmds; c++, i0 += per) {
        redisReply *rep = NULL;
        if ((st = get_reply(r, deadline_us, &rep)) != FLAME_OK) break;
        size_t k = n - i0 < per ? n - i0 : per;
        if (rep->type == REDIS_REPLY_ERROR)
            st = fl_error(FLAME_ERR_UNAVAILABLE, "redis %s:%d: MGET of %zu keys answered an error: %s", r->host,
                          r->port, k, rep->str);
        else if (rep->type != REDIS_REPLY_ARRAY)
            st = fl_error(FLAME_ERR_UNAVAILABLE, "redis %s:%d: MGET of %zu keys answered %s, not an array", r->host,
                          r->port, k, reply_type(rep->type));
        else if (rep->elements != k)
            st = fl_error(FLAME_ERR_UNAVAILABLE, "redis %s:%d: MGET of %zu keys answered an array of %zu elements, "
                          "expected %zu", r->host, r->port, k, rep->elements, k);
        if (st) drop_conn(r); /* the pipeline is out of step: start over */
        for (size_t j = 0; !st && j < k; j++) {
            redisReply *v = rep->element[j];
            if (v->type == REDIS_REPLY_NIL) {
                out->rec[i0 + j] = (fl_rec_ref){.state = FL_REC_MISSING};
                continue;
            }
            char what[200];
            snprintf(what, sizeof what, "redis key '%s%lld'", r->prefix, (long long)ids[i0 + j]);
            if (v->type != REDIS_REPLY_STRING) {
                st = fl_error(FLAME_ERR_FORMAT, "%s: MGET answered %s for it, not a string or nil", what,
                              reply_type(v->type));
                break;
            }
            if (v->len > UINT32_MAX) { /* a batch's record lengths are 32-bit */
                st = fl_error(FLAME_ERR_FORMAT, "%s: record of %zu bytes is larger than 4 GiB", what, (size_t)v->len);
                break;
            }
            st = fl_rec_check((const uint8_t *)v->str, v->len, r->base.num_slots, what);
            if (!st) st = fl_batch_put_blob(out, i0 + j, (const uint8_t *)v->str, v->len);
        }
        freeReplyObject(rep);
        if (st && r->ctx) {
            /* drain the replies still queued so the connection stays in step */
            for (c++; c < cmds; c++) {
                flame_status keep = st;
                char why[512];
                snprintf(why, sizeof why, "%s", flame_last_error());
                if (get_reply(r, deadline_us, &rep) != FLAME_OK) {
                    fl_error(keep, "%s", why); /* the first failure is the one reported */
                    break;
                }
                freeReplyObject(rep);
            }
        }
    }
    /* bytes past the last reply: the server answered more than was asked, so which reply
     * answers which MGET is unknown (one shifted by an extra reply gives other keys' records) */
    const size_t extra = !st && r->ctx ? unread_bytes(r->ctx) : 0;
    if (extra) {
        st = fl_error(FLAME_ERR_UNAVAILABLE, "redis %s:%d: the server sent %zu bytes beyond the replies to the %zu MGETs "
                      "of the fetch: its replies cannot be matched to the keys", r->host, r->port, extra, cmds);
        drop_conn(r);
    }
    free(keys), free(argv), free(lens);
    return st;
}

static flame_status redis_fetch(struct flame_feature_source *s, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    redis_source *r = (redis_source *)s;
    /* the connection is busy with another fetch for at most its connect and read timeouts;
     * waiting longer than our own read timeout for it would let one slow server stall every
     * caller queued behind it */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += r->read_ms / 1000;
    until.tv_nsec += (long)(r->read_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    int rc = pthread_mutex_timedlock(&r->lock, &until);
    if (rc)
        return fl_error(FLAME_ERR_UNAVAILABLE, "redis %s:%d: the connection stayed busy with another fetch for the "
                        "read timeout (%d ms)%s", r->host, r->port, r->read_ms, rc == ETIMEDOUT ? "" : " (lock failed)");
    bool had_conn = r->ctx != NULL;
    const int idle = had_conn ? idle_state(r->ctx) : 0;
    if (idle) {
        /* closed by the server, or sent replies nobody asked for: a fresh connection (the
         * fetch's one retry, made before sending rather than after failing) */
        if (idle == 2)
            fl_log(FLAME_LOG_WARN, "redis %s:%d: the idle connection received bytes no command asked for; reconnecting",
                   r->host, r->port);
        else
            fl_log(FLAME_LOG_INFO, "redis %s:%d: the server closed the idle connection; reconnecting", r->host, r->port);
        drop_conn(r);
        had_conn = false;
    }
    flame_status st = ensure_conn(r);
    const uint64_t deadline = mono_us() + (uint64_t)r->read_ms * 1000u;
    if (!st) st = fetch_once(r, ids, n, out, deadline);
    /* a connection that broke since the last fetch (server restart, idle kill): one retry on
     * a fresh one, within the same deadline; reads are idempotent */
    if (st == FLAME_ERR_UNAVAILABLE && had_conn && !r->ctx && mono_us() < deadline) {
        st = ensure_conn(r);
        if (!st) st = fetch_once(r, ids, n, out, deadline);
    }
    pthread_mutex_unlock(&r->lock);
    return st;
}

static void redis_destroy(struct flame_feature_source *s)
{
    redis_source *r = (redis_source *)s;
    drop_conn(r);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

static const fl_source_ops redis_ops = {redis_fetch, redis_destroy};

static flame_status check_options(const flame_redis_options *o)
{
    struct {
        const char *name;
        int64_t v, lo, hi;
    } r[] = {{"port", o->port, 0, 65535},
             {"num_slots", o->num_slots, 0, FL_MAX_SLOTS},
             {"connect_timeout_ms", o->connect_timeout_ms, 0, 600000},
             {"read_timeout_ms", o->read_timeout_ms, 0, 600000},
             {"keys_per_command", o->keys_per_command, 0, 65536},
             {"backoff_min_ms", o->backoff_min_ms, 0, 600000},
             {"backoff_max_ms", o->backoff_max_ms, 0, 600000}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return fl_error(FLAME_ERR_INVALID_ARG, "redis option %s = %lld is out of range [%lld, %lld]", r[i].name,
                            (long long)r[i].v, (long long)r[i].lo, (long long)r[i].hi);
    if (o->host && strlen(o->host) >= 256) return fl_error(FLAME_ERR_INVALID_ARG, "redis host is longer than 255 bytes");
    if (o->key_prefix && strlen(o->key_prefix) >= 128)
        return fl_error(FLAME_ERR_INVALID_ARG, "redis key_prefix is longer than 127 bytes");
    return FLAME_OK;
}

static flame_status redis_open(const flame_redis_options *caller, redis_source **out)
{
    if (!caller) return fl_error(FLAME_ERR_INVALID_ARG, "redis options are NULL");
    flame_redis_options v = {0}, *o = &v; /* the caller's by the rule of core/abi.h */
    flame_status st = fl_struct_in("flame_redis_options", &v, sizeof v, caller);
    if (!st) st = check_options(o);
    if (st) return st;
    redis_source *r = calloc(1, sizeof *r);
    if (!r) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating a redis source");
    fl_source_init(&r->base, &redis_ops, o->num_slots);
    pthread_mutex_init(&r->lock, NULL);
    snprintf(r->host, sizeof r->host, "%s", o->host ? o->host : "127.0.0.1");
    snprintf(r->prefix, sizeof r->prefix, "%s", o->key_prefix ? o->key_prefix : "flame:item:");
    r->port = o->port ? o->port : 6379;
    r->connect_ms = o->connect_timeout_ms ? o->connect_timeout_ms : 200;
    r->read_ms = o->read_timeout_ms ? o->read_timeout_ms : 200;
    r->per_cmd = o->keys_per_command ? o->keys_per_command : 256;
    r->backoff_min = o->backoff_min_ms ? o->backoff_min_ms : 10;
    r->backoff_max = o->backoff_max_ms ? o->backoff_max_ms : 2000;
    if (r->backoff_max < r->backoff_min) r->backoff_max = r->backoff_min;
    st = ensure_conn(r);
    if (st) {
        redis_destroy(&r->base);
        return st;
    }
    *out = r;
    return FLAME_OK;
}

FLAME_API flame_status flame_feature_source_create_redis(const flame_redis_options *options,
                                                         flame_feature_source **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    if (!out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_feature_source_create_redis: out is NULL");
    redis_source *r;
    flame_status st = redis_open(options, &r);
    if (!st) *out = &r->base;
    return st;
}

/* Pipelined SETs, 1000 per round trip. However slowly the server reads or answers, no step
 * waits longer than the read timeout: each write must move bytes within it, and each reply
 * must be complete within it of the one before (hiredis's own timeout bounds one read(), so a
 * server trickling a reply byte by byte would hold a blocking read for ever). */
static flame_status load_table(redis_source *r, const fl_feature_table *t, uint64_t *written)
{
    enum { PER = 1000 };
    int64_t ids[PER]; /* the keys of the SETs awaiting replies, for the messages */
    size_t pending = 0;
    char key[160];
    for (size_t j = 0; j <= t->mask; j++) {
        if (t->offs[j]) {
            const char *argv[3] = {"SET", key, (const char *)t->blobs + t->offs[j] - 1};
            size_t lens[3] = {3, (size_t)snprintf(key, sizeof key, "%s%lld", r->prefix, (long long)t->keys[j]),
                              t->lens[j]};
            if (redisAppendCommandArgv(r->ctx, 3, argv, lens) != REDIS_OK) return io_error(r, "send");
            ids[pending++] = t->keys[j];
        }
        if (pending == PER || (j == t->mask && pending)) {
            flame_status st = send_pending(r, 0, r->read_ms);
            if (st) return st;
            for (size_t k = 0; k < pending; k++) {
                redisReply *rep = NULL;
                st = read_reply(r, mono_us() + (uint64_t)r->read_ms * 1000u, &rep);
                if (st) return st;
                const bool ok = rep->type == REDIS_REPLY_STATUS;
                if (!ok) {
                    const bool text = rep->type == REDIS_REPLY_ERROR && rep->str;
                    st = fl_error(FLAME_ERR_UNAVAILABLE, "redis %s:%d: SET of key '%s%lld' answered %s%s%.200s%s", r->host,
                                  r->port, r->prefix, (long long)ids[k], reply_type(rep->type), text ? " (" : "",
                                  text ? rep->str : "", text ? ")" : "");
                }
                freeReplyObject(rep);
                if (st) return st;
                (*written)++;
            }
            pending = 0;
        }
    }
    return FLAME_OK;
}

FLAME_API flame_status flame_redis_load_features(const flame_redis_options *options, const char *path,
                                                 uint64_t *written)
{
    fl_clear_error();
    if (written) *written = 0;
    if (!path) return fl_error(FLAME_ERR_INVALID_ARG, "flame_redis_load_features: path is NULL");
    fl_feature_table t;
    flame_status st = fl_feature_table_read(path, &t);
    if (st) return st;
    flame_redis_options o = {0};
    if (options && fl_struct_in("flame_redis_options", &o, sizeof o, options) == FLAME_OK &&
        o.num_slots != t.num_slots) {
        int32_t file_slots = t.num_slots;
        fl_feature_table_free(&t);
        return fl_error(FLAME_ERR_INVALID_ARG, "feature file '%s' has %d slots, the options say %d", path, file_slots,
                        o.num_slots);
    }
    redis_source *r = NULL;
    uint64_t n = 0;
    st = redis_open(options, &r);
    if (!st) {
        if (t.count) st = load_table(r, &t, &n);
        redis_destroy(&r->base);
    }
    fl_feature_table_free(&t);
    if (written) *written = n;
    return st;
}
