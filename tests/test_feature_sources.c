/* Feature batches and sources: the record API, the feature file, the async callback form and
 * the Redis source against a real server (FLAME_TEST_REDIS_PORT; absent = FAIL, never skip):
 * loader round trip, pipelining across commands, missing keys, bad values (undecodable, or
 * holding what the feature file refuses), read timeout, reconnect after the server drops the
 * connection, backoff after a refused connect; and fake servers: trickled, misshapen, extra
 * and refused replies. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <time.h>

#include "testutil.h"

#if FLAME_WITH_REDIS
#include <hiredis/hiredis.h>
#endif

static const char *features_text = "# two slots and two dense values\n"
                                   "flame-features 1 slots=2 dense=2\n"
                                   "1\t7\t3,4\t0.5,-1\n"
                                   "2\t\t\t0,0\n"
                                   "30\t19\t0\t1.25,2\n";

static void expect_slot(const flame_feature_batch *b, size_t i, int32_t slot, const int64_t *want, size_t n)
{
    int found;
    const int64_t *ids;
    size_t count;
    assert_int_equal(flame_feature_batch_get_slot(b, i, slot, &found, &ids, &count), FLAME_OK);
    assert_int_equal(found, 1);
    assert_int_equal(count, n);
    for (size_t k = 0; k < n; k++) assert_int_equal(ids[k], want[k]);
}

static void expect_missing(const flame_feature_batch *b, size_t i)
{
    int found = 1;
    const int64_t *ids;
    size_t count = 5;
    assert_int_equal(flame_feature_batch_get_slot(b, i, 0, &found, &ids, &count), FLAME_OK);
    assert_int_equal(found, 0);
    assert_int_equal(count, 0);
}

/* Checks the three records of features_text fetched as ids {30, 5, 1, 2}. */
static void expect_file_records(const flame_feature_batch *b)
{
    assert_int_equal(flame_feature_batch_size(b), 4);
    expect_slot(b, 0, 0, (int64_t[]){19}, 1);
    expect_slot(b, 0, 1, (int64_t[]){0}, 1);
    expect_missing(b, 1);
    expect_slot(b, 2, 0, (int64_t[]){7}, 1);
    expect_slot(b, 2, 1, (int64_t[]){3, 4}, 2);
    expect_slot(b, 3, 0, NULL, 0);
    expect_slot(b, 3, 1, NULL, 0);
    const float *d;
    size_t nd;
    assert_int_equal(flame_feature_batch_get_dense(b, 0, &d, &nd), FLAME_OK);
    assert_int_equal(nd, 2);
    assert_true(d[0] == 1.25f && d[1] == 2.0f);
    assert_int_equal(flame_feature_batch_get_dense(b, 2, &d, &nd), FLAME_OK);
    assert_true(nd == 2 && d[0] == 0.5f && d[1] == -1.0f);
}

static void test_batch_api(void **state)
{
    (void)state;
    flame_feature_batch *b = (flame_feature_batch *)1;
    assert_status_msg(flame_feature_batch_create(65, &b), FLAME_ERR_INVALID_ARG, "num_slots = 65 is out of range [0, 64]");
    assert_null(b);
    assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
    assert_int_equal(flame_feature_batch_size(b), 0);
    int64_t offs[3] = {0, 2, 1}, ids[2] = {1, 2};
    assert_status_msg(flame_feature_batch_set(b, 0, offs, ids, 2, NULL, 0), FLAME_ERR_INVALID_ARG,
                      "record index 0 is out of range [0, 0)");
    flame_feature_batch_destroy(b);
    flame_feature_batch_destroy(NULL);
}

/* A callback that writes record 0, then copies it into every other record from the batch's own
 * bag and values (read back with get_slot and get_dense), as one copying a repeated id's record
 * does: each copy grows the arena, which moves the record being copied. */
enum { OWN_IDS = 600 };

static flame_status copy_own_record(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user, (void)ids;
    int64_t bag[OWN_IDS], offs[2] = {0, OWN_IDS};
    for (int k = 0; k < OWN_IDS; k++) bag[k] = 1000 + k;
    const float dense[3] = {0.5f, -2.0f, 7.25f};
    flame_status st = flame_feature_batch_set(out, 0, offs, bag, OWN_IDS, dense, 3);
    for (size_t i = 1; i < n && st == FLAME_OK; i++) {
        int32_t found;
        const int64_t *own;
        const float *own_dense;
        size_t count, nd;
        if ((st = flame_feature_batch_get_slot(out, 0, 0, &found, &own, &count))) break;
        if ((st = flame_feature_batch_get_dense(out, 0, &own_dense, &nd))) break;
        const int64_t o[2] = {0, (int64_t)count};
        st = flame_feature_batch_set(out, i, o, own, count, own_dense, nd);
    }
    return st;
}

