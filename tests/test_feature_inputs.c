/* Feature inputs at the edges: the feature file's header integers (full-range parsing, no
 * wrap-around), subnormal dense values (read back exactly), the per-line id limit, and a
 * callback returning a value that is not a flame_status (sync and async forms). */
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
            assert_non_null(strstr(flame_last_error(), "first 41"));
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_integers),
        cmocka_unit_test(test_dense_values),
        cmocka_unit_test(test_ids_per_line),
        cmocka_unit_test(test_callback_status),
    };
    return cmocka_run_group_tests_name("feature_inputs", tests, NULL, NULL);
}
