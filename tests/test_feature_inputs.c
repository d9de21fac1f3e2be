/* Feature inputs at the edges: the feature file's header integers (full-range parsing, no
 * wrap-around), subnormal dense values (read back exactly), the per-line id limit, a
 * callback returning a value that is not a flame_status (sync and async forms), and the
 * values the feature file refuses (a non-finite dense value, a negative id) refused as well
 * when a caller or a callback writes them. */
#include <float.h>
#include <pthread.h>

#include "testutil.h"

/* ---- header integers: parsed with their full range, never wrapped */

static void test_header_integers(void **state)
{
    (void)state;
    flame_feature_source *s;
    /* 4294967298 = 2^32 + 2: sscanf %d wrapped it to 2 and the file was read with 2 slots */
    assert_status_msg(flame_feature_source_create_file(
                          tu_write_text("h1.txt", "flame-features 1 slots=4294967298 dense=0\n1\t5,6\t\n"), &s),
                      FLAME_ERR_FORMAT, "h1.txt:1: header slots=4294967298 is out of range 0..64");
    assert_null(s);
    assert_status_msg(flame_feature_source_create_file(
                          tu_write_text("h2.txt", "flame-features 1 slots=99999999999999999999999 dense=0\n"), &s),
                      FLAME_ERR_FORMAT, "h2.txt:1: header slots=99999999999999999999999 is out of range 0..64");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("h3.txt", "flame-features 1 slots=-1 dense=0\n"), &s),
                      FLAME_ERR_FORMAT, "h3.txt:1: header slots=-1 is out of range 0..64");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("h4.txt", "flame-features 1 slots=65 dense=0\n"), &s),
                      FLAME_ERR_FORMAT, "header slots=65 is out of range 0..64");
    assert_status_msg(
        flame_feature_source_create_file(tu_write_text("h5.txt", "flame-features 1 slots=1 dense=4294967297\n"), &s),
        FLAME_ERR_FORMAT, "h5.txt:1: header dense=4294967297 is out of range 0..65536");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("h6.txt", "flame-features 1 slots=1 dense=65537\n"), &s),
                      FLAME_ERR_FORMAT, "header dense=65537 is out of range 0..65536");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("h7.txt", "flame-features 4294967297 slots=1 dense=0\n"), &s),
                      FLAME_ERR_FORMAT, "h7.txt:1: header version 4294967297 is out of range 1..1");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("h8.txt", "flame-features 2 slots=1 dense=0\n"), &s),
                      FLAME_ERR_FORMAT, "header version 2 is out of range 1..1");
    /* not integers, or something after the header */
    assert_status_msg(flame_feature_source_create_file(tu_write_text("h9.txt", "flame-features 1 slots=2x dense=0\n"), &s),
                      FLAME_ERR_FORMAT, "'slots=2x' is not an integer");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("ha.txt", "flame-features 1 slots= 2 dense=0\n"), &s),
                      FLAME_ERR_FORMAT, "ha.txt:1: expected the header 'flame-features 1 slots=S dense=D' (S 0..64, "
                                        "D 0..65536); 'slots=' is not an integer");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("hb.txt", "flame-features 1 slots=1 dense=0 x\n"), &s),
                      FLAME_ERR_FORMAT, "' x' after it");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("hc.txt", "flame-features 1 slots=1 dense=0 \n"), &s),
                      FLAME_ERR_FORMAT, "hc.txt:1: expected the header 'flame-features 1 slots=S dense=D' (S 0..64, D 0..65536); ' ' after it");
    assert_status_msg(flame_feature_source_create_file(tu_write_text("hd.txt", "flame-features1 slots=1 dense=0\n"), &s),
                      FLAME_ERR_FORMAT, "hd.txt:1: expected the header");
    assert_null(s);
    /* the limits themselves and extra spaces between the words are fine */
    assert_int_equal(flame_feature_source_create_file(tu_write_text("he.txt", "flame-features  1\tslots=64   dense=65536\n"), &s),
                     FLAME_OK);
    assert_int_equal(flame_feature_source_num_slots(s), 64);
    flame_feature_source_destroy(s);
    assert_int_equal(flame_feature_source_create_file(tu_write_text("hf.txt", "# c\nflame-features 1 slots=0 dense=0\n7\n"), &s),
                     FLAME_OK);
    assert_int_equal(flame_feature_source_num_slots(s), 0);
    flame_feature_source_destroy(s);
}

/* ---- dense values: subnormals are values, overflow and non-finite are not */