static void test_batch_set_from_own_records(void **state)
{
    (void)state;
    flame_feature_source *s;
    flame_feature_batch *b;
    assert_int_equal(flame_feature_source_create_callback(1, copy_own_record, NULL, NULL, &s), FLAME_OK);
    assert_int_equal(flame_feature_batch_create(1, &b), FLAME_OK);
    const int64_t ids[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    assert_int_equal(flame_feature_source_fetch(s, ids, 8, b), FLAME_OK);
    int64_t want[OWN_IDS];
    for (int k = 0; k < OWN_IDS; k++) want[k] = 1000 + k;
    for (size_t i = 0; i < 8; i++) {
        expect_slot(b, i, 0, want, OWN_IDS);
        const float *d;
        size_t nd;
        assert_int_equal(flame_feature_batch_get_dense(b, i, &d, &nd), FLAME_OK);
        assert_true(nd == 3 && d[0] == 0.5f && d[1] == -2.0f && d[2] == 7.25f);
    }
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(s);
}

static void test_file_source(void **state)
{
    (void)state;
    flame_feature_source *s;
    assert_int_equal(flame_feature_source_create_file(tu_write_text("f.txt", features_text), &s), FLAME_OK);
    assert_int_equal(flame_feature_source_num_slots(s), 2);
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
    int64_t ids[4] = {30, 5, 1, 2};
    assert_int_equal(flame_feature_source_fetch(s, ids, 4, b), FLAME_OK);
    expect_file_records(b);
    assert_status_msg(flame_feature_batch_get_slot(b, 0, 2, &(int){0}, &(const int64_t *){NULL}, &(size_t){0}),
                      FLAME_ERR_INVALID_ARG, "slot 2 is out of range [0, 2)");
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(s);
    /* malformed files name the line */
    assert_status_msg(flame_feature_source_create_file(tu_write_text("g.txt", "flame-features 1 slots=1 dense=0\n1\t2\t3\n"), &s),
                      FLAME_ERR_FORMAT, "g.txt:2: 3 tab-separated fields, expected 2");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("h.txt", "flame-features 1 slots=1 dense=0\n1\t2,x\n"), &s),
                      FLAME_ERR_FORMAT, "h.txt:2: slot 0: bad id list '2,x'");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("i.txt", "flame-features 1 slots=1 dense=0\n1\t2\n1\t3\n"), &s),
                      FLAME_ERR_FORMAT, "i.txt:3: id 1 appears twice");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("k.txt", "flame-features 1 slots=1 dense=0\n-1\t2\n"), &s),
                      FLAME_ERR_FORMAT, "k.txt:2: item id -1 is negative");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("l.txt", "flame-features 1 slots=2 dense=0\n4\t2\t1,-3\n"), &s),
                      FLAME_ERR_FORMAT, "l.txt:2: slot 1: id -3 is negative");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("j.txt", "slots=1\n"), &s), FLAME_ERR_FORMAT,
                      "j.txt:1: expected the header");
    assert_status_msg(flame_feature_source_create_file("/nonexistent/x", &s), FLAME_ERR_IO, "cannot open feature file");
    assert_null(s);
    /* an empty list entry, a value out of float's range or not finite, a NUL inside a line */
    assert_status_msg(flame_feature_source_create_file(tu_write_text("m.txt", "flame-features 1 slots=1 dense=0\n1\t2,3,\n"), &s),
                      FLAME_ERR_FORMAT, "m.txt:2: slot 0: bad id list '2,3,'");
    const char *dense_bad[] = {"1e999", "inf", "nan", "0.5,"};
    for (int i = 0; i < 4; i++) {
        char text[96];
        snprintf(text, sizeof text, "flame-features 1 slots=1 dense=1\n1\t2\t%s\n", dense_bad[i]);
        assert_status_msg(flame_feature_source_create_file(tu_write_text("n.txt", text), &s), FLAME_ERR_FORMAT,
                          "n.txt:2: dense: expected 1 comma-separated finite floats");
        assert_null(s);
    }
    static const char with_nul[] = "flame-features 1 slots=1 dense=0\n17\t4\0,99\n";
    char path[256];
    snprintf(path, sizeof path, "%s/o.txt", tu_tmpdir());
    FILE *f = fopen(path, "w");
    assert_int_equal(fwrite(with_nul, 1, sizeof with_nul - 1, f), sizeof with_nul - 1);
    fclose(f);
    assert_status_msg(flame_feature_source_create_file(path, &s), FLAME_ERR_FORMAT, "o.txt:2: a NUL byte at column 5");
    /* opens, cannot be read */
    assert_status_msg(flame_feature_source_create_file(tu_tmpdir(), &s), FLAME_ERR_IO, "Is a directory");
    assert_null(s);
}

/* ---- async callback: completes from another thread */

typedef struct job {
    int64_t ids[16];
    size_t n;
    flame_feature_batch *out;
} job;

static void *complete_later(void *p)
{
    job *j = p;
    usleep(20000);
    for (size_t i = 0; i < j->n; i++) {
        int64_t offs[2] = {0, 1}, v = j->ids[i] * 2;
        if (j->ids[i] < 0)
            flame_feature_batch_set_missing(j->out, i);
        else
            flame_feature_batch_set(j->out, i, offs, &v, 1, NULL, 0);
    }
    flame_feature_batch_complete(j->out, j->n == 3 ? FLAME_ERR_UNAVAILABLE : FLAME_OK);
    free(j);
    return NULL;
}

