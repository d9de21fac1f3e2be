/* The host-index checks of the GPU embedding bag's staging (fl_tbe_check_pack): batches of
 * several 16384-id chunks a table over 1..4 threads. A good batch is packed byte for byte at the
 * given offsets; a bad id or weight anywhere (first chunk, a later one, the last element, two bad
 * values in different chunks or tables) is reported as the first one in table, offset, id order,
 * with its bag, whatever the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "kernels/tbe_pack.h"

#define T 3
#define BATCH 2500

typedef struct fixture {
    fl_tbe_table tab[T];
    fl_tbe_lookup lk[T];
    int64_t *ids[T], *off[T];
    float *w[T];
    size_t at[3 * T], total;
    unsigned char *dst;
} fixture;

/* Table t: bags of 0..2 * (t + 10) random ids (about 25,000 to 30,000 ids: two chunks), weights
 * on table 1 only. */
static void make(fixture *f)
{
    memset(f, 0, sizeof *f);
    for (int t = 0; t < T; t++) {
        f->tab[t].rows = 1000 + 500 * t;
        f->off[t] = malloc((BATCH + 1) * sizeof(int64_t));
        f->off[t][0] = 0;
        for (int64_t b = 0; b < BATCH; b++) f->off[t][b + 1] = f->off[t][b] + tu_below(2 * (t + 10) + 1);
        const int64_t n = f->off[t][BATCH];
        f->ids[t] = malloc((size_t)n * sizeof(int64_t));
        for (int64_t i = 0; i < n; i++) f->ids[t][i] = tu_below(f->tab[t].rows);
        if (t == 1) {
            f->w[t] = malloc((size_t)n * sizeof(float));
            for (int64_t i = 0; i < n; i++) f->w[t][i] = tu_uniform();
        }
        f->lk[t] = (fl_tbe_lookup){f->ids[t], f->off[t], n, f->w[t]};
        const size_t bytes[3] = {(size_t)n * 8, (BATCH + 1) * 8, f->w[t] ? (size_t)n * 4 : 0};
        for (int k = 0; k < 3; k++) {
            f->at[3 * t + k] = f->total;
            f->total += (bytes[k] + 15) & ~(size_t)15;
        }
    }
    f->dst = malloc(f->total);
}

static void release(fixture *f)
{
    for (int t = 0; t < T; t++) {
        free(f->ids[t]);
        free(f->off[t]);
        free(f->w[t]);
    }
    free(f->dst);
}

static void test_pack_copies_every_array(void **state)
{
    (void)state;
    fixture f;
    make(&f);
    for (int t = 0; t < T; t++) assert_true(f.lk[t].num_ids > 16384); /* more than one chunk each */
    for (int threads = 1; threads <= 4; threads++) {
        memset(f.dst, 0xab, f.total);
        if (fl_tbe_check_pack(f.tab, f.lk, T, BATCH, f.dst, f.at, threads))
            fail_msg("%d threads: %s", threads, flame_last_error());
        for (int t = 0; t < T; t++) {
            const size_t n = (size_t)f.lk[t].num_ids;
            assert_memory_equal(f.dst + f.at[3 * t], f.ids[t], n * 8);
            assert_memory_equal(f.dst + f.at[3 * t + 1], f.off[t], (BATCH + 1) * 8);
            if (f.w[t]) assert_memory_equal(f.dst + f.at[3 * t + 2], f.w[t], n * 4);
        }
        /* validation alone (the CPU handle's path) */
        assert_int_equal(fl_tbe_check_pack(f.tab, f.lk, T, BATCH, NULL, NULL, threads), FLAME_OK);
    }
    release(&f);
}

/* The bag holding index i of table t. */
static int64_t bag_of(const fixture *f, int t, int64_t i)
{
    int64_t b = 0;
    while (f->off[t][b + 1] <= i) b++;
    return b;
}

static void expect_first(fixture *f, int t, int64_t i, const char *what, const char *value)
{
    char needle[160];
    snprintf(needle, sizeof needle, "table %d bag %lld: %s[%lld] = %s", t, (long long)bag_of(f, t, i), what,
             (long long)i, value);
    for (int threads = 1; threads <= 4; threads++) {
        assert_status_msg(fl_tbe_check_pack(f->tab, f->lk, T, BATCH, f->dst, f->at, threads), FLAME_ERR_INVALID_ARG,
                          needle);
        assert_status_msg(fl_tbe_check_pack(f->tab, f->lk, T, BATCH, NULL, NULL, threads), FLAME_ERR_INVALID_ARG,
                          needle);
    }
}

static void test_pack_reports_the_first_bad_value(void **state)
{
    (void)state;
    fixture f;
    make(&f);
    const int64_t n1 = f.lk[1].num_ids, late = n1 - 1, mid = 16384 + 77; /* the last id; one in chunk 2 */
    f.ids[1][late] = f.tab[1].rows;
    expect_first(&f, 1, late, "ids", "1500 is outside 0..1499");
    f.ids[1][mid] = -3; /* an earlier one, in another chunk, wins */
    expect_first(&f, 1, mid, "ids", "-3 is outside 0..1499");
    f.w[1][5] = NAN; /* earlier still, in the first chunk */
    expect_first(&f, 1, 5, "weights", "nan is not finite");
    f.ids[2][0] = 1 << 30; /* a later table's bad id does not */
    expect_first(&f, 1, 5, "weights", "nan is not finite");
    f.w[1][5] = 0.5f, f.ids[1][mid] = 0, f.ids[1][late] = 0;
    expect_first(&f, 2, 0, "ids", "1073741824 is outside 0..1999");
    /* bad offsets of table 0 come before any value of tables 1 and 2 */
    f.off[0][7] = f.off[0][6] - 1;
    for (int threads = 1; threads <= 4; threads++)
        assert_status_msg(fl_tbe_check_pack(f.tab, f.lk, T, BATCH, f.dst, f.at, threads), FLAME_ERR_INVALID_ARG,
                          "table 0 bag 6: offsets[7]");
    /* an id and its weight at one index: the id is named */
    f.off[0][7] = f.off[0][6];
    f.ids[2][0] = 0;
    f.ids[1][40000 < n1 ? 40000 : n1 - 2] = 99999;
    f.w[1][40000 < n1 ? 40000 : n1 - 2] = INFINITY;
    const int64_t both = 40000 < n1 ? 40000 : n1 - 2;
    expect_first(&f, 1, both, "ids", "99999 is outside 0..1499");
    release(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_copies_every_array),
        cmocka_unit_test(test_pack_reports_the_first_bad_value),
    };
    tu_seed();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