static void test_dense_values(void **state)
{
    (void)state;
    flame_feature_source *s;
    assert_int_equal(flame_feature_source_create_file(
                         tu_write_text("d1.txt", "flame-features 1 slots=0 dense=5\n17\t1e-40,-1e-40,0x1p-149,1.17549435e-38,1e-50\n"),
                         &s),
                     FLAME_OK);
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(0, &b), FLAME_OK);
    int64_t id = 17;
    assert_int_equal(flame_feature_source_fetch(s, &id, 1, b), FLAME_OK);
    const float *d;
    size_t n;
    assert_int_equal(flame_feature_batch_get_dense(b, 0, &d, &n), FLAME_OK);
    assert_int_equal(n, 5);
    const float want[5] = {1e-40f, -1e-40f, 0x1p-149f, FLT_MIN, 0.0f};
    for (int i = 0; i < 5; i++) assert_memory_equal(&d[i], &want[i], sizeof(float)); /* bit for bit */
    assert_true(d[0] != 0 && d[0] < FLT_MIN); /* a subnormal, not flushed */
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(s);
    /* refused, the message naming the value */
    static const struct {
        const char *value, *want;
    } bad[] = {{"1e999", "'1e999' is out of float's range"},
               {"-3.5e38", "'-3.5e38' is out of float's range"},
               {"inf", "'inf' is not a finite float"},
               {"nan", "'nan' is not a finite float"},
               {"0.5,abc", "'abc' is not a float"},
               {"0.5,", "'' is an empty entry"},
               {"0.5,0.25", "'0.25' is one value too many"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[96];
        snprintf(text, sizeof text, "flame-features 1 slots=0 dense=1\n1\t%s\n", bad[i].value);
        assert_status_msg(flame_feature_source_create_file(tu_write_text("d2.txt", text), &s), FLAME_ERR_FORMAT,
                          "d2.txt:2: dense: expected 1 comma-separated finite floats");
        assert_status_msg(flame_feature_source_create_file(tu_write_text("d2.txt", text), &s), FLAME_ERR_FORMAT, bad[i].want);
        assert_null(s);
    }
    assert_status_msg(flame_feature_source_create_file(tu_write_text("d3.txt", "flame-features 1 slots=0 dense=3\n1\t1,2\n"), &s),
                      FLAME_ERR_FORMAT, "d3.txt:2: dense: expected 3 comma-separated finite floats, got 2 in '1,2'");
}

/* ---- ids per line: at most 65536, all slots together */

static char *id_line_file(const char *name, size_t n0, size_t n1)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    FILE *f = fopen(path, "w");
    fputs("flame-features 1 slots=2 dense=0\n5\t", f);
    for (size_t i = 0; i < n0; i++) fprintf(f, i ? ",%zu" : "%zu", i);
    fputc('\t', f);
    for (size_t i = 0; i < n1; i++) fprintf(f, i ? ",%zu" : "%zu", i);
    fputc('\n', f);
    fclose(f);
    return path;
}

static void test_ids_per_line(void **state)
{
    (void)state;
    flame_feature_source *s;
    assert_int_equal(flame_feature_source_create_file(id_line_file("i1.txt", 65536, 0), &s), FLAME_OK);
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
    int64_t id = 5;
    assert_int_equal(flame_feature_source_fetch(s, &id, 1, b), FLAME_OK);
    int found;
    const int64_t *ids;
    size_t count;
    assert_int_equal(flame_feature_batch_get_slot(b, 0, 0, &found, &ids, &count), FLAME_OK);
    assert_int_equal(count, 65536);
    assert_int_equal(ids[65535], 65535);
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(s);
    assert_status_msg(flame_feature_source_create_file(id_line_file("i2.txt", 65537, 0), &s), FLAME_ERR_FORMAT,
                      "i2.txt:2: slot 0: more than 65536 ids on one line");
    assert_null(s);
    assert_status_msg(flame_feature_source_create_file(id_line_file("i3.txt", 40000, 30000), &s), FLAME_ERR_FORMAT,
                      "i3.txt:2: slot 1: more than 65536 ids on one line");
    assert_null(s);
}

/* ---- a callback status that is not a flame_status */

static flame_status fetch_returning(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)ids;
    for (size_t i = 0; i < n; i++) flame_feature_batch_set_missing(out, i);
    return (flame_status) * (int *)user;
}

typedef struct job {
    flame_feature_batch *out;
    size_t n;
    int status;
} job;

static void *complete_later(void *p)
{
    job *j = p;
    for (size_t i = 0; i < j->n; i++) flame_feature_batch_set_missing(j->out, i);
    flame_feature_batch_complete(j->out, (flame_status)j->status);
    free(j);
    return NULL;
}