static void fetch_async(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (*(int *)user)++;
    job *j = malloc(sizeof *j);
    memcpy(j->ids, ids, n * 8);
    j->n = n;
    j->out = out;
    pthread_t t;
    pthread_create(&t, NULL, complete_later, j);
    pthread_detach(t);
}

static void test_async_callback_through_cache(void **state)
{
    (void)state;
    int calls = 0;
    flame_feature_source *s;
    assert_status_msg(flame_feature_source_create_callback(1, NULL, NULL, NULL, &s), FLAME_ERR_INVALID_ARG, "exactly one");
    assert_int_equal(flame_feature_source_create_callback(1, NULL, fetch_async, &calls, &s), FLAME_OK);
    flame_item_cache *c;
    assert_int_equal(flame_item_cache_create(s, NULL, &c), FLAME_OK);
    flame_feature_source_destroy(s); /* the cache holds its own reference */
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(1, &b), FLAME_OK);
    int64_t ids[2] = {21, -4};
    assert_int_equal(flame_item_cache_get(c, ids, 2, b), FLAME_OK);
    expect_slot(b, 0, 0, (int64_t[]){42}, 1);
    expect_missing(b, 1);
    assert_int_equal(calls, 1);
    int64_t three[3] = {1, 2, 3}; /* this completion reports a failure */
    assert_status_msg(flame_item_cache_get(c, three, 3, b), FLAME_ERR_UNAVAILABLE, "feature callback failed");
    flame_item_cache_stats st = {.struct_size = sizeof st};
    flame_item_cache_get_stats(c, &st);
    assert_int_equal(st.entries, 2); /* nothing cached for the failed ids */
    flame_feature_batch_destroy(b);
    flame_item_cache_destroy(c);
}

/* ---- Redis (a library built with WITH_REDIS=0 has a stand-in: test_optional_modules) */
#if FLAME_WITH_REDIS


static int redis_port(void)
{
    const char *p = getenv("FLAME_TEST_REDIS_PORT");
    if (!p || !*p)
        fail_msg("FLAME_TEST_REDIS_PORT is not set: the Redis tests need a server (tests/run-tests.sh starts one when "
                 "redis-server is installed; apt-get install redis-server)");
    return atoi(p);
}

static redisContext *admin(void)
{
    redisContext *c = redisConnect("127.0.0.1", redis_port());
    if (!c || c->err) fail_msg("cannot connect to the test redis on port %d", redis_port());
    return c;
}

static flame_redis_options opts(const char *prefix)
{
    return (flame_redis_options){.struct_size = sizeof(flame_redis_options), .port = redis_port(),
                                 .key_prefix = prefix, .num_slots = 2, .keys_per_command = 2,
                                 .read_timeout_ms = 500};
}

static void test_redis_load_and_fetch(void **state)
{
    (void)state;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "flametest:%d:a:", (int)getpid());
    flame_redis_options o = opts(prefix);
    uint64_t written = 0;
    assert_int_equal(flame_redis_load_features(&o, tu_write_text("r.txt", features_text), &written), FLAME_OK);
    assert_int_equal(written, 3);
    flame_feature_source *s;
    assert_int_equal(flame_feature_source_create_redis(&o, &s), FLAME_OK);
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
    int64_t ids[4] = {30, 5, 1, 2}; /* 2 keys per MGET: two pipelined commands */
    assert_int_equal(flame_feature_source_fetch(s, ids, 4, b), FLAME_OK);
    expect_file_records(b);
    /* the documented encoding, written by hand: 2 slots, 0 dense, counts {1, 0}, pad, id 77 */
    redisContext *a = admin();
    uint8_t v[24] = {2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 77};
    redisReply *r = redisCommand(a, "SET %s9 %b", prefix, v, sizeof v);
    freeReplyObject(r);
    int64_t nine = 9;
    assert_int_equal(flame_feature_source_fetch(s, &nine, 1, b), FLAME_OK);
    expect_slot(b, 0, 0, (int64_t[]){77}, 1);
    expect_slot(b, 0, 1, NULL, 0);
    /* a value that does not decode fails the fetch, naming the key; the connection stays usable */
    r = redisCommand(a, "SET %s8 garbage!", prefix);
    freeReplyObject(r);
    int64_t eight[3] = {1, 8, 30};
    char want[128];
    snprintf(want, sizeof want, "redis key '%s8': record has", prefix);
    assert_status_msg(flame_feature_source_fetch(s, eight, 3, b), FLAME_ERR_FORMAT, want);
    assert_int_equal(flame_feature_source_fetch(s, ids, 4, b), FLAME_OK);
    expect_file_records(b);
    r = redisCommand(a, "DEL %s1 %s2 %s30 %s8 %s9", prefix, prefix, prefix, prefix, prefix);
    freeReplyObject(r);
    redisFree(a);
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(s);
    o.num_slots = 3;
    assert_status_msg(flame_redis_load_features(&o, tu_write_text("r.txt", features_text), NULL), FLAME_ERR_INVALID_ARG,
                      "has 2 slots, the options say 3");
    o.struct_size = 4;
    assert_status_msg(flame_feature_source_create_redis(&o, &s), FLAME_ERR_INVALID_ARG, "struct_size = 4");
}

/* A record of 2 slots ({a}, {b}) and 2 dense values ({d0, d1}) in the documented encoding:
 * u32 2, u32 2, u32 counts {1, 1} (16 bytes, already a multiple of 8), i64 a, i64 b, f32 d0, d1. */
enum { HAND_RECORD_BYTES = 40 };
static void hand_record(uint8_t *v, int64_t a, int64_t b, float d0, float d1)
{
    const uint32_t head[4] = {2, 2, 1, 1};
    memcpy(v, head, 16);
    memcpy(v + 16, &a, 8);
    memcpy(v + 24, &b, 8);
    memcpy(v + 32, &d0, 4);
    memcpy(v + 36, &d1, 4);
}

/* Values the feature file refuses are refused from Redis too: a dense value that is NaN or
 * infinite, a negative id in a bag (FLAME_ERR_FORMAT naming the key, the slot or index and the
 * value), a record kept under a negative id; the connection stays usable, and through the item
 * cache only the bad id fails. */
static void test_redis_hostile_values(void **state)
{
    (void)state;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "flametest:%d:h:", (int)getpid());
    flame_redis_options o = opts(prefix);
    flame_feature_source *s;
    assert_int_equal(flame_feature_source_create_redis(&o, &s), FLAME_OK);
    redisContext *a = admin();
    static const struct {
        int64_t key, b;
        float d1;
        const char *want;
    } recs[] = {{1, 2, 0.5f, NULL},
                {11, 2, NAN, "dense[1] = nan is not a finite float"},
                {12, 2, INFINITY, "dense[1] = inf is not a finite float"},
                {13, 2, -INFINITY, "dense[1] = -inf is not a finite float"},
                {14, -3, 0.5f, "slot 1: id -3 is negative"},
                {-5, 2, 0.5f, NULL}};
    uint8_t v[HAND_RECORD_BYTES];
    for (size_t i = 0; i < sizeof recs / sizeof recs[0]; i++) {
        hand_record(v, 7, recs[i].b, -0.0f, recs[i].d1);
        redisReply *r = redisCommand(a, "SET %s%lld %b", prefix, (long long)recs[i].key, v, sizeof v);
        freeReplyObject(r);
    }
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
    const int64_t one = 1;
    assert_int_equal(flame_feature_source_fetch(s, &one, 1, b), FLAME_OK);
    expect_slot(b, 0, 1, (int64_t[]){2}, 1);
    for (size_t i = 1; i < 5; i++) {
        const int64_t ids[3] = {1, recs[i].key, 1}; /* 2 keys per MGET: the bad one in the first */
        char want[160];
        snprintf(want, sizeof want, "redis key '%s%lld': %s", prefix, (long long)recs[i].key, recs[i].want);
        assert_status_msg(flame_feature_source_fetch(s, ids, 3, b), FLAME_ERR_FORMAT, want);
        assert_int_equal(flame_feature_batch_size(b), 0);
        assert_int_equal(flame_feature_source_fetch(s, &one, 1, b), FLAME_OK); /* still in step */
        expect_slot(b, 0, 1, (int64_t[]){2}, 1);
    }
    const int64_t neg[2] = {1, -5};
    assert_status_msg(flame_feature_source_fetch(s, neg, 2, b), FLAME_ERR_FORMAT,
                      "a record for item id -5 (record 1), which is negative");
    /* through the item cache: the bad ids fail alone, the good one is cached */
    flame_item_cache *c;
    flame_item_cache_params p = {.struct_size = sizeof p, .manual_refresh = 1};
    assert_int_equal(flame_item_cache_create(s, &p, &c), FLAME_OK);
    const int64_t mixed[3] = {12, 1, -5};
    char want[160];
    snprintf(want, sizeof want, "redis key '%s12': dense[1] = inf is not a finite float", prefix);
    assert_status_msg(flame_item_cache_get(c, mixed, 3, b), FLAME_ERR_FORMAT, want);
    flame_item_cache_stats st = {.struct_size = sizeof st};
    assert_int_equal(flame_item_cache_get_stats(c, &st), FLAME_OK);
    assert_int_equal(st.entries, 1);
    assert_int_equal(flame_item_cache_get(c, &one, 1, b), FLAME_OK);
    expect_slot(b, 0, 0, (int64_t[]){7}, 1);
    flame_item_cache_destroy(c);
    redisReply *r = redisCommand(a, "DEL %s1 %s11 %s12 %s13 %s14 %s-5", prefix, prefix, prefix, prefix, prefix, prefix);
    freeReplyObject(r);
    redisFree(a);
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(s);
}