static void fetch_async_returning(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)ids;
    job *j = malloc(sizeof *j);
    j->out = out, j->n = n, j->status = *(int *)user;
    pthread_t t;
    pthread_create(&t, NULL, complete_later, j);
    pthread_detach(t);
}

static void test_callback_status(void **state)
{
    (void)state;
    for (int async = 0; async < 2; async++) {
        int ret = 0;
        flame_feature_source *s;
        assert_int_equal(flame_feature_source_create_callback(1, async ? NULL : fetch_returning,
                                                              async ? fetch_async_returning : NULL, &ret, &s),
                         FLAME_OK);
        flame_feature_batch *b;
        assert_int_equal(flame_feature_batch_create(1, &b), FLAME_OK);
        int64_t ids[2] = {41, 42};
        assert_int_equal(flame_feature_source_fetch(s, ids, 2, b), FLAME_OK);
        /* not flame_status values: FLAME_ERR_UNAVAILABLE, naming the raw value */
        static const struct {
            int raw;
            const char *want;
        } cases[] = {{1234, "feature callback returned 1234, which is not a flame_status"},
                     {-5, "feature callback returned -5, which is not a flame_status"},
                     {12, "feature callback returned 12, which is not a flame_status"},
                     {-1, "feature callback returned -1, which is not a flame_status"}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            ret = cases[i].raw;
            assert_status_msg(flame_feature_source_fetch(s, ids, 2, b), FLAME_ERR_UNAVAILABLE, cases[i].want);
            assert_non_null(strstr(flame_last_error(), "for a batch of 2 ids beginning with id 41: treated as a failure"));
        }
        /* real error statuses pass through unchanged */
        ret = FLAME_ERR_FORMAT;
        assert_status_msg(flame_feature_source_fetch(s, ids, 2, b), FLAME_ERR_FORMAT,
                          "feature callback failed with FLAME_ERR_FORMAT");
        ret = FLAME_ERR_CANCELLED;
        assert_status_msg(flame_feature_source_fetch(s, ids, 2, b), FLAME_ERR_CANCELLED,
                          "feature callback failed with FLAME_ERR_CANCELLED");
        /* and through the item cache: a failure, nothing cached */
        flame_item_cache *c;
        flame_item_cache_params p = {.struct_size = sizeof p, .manual_refresh = 1};
        assert_int_equal(flame_item_cache_create(s, &p, &c), FLAME_OK);
        ret = 1234;
        assert_status_msg(flame_item_cache_get(c, ids, 2, b), FLAME_ERR_UNAVAILABLE, "returned 1234");
        flame_item_cache_stats st = {.struct_size = sizeof st};
        assert_int_equal(flame_item_cache_get_stats(c, &st), FLAME_OK);
        assert_int_equal(st.entries, 0);
        flame_item_cache_destroy(c);
        flame_feature_batch_destroy(b);
        flame_feature_source_destroy(s);
    }
}

/* ---- hostile values: NaN and infinite dense values and negative ids, refused as the
 * feature file refuses them */

/* The record written for id: slot 0 {id}, slot 1 {id + 1, id + 2}, dense {0.5, -0.0, FLT_MAX}
 * (finite values at the edges are values). */
static flame_status write_good(flame_feature_batch *out, size_t i, int64_t id)
{
    const int64_t offs[3] = {0, 1, 3}, ids[3] = {id, id + 1, id + 2};
    const float dense[3] = {0.5f, -0.0f, FLT_MAX};
    return flame_feature_batch_set(out, i, offs, ids, 3, dense, 3);
}

static void expect_good(const flame_feature_batch *b, size_t i, int64_t id)
{
    int32_t found;
    const int64_t *ids;
    size_t n;
    assert_int_equal(flame_feature_batch_get_slot(b, i, 0, &found, &ids, &n), FLAME_OK);
    assert_true(found && n == 1 && ids[0] == id);
    assert_int_equal(flame_feature_batch_get_slot(b, i, 1, &found, &ids, &n), FLAME_OK);
    assert_true(found && n == 2 && ids[0] == id + 1 && ids[1] == id + 2);
    const float *d;
    assert_int_equal(flame_feature_batch_get_dense(b, i, &d, &n), FLAME_OK);
    assert_true(n == 3 && d[0] == 0.5f && d[1] == 0.0f && signbit(d[1]) && d[2] == FLT_MAX);
}

/* Case k's record: 0..2 dense[1] NaN, +inf, -inf; 3 slot 1 holding -3; 4 slot 0 holding
 * INT64_MIN. want[k] is the refusal's message after "record <index>: ". */