static void test_redis_reconnect(void **state)
{
    (void)state;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "flametest:%d:b:", (int)getpid());
    flame_redis_options o = opts(prefix);
    assert_int_equal(flame_redis_load_features(&o, tu_write_text("r.txt", features_text), NULL), FLAME_OK);
    flame_feature_source *s;
    assert_int_equal(flame_feature_source_create_redis(&o, &s), FLAME_OK);
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
    int64_t ids[4] = {30, 5, 1, 2};
    assert_int_equal(flame_feature_source_fetch(s, ids, 4, b), FLAME_OK);
    /* the server drops every normal client (ours included); the next fetch reconnects */
    redisContext *a = admin();
    redisReply *r = redisCommand(a, "CLIENT KILL TYPE normal SKIPME yes");
    assert_non_null(r);
    assert_true(r->type == REDIS_REPLY_INTEGER && r->integer >= 1);
    freeReplyObject(r);
    assert_int_equal(flame_feature_source_fetch(s, ids, 4, b), FLAME_OK);
    expect_file_records(b);
    r = redisCommand(a, "DEL %s1 %s2 %s30", prefix, prefix, prefix);
    freeReplyObject(r);
    redisFree(a);
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(s);
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

static void test_redis_timeout_and_backoff(void **state)
{
    (void)state;
    /* a listener that accepts (the kernel's backlog) but never answers: the read times out */
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    assert_int_equal(bind(ls, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(ls, 8), 0);
    getsockname(ls, (struct sockaddr *)&sa, &len);
    flame_redis_options o = opts("x:");
    o.port = ntohs(sa.sin_port);
    o.read_timeout_ms = 150;
    o.backoff_min_ms = 300;
    flame_feature_source *s;
    assert_int_equal(flame_feature_source_create_redis(&o, &s), FLAME_OK);
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
    int64_t id = 1;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_status_msg(flame_feature_source_fetch(s, &id, 1, b), FLAME_ERR_UNAVAILABLE, "read");
    double ms = ms_since(&t0);
    assert_true(ms >= 140 && ms < 1000); /* timed out, retried once on a fresh connection at most */
    close(ls);
    /* now nothing listens: connect is refused, then the backoff answers at once */
    assert_status_msg(flame_feature_source_fetch(s, &id, 1, b), FLAME_ERR_UNAVAILABLE, "cannot connect");
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_status_msg(flame_feature_source_fetch(s, &id, 1, b), FLAME_ERR_UNAVAILABLE, "backing off");
    assert_true(ms_since(&t0) < 50);
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(s);
    o.port = ntohs(sa.sin_port);
    assert_status_msg(flame_feature_source_create_redis(&o, &s), FLAME_ERR_UNAVAILABLE, "cannot connect");
    assert_null(s);
}

/* ---- a fake Redis on 127.0.0.1: on each connection, every request read is answered with
 * `reply` (reply_len bytes, or up to its NUL when 0), sent one byte every gap_ms (at once with
 * 0), then with `extra` (extra_len bytes) after extra_delay_ms when set, until the client goes
 * or stop is set. */
typedef struct fake_redis {
    int ls, port, gap_ms;
    const char *reply;
    size_t reply_len;
    const char *extra;
    size_t extra_len;
    int extra_delay_ms;
    size_t half_close_after; /* instead of answering: after this many bytes, shut its sending side
                                (FIN), read as many more, then close with them unread (RST) */
    atomic_bool stop;
    pthread_t th;
} fake_redis;

static bool readable(int fd, const fake_redis *f)
{
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 20) > 0) return true;
    }
    return false;
}

static void *fake_redis_run(void *p)
{
    fake_redis *f = p;
    while (readable(f->ls, f)) {
        int c = accept(f->ls, NULL, NULL);
        if (c < 0) continue;
        char buf[4096];
        bool ok = true;
        for (int half = 0; f->half_close_after && half < 2; half++) {
            for (size_t got = 0; got < f->half_close_after && readable(c, f);) {
                ssize_t k = recv(c, buf, sizeof buf, 0);
                if (k <= 0) break;
                got += (size_t)k;
            }
            if (!half) shutdown(c, SHUT_WR);
            ok = false;
        }
        while (ok && readable(c, f) && recv(c, buf, sizeof buf, 0) > 0) {
            size_t n = f->reply_len ? f->reply_len : strlen(f->reply), step = f->gap_ms ? 1 : n;
            for (size_t i = 0; ok && i < n && !atomic_load(&f->stop); i += step) {
                ok = send(c, f->reply + i, step, MSG_NOSIGNAL) == (ssize_t)step;
                if (f->gap_ms) usleep((useconds_t)f->gap_ms * 1000);
            }
            if (ok && f->extra) {
                usleep((useconds_t)f->extra_delay_ms * 1000);
                ok = send(c, f->extra, f->extra_len, MSG_NOSIGNAL) == (ssize_t)f->extra_len;
            }
        }
        close(c);
    }
    return NULL;
}

static void fake_redis_start_with(fake_redis *f, fake_redis how)
{
    *f = how;
    f->ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (f->half_close_after) { /* a small window: the client's bytes queue on its side, not here */
        int small = 4096;
        setsockopt(f->ls, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    }
    assert_int_equal(bind(f->ls, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(f->ls, 8), 0);
    getsockname(f->ls, (struct sockaddr *)&sa, &len);
    f->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&f->th, NULL, fake_redis_run, f), 0);
}

static void fake_redis_start(fake_redis *f, const char *reply, int gap_ms)
{
    fake_redis_start_with(f, (fake_redis){.reply = reply, .gap_ms = gap_ms});
}

static flame_redis_options fake_opts(const fake_redis *f)
{
    return (flame_redis_options){.struct_size = sizeof(flame_redis_options), .port = f->port, .key_prefix = "x:",
                                 .num_slots = 2, .read_timeout_ms = 500, .backoff_min_ms = 1};
}

static void fake_redis_stop(fake_redis *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
    close(f->ls);
}

typedef struct slow_fetch {
    flame_feature_source *s;
    int delay_ms;
    flame_status st;
    char msg[512];
    double ms;
} slow_fetch;

static void *slow_fetch_run(void *p)
{
    slow_fetch *x = p;
    usleep((useconds_t)x->delay_ms * 1000);
    flame_feature_batch *b;
    if (flame_feature_batch_create(2, &b)) abort();
    int64_t id = 1;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    x->st = flame_feature_source_fetch(x->s, &id, 1, b);
    x->ms = ms_since(&t0);
    snprintf(x->msg, sizeof x->msg, "%s", flame_last_error());
    flame_feature_batch_destroy(b);
    return NULL;
}

/* A server trickling one byte every 150 ms: the read timeout (200 ms) bounds the whole reply,
 * not each read, and a second fetch queued behind the stuck one gives up at its own deadline
 * instead of waiting for it (a 35-byte reply would hold both for over 5 s). */
static void test_redis_trickling_server_is_bounded(void **state)
{
    (void)state;
    fake_redis f;
    fake_redis_start(&f, "*1\r\n$24\r\nxxxxxxxxxxxxxxxxxxxxxxxx\r\n", 150);
    flame_redis_options o = fake_opts(&f);
    o.read_timeout_ms = 200;
    flame_feature_source *s;
    assert_int_equal(flame_feature_source_create_redis(&o, &s), FLAME_OK);
    slow_fetch a = {.s = s}, b = {.s = s, .delay_ms = 50};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, slow_fetch_run, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, slow_fetch_run, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.st, FLAME_ERR_UNAVAILABLE);
    assert_non_null(strstr(a.msg, "no complete reply within the read timeout (200 ms)"));
    assert_true(a.ms >= 190 && a.ms < 1500);
    /* b waited for the connection (at most 200 ms), then had its own 200 ms with the server */
    assert_int_equal(b.st, FLAME_ERR_UNAVAILABLE);
    assert_true(b.ms < 1500);
    flame_feature_source_destroy(s);
    fake_redis_stop(&f);
}