enum { HOSTILE_CASES = 5 };
static const char *const hostile_want[HOSTILE_CASES] = {
    "dense[1] = nan is not a finite float", "dense[1] = inf is not a finite float",
    "dense[1] = -inf is not a finite float", "slot 1: id -3 (ids[2]) is negative",
    "slot 0: id -9223372036854775808 (ids[0]) is negative"};

static flame_status write_hostile(flame_feature_batch *out, size_t i, int k)
{
    const int64_t offs[3] = {0, 1, 3};
    int64_t ids[3] = {7, 8, 9};
    float dense[2] = {0.5f, 0.25f};
    if (k == 0) dense[1] = NAN;
    if (k == 1) dense[1] = INFINITY;
    if (k == 2) dense[1] = -INFINITY;
    if (k == 3) ids[2] = -3;
    if (k == 4) ids[0] = INT64_MIN;
    return flame_feature_batch_set(out, i, offs, ids, 3, dense, 2);
}

static flame_status fetch_good(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    for (size_t i = 0; i < n; i++) {
        flame_status st = write_good(out, i, ids[i]);
        if (st) return st;
    }
    return FLAME_OK;
}

/* flame_feature_batch_set refuses each with FLAME_ERR_INVALID_ARG naming the record, the
 * slot or index and the value, and leaves the record as it was. */
static void test_batch_set_refuses_hostile_values(void **state)
{
    (void)state;
    flame_feature_source *s;
    flame_feature_batch *b;
    assert_int_equal(flame_feature_source_create_callback(2, fetch_good, NULL, NULL, &s), FLAME_OK);
    assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
    const int64_t ids[2] = {10, 20};
    assert_int_equal(flame_feature_source_fetch(s, ids, 2, b), FLAME_OK);
    expect_good(b, 1, 20);
    for (int k = 0; k < HOSTILE_CASES; k++) {
        char want[128];
        snprintf(want, sizeof want, "record 1: %s", hostile_want[k]);
        assert_status_msg(write_hostile(b, 1, k), FLAME_ERR_INVALID_ARG, want);
        expect_good(b, 1, 20); /* the record as it was */
        expect_good(b, 0, 10);
    }
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(s);
}

/* A callback whose record of id 7 is hostile case hostile_case: it passes on the status
 * flame_feature_batch_set gave it (sync), or completes with it (async). */
static int hostile_case;

static flame_status fetch_hostile_7(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    for (size_t i = 0; i < n; i++) {
        flame_status st = ids[i] == 7 ? write_hostile(out, i, hostile_case) : write_good(out, i, ids[i]);
        if (st) return st;
    }
    return FLAME_OK;
}

/* The same, dropping the status: the record of id 7 is left unwritten and the call says OK. */
static flame_status fetch_hostile_7_ignoring(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    for (size_t i = 0; i < n; i++) (void)(ids[i] == 7 ? write_hostile(out, i, hostile_case) : write_good(out, i, ids[i]));
    return FLAME_OK;
}

typedef struct hostile_job {
    int64_t ids[8];
    size_t n;
    flame_feature_batch *out;
} hostile_job;

static void *complete_hostile_later(void *p)
{
    hostile_job *j = p;
    flame_feature_batch_complete(j->out, fetch_hostile_7(NULL, j->ids, j->n, j->out));
    free(j);
    return NULL;
}

static void fetch_hostile_7_async(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    hostile_job *j = malloc(sizeof *j);
    memcpy(j->ids, ids, n * sizeof *ids);
    j->n = n, j->out = out;
    pthread_t t;
    pthread_create(&t, NULL, complete_hostile_later, j);
    pthread_detach(t);
}

/* A callback's hostile record fails the fetch (the batch left empty), the message quoting
 * flame_feature_batch_set's refusal; through the item cache only that id fails and the
 * others are cached. */
static void test_callback_hostile_records(void **state)
{
    (void)state;
    flame_feature_fetch_fn sync_fns[2] = {fetch_hostile_7, fetch_hostile_7_ignoring};
    for (int form = 0; form < 3; form++) { /* sync, sync dropping the status, async */
        flame_feature_source *s;
        assert_int_equal(flame_feature_source_create_callback(2, form < 2 ? sync_fns[form] : NULL,
                                                              form == 2 ? fetch_hostile_7_async : NULL, NULL, &s),
                         FLAME_OK);
        flame_feature_batch *b;
        assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
        const int64_t ids[3] = {5, 7, 6};
        for (hostile_case = 0; hostile_case < HOSTILE_CASES; hostile_case++) {
            char want[128];
            snprintf(want, sizeof want, "record 1: %s", hostile_want[hostile_case]);
            assert_status_msg(flame_feature_source_fetch(s, ids, 3, b), FLAME_ERR_INVALID_ARG, want);
            /* the batch named by its size and first id, the refused record by its id */
            assert_non_null(strstr(flame_last_error(),
                                   form == 1 ? "left record 1 (id 7) unwritten"
                                             : "feature callback failed with FLAME_ERR_INVALID_ARG for a batch of 3 "
                                               "ids beginning with id 5; flame_feature_batch_set refused the record "
                                               "of id 7: record 1: "));
            assert_int_equal(flame_feature_batch_size(b), 0);
            flame_item_cache *c;
            flame_item_cache_params p = {.struct_size = sizeof p, .manual_refresh = 1};
            assert_int_equal(flame_item_cache_create(s, &p, &c), FLAME_OK);
            assert_status_msg(flame_item_cache_get(c, ids, 3, b), FLAME_ERR_INVALID_ARG, hostile_want[hostile_case]);
            /* fetched again alone: the message names that id */
            assert_non_null(strstr(flame_last_error(), form == 1 ? "left record 0 (id 7) unwritten"
                                                                 : "failed with FLAME_ERR_INVALID_ARG for id 7; "
                                                                   "flame_feature_batch_set refused the record of "
                                                                   "id 7: record 0: "));
            flame_item_cache_stats st = {.struct_size = sizeof st};
            assert_int_equal(flame_item_cache_get_stats(c, &st), FLAME_OK);
            assert_int_equal(st.entries, 2); /* 5 and 6 */
            const int64_t good[2] = {6, 5};
            assert_int_equal(flame_item_cache_get(c, good, 2, b), FLAME_OK);
            expect_good(b, 0, 6);
            expect_good(b, 1, 5);
            flame_item_cache_destroy(c);
        }
        flame_feature_batch_destroy(b);
        flame_feature_source_destroy(s);
    }
}

/* A record for a negative id is refused from a source as the feature file refuses such a line
 * (FLAME_ERR_FORMAT): ids are table rows. The id may still be asked for: missing is an answer. */
static flame_status fetch_any_id(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    for (size_t i = 0; i < n; i++) {
        flame_status st = ids[i] < 0 && user ? flame_feature_batch_set_missing(out, i) : write_good(out, i, 1);
        if (st) return st;
    }
    return FLAME_OK;
}

static void test_record_for_negative_id(void **state)
{
    (void)state;
    for (int says_missing = 0; says_missing < 2; says_missing++) {
        flame_feature_source *s;
        assert_int_equal(flame_feature_source_create_callback(2, fetch_any_id, NULL, says_missing ? &(int){1} : NULL, &s),
                         FLAME_OK);
        flame_feature_batch *b;
        assert_int_equal(flame_feature_batch_create(2, &b), FLAME_OK);
        const int64_t ids[2] = {5, -3};
        flame_item_cache *c;
        flame_item_cache_params p = {.struct_size = sizeof p, .manual_refresh = 1};
        assert_int_equal(flame_item_cache_create(s, &p, &c), FLAME_OK);
        if (says_missing) {
            assert_int_equal(flame_feature_source_fetch(s, ids, 2, b), FLAME_OK);
            assert_int_equal(flame_item_cache_get(c, ids, 2, b), FLAME_OK);
            int32_t found = 1;
            const int64_t *v;
            size_t n;
            assert_int_equal(flame_feature_batch_get_slot(b, 1, 0, &found, &v, &n), FLAME_OK);
            assert_int_equal(found, 0);
        } else {
            assert_status_msg(flame_feature_source_fetch(s, ids, 2, b), FLAME_ERR_FORMAT,
                              "a record for item id -3 (record 1), which is negative");
            assert_int_equal(flame_feature_batch_size(b), 0);
            assert_status_msg(flame_item_cache_get(c, ids, 2, b), FLAME_ERR_FORMAT, "item id -3");
            flame_item_cache_stats st = {.struct_size = sizeof st};
            assert_int_equal(flame_item_cache_get_stats(c, &st), FLAME_OK);
            assert_int_equal(st.entries, 1); /* 5 only */
        }
        flame_item_cache_destroy(c);
        flame_feature_batch_destroy(b);
        flame_feature_source_destroy(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_integers),
        cmocka_unit_test(test_dense_values),
        cmocka_unit_test(test_ids_per_line),
        cmocka_unit_test(test_callback_status),
        cmocka_unit_test(test_batch_set_refuses_hostile_values),
        cmocka_unit_test(test_callback_hostile_records),
        cmocka_unit_test(test_record_for_negative_id),
    };
    return cmocka_run_group_tests_name("feature_inputs", tests, NULL, NULL);
}