/* Replies of the wrong shape name what came back. */
static void test_redis_mget_reply_shapes(void **state)
{
    (void)state;
    static const struct {
        const char *reply, *want;
    } cases[] = {{"*2\r\n$-1\r\n$-1\r\n", "MGET of 1 keys answered an array of 2 elements, expected 1"},
                 {"*0\r\n", "MGET of 1 keys answered an array of 0 elements, expected 1"},
                 {"+OK\r\n", "MGET of 1 keys answered a status, not an array"},
                 {":7\r\n", "MGET of 1 keys answered an integer, not an array"},
                 {"-ERR no\r\n", "MGET of 1 keys answered an error: ERR no"},
                 /* an element that is neither a value nor nil names the key (FLAME_ERR_FORMAT below) */
                 {"*1\r\n:5\r\n", "redis key 'x:1': MGET answered an integer for it, not a string or nil"},
                 /* a length no fetch reads is refused before its element pointers are allocated */
                 {"*299999999\r\n", "read: an array reply longer than 65536 elements"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_redis f;
        fake_redis_start(&f, cases[i].reply, 0);
        flame_redis_options o = fake_opts(&f);
        flame_feature_source *s;
        assert_int_equal(flame_feature_source_create_redis(&o, &s), FLAME_OK);
        flame_feature_batch *b;
        assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
        int64_t id = 1;
        assert_status_msg(flame_feature_source_fetch(s, &id, 1, b),
                          strstr(cases[i].want, "redis key") ? FLAME_ERR_FORMAT : FLAME_ERR_UNAVAILABLE, cases[i].want);
        flame_feature_batch_destroy(b);
        flame_feature_source_destroy(s);
        fake_redis_stop(&f);
    }
}

/* A record of 2 slots, no dense values: slot 0 holds the one id 77. */
#define REC77 "\x02\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\0" "M\0\0\0\0\0\0\0"

/* Fetches id 1, three times, from a server that answers each MGET with nil and also sends a
 * reply no command asked for, holding id 77's record: with the extra reply in the same read
 * or arriving later on the idle connection, no fetch ever takes it for its answer (it would
 * give id 1 the record of 77). */
static void test_redis_unrequested_replies_are_never_answers(void **state)
{
    (void)state;
    static const char both[] = "*1\r\n$-1\r\n*1\r\n$24\r\n" REC77 "\r\n";
    static const char extra[] = "*1\r\n$24\r\n" REC77 "\r\n";
    for (int later = 0; later < 2; later++) {
        fake_redis f;
        if (later)
            fake_redis_start_with(&f, (fake_redis){.reply = "*1\r\n$-1\r\n", .extra = extra,
                                                   .extra_len = sizeof extra - 1, .extra_delay_ms = 30});
        else
            fake_redis_start_with(&f, (fake_redis){.reply = both, .reply_len = sizeof both - 1});
        flame_redis_options o = fake_opts(&f);
        flame_feature_source *s;
        assert_int_equal(flame_feature_source_create_redis(&o, &s), FLAME_OK);
        flame_feature_batch *b;
        assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
        int unavailable = 0;
        for (int k = 0; k < 3; k++) {
            const int64_t id = 1;
            flame_status st = flame_feature_source_fetch(s, &id, 1, b);
            if (st) {
                assert_int_equal(st, FLAME_ERR_UNAVAILABLE);
                assert_non_null(strstr(flame_last_error(), "bytes beyond the replies to the 1 MGETs of the fetch"));
                unavailable++;
            } else {
                expect_missing(b, 0);
            }
            usleep(80000); /* the delayed extra reply has come */
        }
        if (later) assert_int_equal(unavailable, 0); /* the idle connection is replaced before sending */
        flame_feature_batch_destroy(b);
        flame_feature_source_destroy(s);
        fake_redis_stop(&f);
    }
}

/* A server that closes its side while a fetch is still sending (FIN, then a reset as more
 * bytes come) makes the next write raise SIGPIPE, which kills the process unless the library
 * keeps it: the fetch fails with FLAME_ERR_UNAVAILABLE instead (a pipeline of 600,000 keys,
 * about 15 MB, more than the socket buffers hold, is still being written when the reset
 * comes). */
static void test_redis_server_closing_mid_send_is_no_sigpipe(void **state)
{
    (void)state;
    fake_redis f;
    fake_redis_start_with(&f, (fake_redis){.reply = "", .half_close_after = 1 << 20});
    flame_redis_options o = fake_opts(&f);
    o.num_slots = 1;
    o.keys_per_command = 65536;
    o.read_timeout_ms = 2000;
    flame_feature_source *s;
    assert_int_equal(flame_feature_source_create_redis(&o, &s), FLAME_OK);
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(1, &b), FLAME_OK);
    const size_t n = 600000;
    int64_t *ids = malloc(n * sizeof *ids);
    assert_non_null(ids);
    for (size_t i = 0; i < n; i++) ids[i] = 1000000 + (int64_t)i;
    assert_status_msg(flame_feature_source_fetch(s, ids, n, b), FLAME_ERR_UNAVAILABLE, "send");
    assert_int_equal(flame_feature_batch_size(b), 0);
    sigset_t pending;
    assert_int_equal(sigpending(&pending), 0);
    assert_false(sigismember(&pending, SIGPIPE)); /* consumed, not left for the host */
    free(ids);
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(s);
    fake_redis_stop(&f);
}

/* The loader against a server trickling an endless reply (one byte every 50 ms, each within
 * hiredis's per-read timeout) gives up at the read timeout instead of waiting for it; a SET
 * refused names its key and the server's error. */
static void test_redis_load_bounded_and_named(void **state)
{
    (void)state;
    const char *path = tu_write_text("one.txt", "flame-features 1 slots=2 dense=2\n5\t7\t3\t0.5,-1\n");
    fake_redis f;
    fake_redis_start(&f, "$100\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\r\n", 50);
    flame_redis_options o = fake_opts(&f);
    o.read_timeout_ms = 200;
    uint64_t written = 9;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_status_msg(flame_redis_load_features(&o, path, &written), FLAME_ERR_UNAVAILABLE,
                      "no complete reply within the read timeout (200 ms)");
    assert_true(ms_since(&t0) < 1500); /* not the 5 s the whole reply takes */
    assert_int_equal(written, 0);
    fake_redis_stop(&f);
    fake_redis_start(&f, "-ERR read only\r\n", 0);
    o = fake_opts(&f);
    assert_status_msg(flame_redis_load_features(&o, path, &written), FLAME_ERR_UNAVAILABLE,
                      "SET of key 'x:5' answered an error (ERR read only)");
    assert_int_equal(written, 0);
    fake_redis_stop(&f);
}

#endif /* FLAME_WITH_REDIS */

/* A callback source: item 1's bag lists items 100..(100 + RELATED - 1), every other item's its
 * id x 10; item 7777 fails the whole fetch. */
enum { RELATED = 600 };
static flame_status related_fetch(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    static int64_t v[RELATED];
    for (size_t i = 0; i < n; i++) {
        if (ids[i] == 7777) return FLAME_ERR_FORMAT;
        const size_t k = ids[i] == 1 ? RELATED : 1;
        for (size_t j = 0; j < k; j++) v[j] = ids[i] == 1 ? 100 + (int64_t)j : ids[i] * 10;
        const int64_t off[2] = {0, (int64_t)k};
        flame_status st = flame_feature_batch_set(out, i, off, v, k, NULL, 0);
        if (st) return st;
    }
    return FLAME_OK;
}

/* ids read back from the output batch itself (a record's bag of related items) and passed as
 * the next call's ids into the same batch: read from a copy, not from records being rewritten;
 * a count of records whose sizes cannot be held is refused before the batch is touched; a
 * failed fetch leaves an empty batch. */
static void test_ids_from_own_batch_and_batch_bounds(void **state)
{
    (void)state;
    flame_feature_source *src;
    assert_int_equal(flame_feature_source_create_callback(1, related_fetch, NULL, NULL, &src), FLAME_OK);
    flame_item_cache_params p = {.struct_size = sizeof p, .manual_refresh = 1};
    flame_item_cache *c;
    assert_int_equal(flame_item_cache_create(src, &p, &c), FLAME_OK);
    for (int via_cache = 0; via_cache < 2; via_cache++) {
        flame_feature_batch *b, *warm;
        assert_int_equal(flame_feature_batch_create(1, &b), FLAME_OK);
        assert_int_equal(flame_feature_batch_create(1, &warm), FLAME_OK);
        int64_t first[50]; /* some of the related items cached: hits are copied into the batch first */
        for (int i = 0; i < 50; i++) first[i] = 100 + i;
        assert_int_equal(flame_item_cache_get(c, first, 50, warm), FLAME_OK);
        const int64_t one = 1;
        assert_int_equal(flame_feature_source_fetch(src, &one, 1, b), FLAME_OK);
        int32_t found;
        const int64_t *rel;
        size_t n;
        assert_int_equal(flame_feature_batch_get_slot(b, 0, 0, &found, &rel, &n), FLAME_OK);
        assert_int_equal(n, RELATED);
        flame_status st = via_cache ? flame_item_cache_get(c, rel, n, b) : flame_feature_source_fetch(src, rel, n, b);
        assert_int_equal(st, FLAME_OK);
        assert_int_equal(flame_feature_batch_size(b), RELATED);
        for (size_t i = 0; i < RELATED; i++) {
            const int64_t *v;
            size_t k;
            assert_int_equal(flame_feature_batch_get_slot(b, i, 0, &found, &v, &k), FLAME_OK);
            assert_true(found);
            assert_int_equal(k, 1);
            assert_int_equal(v[0], (100 + (int64_t)i) * 10);
        }
        /* ids claimed to lie in the batch's records but running past them */
        assert_int_equal(flame_feature_batch_get_slot(b, 0, 0, &found, &rel, &n), FLAME_OK);
        st = via_cache ? flame_item_cache_get(c, rel, 1u << 30, b) : flame_feature_source_fetch(src, rel, 1u << 30, b);
        assert_int_equal(st, FLAME_ERR_INVALID_ARG);
        assert_non_null(strstr(flame_last_error(), "run past"));
        assert_int_equal(flame_feature_batch_size(b), RELATED); /* untouched */
        /* more records than a size_t can size */
        st = via_cache ? flame_item_cache_get(c, first, SIZE_MAX, b) : flame_feature_source_fetch(src, first, SIZE_MAX, b);
        assert_int_equal(st, FLAME_ERR_INVALID_ARG);
        assert_non_null(strstr(flame_last_error(), "18446744073709551615 records is too large"));
        assert_int_equal(flame_feature_batch_size(b), RELATED);
        flame_feature_batch_destroy(warm);
        flame_feature_batch_destroy(b);
    }
    /* a fetch that fails leaves an empty batch, not the records written before the failure */
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(1, &b), FLAME_OK);
    const int64_t ids[3] = {5, 6, 7777};
    assert_int_equal(flame_feature_source_fetch(src, ids, 3, b), FLAME_ERR_FORMAT);
    assert_int_equal(flame_feature_batch_size(b), 0);
    flame_feature_batch_destroy(b);
    flame_item_cache_destroy(c);
    flame_feature_source_destroy(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_api),
        cmocka_unit_test(test_batch_set_from_own_records),
        cmocka_unit_test(test_file_source),
        cmocka_unit_test(test_async_callback_through_cache),
        cmocka_unit_test(test_ids_from_own_batch_and_batch_bounds),
#if FLAME_WITH_REDIS
        cmocka_unit_test(test_redis_load_and_fetch),
        cmocka_unit_test(test_redis_hostile_values),
        cmocka_unit_test(test_redis_reconnect),
        cmocka_unit_test(test_redis_timeout_and_backoff),
        cmocka_unit_test(test_redis_trickling_server_is_bounded),
        cmocka_unit_test(test_redis_mget_reply_shapes),
        cmocka_unit_test(test_redis_unrequested_replies_are_never_answers),
        cmocka_unit_test(test_redis_load_bounded_and_named),
        cmocka_unit_test(test_redis_server_closing_mid_send_is_no_sigpipe),
#endif
    };
    return cmocka_run_group_tests_name("feature_sources", tests, NULL, NULL);
}
