/* The public kernels (flame/kernels.h) on the CPU: the table-batched embedding bag (F32, F16,
 * BF16 and INT8 tables, copied or borrowed, sum and mean pooling, per-id weights, concat and sum
 * combine, one id per bag or offsets with empty bags, strided F32, F16 and BF16 outputs, the
 * half outputs the correctly rounded float32 results, several threads, in-place row updates)
 * and SUMI attention (SUMI, causal and no mask over ragged batches with empty sequences, fused
 * and separate Q/K/V with padded strides, several threads), each against a float64 reference
 * on fresh random inputs with NaN-poisoned outputs; every rejection with its message and
 * nothing written; the GPU entry points without a GPU. */
#include <pthread.h>

#include "testutil.h"
#include "tu_half.h"
#include "tu_kernels.h"
#include "core/device.h"

/* ---- embedding bag */

static flame_embedding_bag *make_bag_of(const tuk_table *t, int nt, bool sum, bool borrow, flame_status *st)
{
    flame_embedding_table d[8];
    for (int f = 0; f < nt; f++) d[f] = tuk_desc(&t[f]);
    flame_embedding_bag_params p = {sizeof p, FLAME_DEVICE_CPU, sum ? FLAME_COMBINE_SUM : FLAME_COMBINE_CONCAT, d,
                                    (size_t)nt, borrow, 0};
    flame_embedding_bag *b = NULL;
    *st = flame_embedding_bag_create(&p, &b);
    return b;
}

static flame_embedding_bag *make_bag(const tuk_table *t, int nt, bool sum, flame_status *st)
{
    return make_bag_of(t, nt, sum, false, st);
}

/* A 16-bit output poisoned with a pattern that is a NaN in fp16 and in bf16. */
#define HALF_POISON 0xffffu
static uint16_t *half_out(size_t n)
{
    uint16_t *o = malloc((n + 1) * sizeof *o);
    for (size_t i = 0; i < n + 1; i++) o[i] = HALF_POISON;
    return o;
}

/* The F16/BF16 outputs of a forward whose F32 output was f32 [batch, ld]: each element the
 * correctly rounded F32 element (one rounding of the float32 result, to nearest even), never a
 * NaN, the gap past width untouched, and within the format's precision of the float64 values. */
static void check_half_outputs(flame_embedding_bag *bag, flame_embedding_bag_batch q, const float *f32,
                               const double *want, int64_t width)
{
    const int64_t batch = q.batch, ld = q.ld_out ? q.ld_out : width;
    float *got = malloc((size_t)(batch * width + 1) * sizeof(float));
    for (int bf16 = 0; bf16 < 2; bf16++) {
        uint16_t *out = half_out((size_t)(batch * ld));
        q.out = out;
        q.out_dtype = bf16 ? FLAME_DTYPE_BF16 : FLAME_DTYPE_F16;
        if (flame_embedding_bag_forward(bag, &q)) fail_msg("forward, %s out: %s", bf16 ? "BF16" : "F16", flame_last_error());
        for (int64_t b = 0; b < batch; b++) {
            for (int64_t j = 0; j < width; j++) {
                const uint16_t h = out[b * ld + j], r = tuh_nearest(bf16, f32[b * ld + j]);
                if (tuh_is_nan(bf16, h) || h != r)
                    fail_msg("%s out [%lld, %lld] = %04x, float32 %.9g rounds to %04x", bf16 ? "BF16" : "F16",
                             (long long)b, (long long)j, h, (double)f32[b * ld + j], r);
                got[b * width + j] = (float)tuh_value(bf16, h);
            }
            for (int64_t j = width; j < ld; j++) assert_int_equal(out[b * ld + j], HALF_POISON);
        }
        if (batch) assert_rel_err_below(got, want, (size_t)(batch * width), bf16 ? 8e-3 : 1e-3);
        free(out);
    }
    free(got);
}

static void run_tbe_case(void)
{
    const int nt = 1 + (int)tu_below(5);
    const bool sum = tu_below(3) == 0, borrow = tu_below(2);
    const int32_t sum_dim = 1 + (int32_t)tu_below(48);
    const int64_t batch = tu_below(80);
    tuk_table t[8];
    tuk_lookup l[8];
    int32_t width = 0;
    bool any_weights = false;
    for (int f = 0; f < nt; f++) {
        const flame_dtype dt = (flame_dtype)tu_below(4);
        const int32_t dim = sum ? sum_dim : 1 + (int32_t)tu_below(48);
        tuk_table_fill(&t[f], dt, 1 + tu_below(300), dim, (flame_pooling)tu_below(2));
        const bool weighted = tu_below(3) == 0;
        any_weights |= weighted;
        tuk_lookup_fill(&l[f], &t[f], batch, tu_below(4) == 0, weighted, 9);
        width = sum ? dim : width + dim;
    }
    flame_status st;
    flame_embedding_bag *bag = make_bag_of(t, nt, sum, borrow, &st);
    if (st) fail_msg("create (borrow %d): %s", borrow, flame_last_error());
    assert_int_equal(flame_embedding_bag_width(bag), width);
    const int64_t ld = width + tu_below(3);
    float *out = malloc((size_t)(batch * ld + 1) * sizeof(float));
    tu_poison(out, (size_t)(batch * ld + 1));
    flame_embedding_bag_input in[8];
    for (int f = 0; f < nt; f++) in[f] = tuk_input(&l[f]);
    flame_embedding_bag_batch q = {sizeof q, batch, in, (size_t)nt, out, ld, FLAME_DTYPE_F32, NULL,
                                   1 + (int32_t)tu_below(4), 0};
    st = flame_embedding_bag_forward(bag, &q);
    if (st) fail_msg("forward: %s", flame_last_error());
    double *want = malloc((size_t)(batch * width + 1) * sizeof(double));
    tuk_tbe_reference(t, l, nt, sum, batch, width, want);
    float *got = malloc((size_t)(batch * width + 1) * sizeof(float));
    for (int64_t b = 0; b < batch; b++) {
        memcpy(got + b * width, out + b * ld, (size_t)width * sizeof(float));
        for (int64_t j = width; j < ld; j++) assert_true(isnan(out[b * ld + j])); /* the gap is not written */
    }
    if (batch) assert_rel_err_below(got, want, (size_t)(batch * width), 2e-6);
    (void)any_weights;
    check_half_outputs(bag, q, out, want, width);
    /* F16 and BF16 tables are pooled straight from their rows, widened exactly: the bits of the
     * same tables converted to F32 (the pooling is the float32 row's) */
    tuk_table wide[8];
    for (int f = 0; f < nt; f++) {
        wide[f] = t[f];
        if (t[f].dtype != FLAME_DTYPE_F16 && t[f].dtype != FLAME_DTYPE_BF16) continue;
        wide[f].dtype = FLAME_DTYPE_F32;
        wide[f].data = malloc((size_t)(t[f].rows * t[f].dim) * sizeof(float));
        for (int64_t i = 0; i < t[f].rows * t[f].dim; i++) ((float *)wide[f].data)[i] = (float)t[f].value[i];
    }
    flame_embedding_bag *wbag = make_bag(wide, nt, sum, &st);
    if (st) fail_msg("create: %s", flame_last_error());
    float *wout = malloc((size_t)(batch * ld + 1) * sizeof(float));
    tu_poison(wout, (size_t)(batch * ld + 1));
    q.out = wout;
    st = flame_embedding_bag_forward(wbag, &q);
    if (st) fail_msg("forward: %s", flame_last_error());
    for (int64_t b = 0; b < batch; b++)
        assert_memory_equal(wout + b * ld, out + b * ld, (size_t)width * sizeof(float));
    flame_embedding_bag_destroy(wbag);
    free(wout);
    for (int f = 0; f < nt; f++)
        if (wide[f].data != t[f].data) free(wide[f].data);
    free(got);
    free(want);
    free(out);
    flame_embedding_bag_destroy(bag);
    for (int f = 0; f < nt; f++) {
        tuk_table_free(&t[f]);
        tuk_lookup_free(&l[f]);
    }
}

static void test_tbe_against_reference(void **state)
{
    for (int rep = 0; rep < 200; rep++) run_tbe_case();
}

/* Batches of hundreds of bags on 1..4 threads, rows hundreds of columns wide: the F16/BF16
 * outputs are pooled a chunk of bags at a time into each thread's float32 rows and rounded from
 * there, so every chunk, part and row boundary must give the correctly rounded bits of the F32
 * output, which is the same on any number of threads. */
static void test_tbe_half_outputs_many_bags_and_threads(void **state)
{
    for (int rep = 0; rep < 6; rep++) {
        const int nt = 2 + (int)tu_below(3);
        const int64_t batch = 300 + tu_below(900);
        tuk_table t[4];
        tuk_lookup l[4];
        int32_t width = 0;
        for (int f = 0; f < nt; f++) {
            const int32_t dim = 40 + (int32_t)tu_below(200);
            tuk_table_fill(&t[f], (flame_dtype)tu_below(4), 50 + tu_below(500), dim, (flame_pooling)tu_below(2));
            tuk_lookup_fill(&l[f], &t[f], batch, tu_below(3) == 0, rep % 2, 6);
            width += dim;
        }
        flame_status st;
        flame_embedding_bag *bag = make_bag_of(t, nt, false, rep % 3 == 0, &st);
        if (st) fail_msg("create: %s", flame_last_error());
        flame_embedding_bag_input in[4];
        for (int f = 0; f < nt; f++) in[f] = tuk_input(&l[f]);
        const int64_t ld = width + 1;
        float *out = malloc((size_t)(batch * ld) * sizeof(float)), *out3 = malloc((size_t)(batch * ld) * sizeof(float));
        tu_poison(out, (size_t)(batch * ld));
        tu_poison(out3, (size_t)(batch * ld));
        flame_embedding_bag_batch q = {sizeof q, batch, in, (size_t)nt, out, ld, FLAME_DTYPE_F32, NULL, 1, 0};
        if (flame_embedding_bag_forward(bag, &q)) fail_msg("forward: %s", flame_last_error());
        q.out = out3;
        q.threads = 2 + (int32_t)tu_below(3);
        if (flame_embedding_bag_forward(bag, &q)) fail_msg("forward, %d threads: %s", q.threads, flame_last_error());
        assert_memory_equal(out, out3, (size_t)(batch * ld) * sizeof(float)); /* the gaps' NaNs too */
        double *want = malloc((size_t)(batch * width) * sizeof(double));
        tuk_tbe_reference(t, l, nt, false, batch, width, want);
        check_half_outputs(bag, q, out, want, width);
        free(want);
        free(out);
        free(out3);
        flame_embedding_bag_destroy(bag);
        for (int f = 0; f < nt; f++) {
            tuk_table_free(&t[f]);
            tuk_lookup_free(&l[f]);
        }
    }
}

/* F16 and BF16 outputs of chosen float32 values (one-id bags of a one-column F32 table, with and
 * without weights of 1, so each output is its row's value): rounded to nearest, ties to even,
 * the bits given here. Ties either way, the values either side of a tie, the largest finite
 * values and the ties past them (to infinity), subnormals of both formats and their ties,
 * float32 subnormals (to zero of their sign). */
static void test_tbe_half_output_rounding(void **state)
{
    static const struct {
        uint32_t f32;
        uint16_t f16, bf16;
    } c[] = {
        {0x3f800000u, 0x3c00u, 0x3f80u}, /* 1 */
        {0x3f801000u, 0x3c00u, 0x3f80u}, /* 1 + 2^-11: fp16 tie, to the even 1 */
        {0x3f803000u, 0x3c02u, 0x3f80u}, /* 1 + 3 2^-11: fp16 tie, to the even 1 + 2^-9 */
        {0x3f801001u, 0x3c01u, 0x3f80u}, /* just past an fp16 tie: up */
        {0x3f800fffu, 0x3c00u, 0x3f80u}, /* just below it: down */
        {0x3f808000u, 0x3c04u, 0x3f80u}, /* 1 + 2^-8: bf16 tie, to the even 1 */
        {0x3f818000u, 0x3c0cu, 0x3f82u}, /* 1 + 3 2^-8: bf16 tie, to the even 0x3f82 */
        {0x3f818001u, 0x3c0cu, 0x3f82u},
        {0x3f808001u, 0x3c04u, 0x3f81u}, /* just past a bf16 tie: up */
        {0xbf803000u, 0xbc02u, 0xbf80u}, /* negative ties */
        {0x477fe000u, 0x7bffu, 0x4780u}, /* 65504, the largest finite fp16 */
        {0x477fefffu, 0x7bffu, 0x4780u}, /* just below 65520 */
        {0x477ff000u, 0x7c00u, 0x4780u}, /* 65520: the tie past 65504 rounds to infinity */
        {0xc77ff000u, 0xfc00u, 0xc780u},
        {0x387fc000u, 0x03ffu, 0x3880u}, /* 1023 2^-24, the largest fp16 subnormal */
        {0x387fe000u, 0x0400u, 0x3880u}, /* 1023.5 2^-24: tie, to the even smallest normal */
        {0x33800000u, 0x0001u, 0x3380u}, /* 2^-24, the smallest fp16 subnormal */
        {0x33c00000u, 0x0002u, 0x33c0u}, /* 1.5 2^-24: tie, to the even 2 2^-24 */
        {0x33000000u, 0x0000u, 0x3300u}, /* 2^-25: tie, to the even 0 */
        {0x33000001u, 0x0001u, 0x3300u}, /* just past it: the smallest subnormal */
        {0xb3000000u, 0x8000u, 0xb300u}, /* -2^-25: to -0 */
        {0x7f7fffffu, 0x7c00u, 0x7f80u}, /* the largest float32: past both formats' largest */
        {0x7f7f7fffu, 0x7c00u, 0x7f7fu}, /* just below the bf16 tie past its largest */
        {0x7f7f8000u, 0x7c00u, 0x7f80u}, /* that tie: to infinity */
        {0xff7f8000u, 0xfc00u, 0xff80u},
        {0x00018000u, 0x0000u, 0x0002u}, /* a bf16 subnormal tie: to the even 0x0002 */
        {0x00008000u, 0x0000u, 0x0000u}, /* to the even 0 */
        {0x00000001u, 0x0000u, 0x0000u}, /* the smallest float32 subnormal */
        {0x80000001u, 0x8000u, 0x8000u},
        {0x00000000u, 0x0000u, 0x0000u},
    };
    enum { N = sizeof c / sizeof *c };
    static float table[N];
    int64_t ids[N];
    float w[N];
    for (int i = 0; i < N; i++) {
        memcpy(&table[i], &c[i].f32, sizeof(float));
        ids[i] = i;
        w[i] = 1.0f;
        /* the tests' reference rounding agrees with the bits given here */
        assert_int_equal(tuh_nearest(false, table[i]), c[i].f16);
        assert_int_equal(tuh_nearest(true, table[i]), c[i].bf16);
    }
    tuk_table t = {FLAME_DTYPE_F32, FLAME_POOLING_SUM, N, 1, table, NULL, NULL};
    for (int borrow = 0; borrow < 2; borrow++) {
        flame_status st;
        flame_embedding_bag *bag = make_bag_of(&t, 1, false, borrow, &st);
        assert_int_equal(st, FLAME_OK);
        for (int weighted = 0; weighted < 2; weighted++)
            for (int bf16 = 0; bf16 < 2; bf16++) {
                flame_embedding_bag_input in = {sizeof in, ids, NULL, N, weighted ? w : NULL};
                uint16_t *out = half_out(N);
                flame_embedding_bag_batch q = {sizeof q, N, &in, 1, out, 0, bf16 ? FLAME_DTYPE_BF16 : FLAME_DTYPE_F16,
                                               NULL, 0, 0};
                assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
                for (int i = 0; i < N; i++)
                    if (out[i] != (bf16 ? c[i].bf16 : c[i].f16))
                        fail_msg("%s out of float32 %08x: %04x, not %04x (weights %d)", bf16 ? "BF16" : "F16",
                                 (unsigned)c[i].f32, out[i], bf16 ? c[i].bf16 : c[i].f16, weighted);
                assert_int_equal(out[N], HALF_POISON);
                free(out);
            }
        flame_embedding_bag_destroy(bag);
    }
}

/* An F16 or BF16 output's extent is counted in its 2-byte elements: an output that ends where
 * the (borrowed) table begins runs as F16 or BF16 and is refused as F32 (it would then reach
 * into the rows); a misaligned one names its 2-byte elements; nothing is written on refusal. */
static void test_tbe_half_output_extent_and_alignment(void **state)
{
    /* one buffer: 2 bags x 4 columns of output, then the table's 10 rows of 4 */
    uint16_t *buf = calloc(8 + 40 + 1, sizeof(uint16_t));
    tuk_table t;
    tuk_table_fill(&t, FLAME_DTYPE_F16, 10, 4, FLAME_POOLING_SUM);
    memcpy(buf + 8, t.data, 40 * sizeof(uint16_t));
    flame_embedding_table d = tuk_desc(&t);
    d.data = buf + 8;
    flame_embedding_bag_params p = {sizeof p, FLAME_DEVICE_CPU, FLAME_COMBINE_CONCAT, &d, 1, 1, 0};
    flame_embedding_bag *bag;
    assert_int_equal(flame_embedding_bag_create(&p, &bag), FLAME_OK);
    int64_t ids[2] = {3, 9};
    flame_embedding_bag_input in = {sizeof in, ids, NULL, 2, NULL};
    flame_embedding_bag_batch q = {sizeof q, 2, &in, 1, buf, 0, FLAME_DTYPE_F16, NULL, 0, 0};
    uint16_t keep[49];
    for (int dt = FLAME_DTYPE_F16; dt <= FLAME_DTYPE_BF16; dt++) {
        q.out_dtype = (flame_dtype)dt;
        q.out = buf;
        for (int i = 0; i < 8; i++) buf[i] = HALF_POISON;
        assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
        for (int r = 0; r < 2; r++)
            for (int j = 0; j < 4; j++)
                assert_int_equal(buf[4 * r + j], tuh_nearest(dt == FLAME_DTYPE_BF16, t.value[ids[r] * 4 + j]));
        q.out = (char *)buf + 1;
        memcpy(keep, buf, sizeof keep);
        assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG,
                          "out is not aligned to its 2-byte elements");
        assert_memory_equal(keep, buf, sizeof keep);
        q.out = buf + 2; /* two columns later: the second row's last column is the table's first */
        assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "out overlaps table 0's table");
        assert_memory_equal(keep, buf, sizeof keep);
    }
    float *f32_out = (float *)(void *)buf; /* 16 bytes, 4-byte aligned (calloc) */
    q.out = f32_out;
    q.out_dtype = FLAME_DTYPE_F32;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "out overlaps table 0's table");
    assert_memory_equal(keep, buf, sizeof keep);
    flame_embedding_bag_destroy(bag);
    tuk_table_free(&t);
    free(buf);
}

/* Empty bags are zeros under sum and mean, weighted or not, in every output dtype. */
static void test_tbe_empty_bags_are_zero(void **state)
{
    for (int pool = 0; pool < 2; pool++)
        for (int weighted = 0; weighted < 2; weighted++) {
            tuk_table t;
            tuk_table_fill(&t, FLAME_DTYPE_F32, 5, 7, (flame_pooling)pool);
            flame_status st;
            flame_embedding_bag *bag = make_bag(&t, 1, false, &st);
            assert_int_equal(st, FLAME_OK);
            int64_t off[4] = {0, 0, 0, 0}, ids[1] = {0};
            float w[1] = {1};
            flame_embedding_bag_input in = {sizeof in, ids, off, 0, weighted ? w : NULL};
            float out[21];
            tu_poison(out, 21);
            flame_embedding_bag_batch q = {sizeof q, 3, &in, 1, out, 0, FLAME_DTYPE_F32, NULL, 0, 0};
            assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
            for (int i = 0; i < 21; i++) assert_true(out[i] == 0.0f);
            for (int dt = FLAME_DTYPE_F16; dt <= FLAME_DTYPE_BF16; dt++) {
                uint16_t *h = half_out(21);
                q.out = h;
                q.out_dtype = (flame_dtype)dt;
                assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
                for (int i = 0; i < 21; i++) assert_int_equal(h[i], 0); /* +0 */
                assert_int_equal(h[21], HALF_POISON);
                free(h);
            }
            flame_embedding_bag_destroy(bag);
            tuk_table_free(&t);
        }
}

/* Borrowed F32/INT8 tables are read in place (a later change of the caller's memory shows). */
static void test_tbe_borrow(void **state)
{
    tuk_table t;
    tuk_table_fill(&t, FLAME_DTYPE_F32, 4, 3, FLAME_POOLING_SUM);
    flame_embedding_table d = tuk_desc(&t);
    flame_embedding_bag_params p = {sizeof p, FLAME_DEVICE_CPU, FLAME_COMBINE_CONCAT, &d, 1, 1, 0};
    flame_embedding_bag *bag;
    assert_int_equal(flame_embedding_bag_create(&p, &bag), FLAME_OK);
    ((float *)t.data)[2 * 3 + 1] = 42.0f;
    int64_t ids[1] = {2};
    flame_embedding_bag_input in = {sizeof in, ids, NULL, 1, NULL};
    float out[3];
    tu_poison(out, 3);
    flame_embedding_bag_batch q = {sizeof q, 1, &in, 1, out, 0, FLAME_DTYPE_F32, NULL, 0, 0};
    assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
    assert_true(out[1] == 42.0f);
    flame_embedding_bag_destroy(bag);
    tuk_table_free(&t);
}

/* Borrowed F16 and BF16 tables are read in place on the CPU: a later change of the caller's
 * rows shows in the next forward, and update_rows writes the caller's memory, bit for bit. */
static void test_tbe_borrow_half(void **state)
{
    for (int bf16 = 0; bf16 < 2; bf16++) {
        const flame_dtype dt = bf16 ? FLAME_DTYPE_BF16 : FLAME_DTYPE_F16;
        tuk_table t;
        tuk_table_fill(&t, dt, 6, 5, FLAME_POOLING_MEAN);
        flame_embedding_table d = tuk_desc(&t);
        flame_embedding_bag_params p = {sizeof p, FLAME_DEVICE_CPU, FLAME_COMBINE_CONCAT, &d, 1, 1, 0};
        flame_embedding_bag *bag;
        if (flame_embedding_bag_create(&p, &bag)) fail_msg("borrowed %s: %s", bf16 ? "BF16" : "F16", flame_last_error());
        uint16_t *rows = t.data;
        const float v = 3.25f; /* exact in both */
        rows[2 * 5 + 4] = bf16 ? tuk_bf16_bits(v) : tuk_f16_bits(v);
        t.value[2 * 5 + 4] = v;
        int64_t ids[3] = {2, 4, 2}, off[3] = {0, 1, 3};
        flame_embedding_bag_input in = {sizeof in, ids, off, 3, NULL};
        float out[10];
        tu_poison(out, 10);
        flame_embedding_bag_batch q = {sizeof q, 2, &in, 1, out, 0, FLAME_DTYPE_F32, NULL, 0, 0};
        assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
        double want[10];
        for (int j = 0; j < 5; j++) {
            want[j] = t.value[2 * 5 + j];
            want[5 + j] = (t.value[4 * 5 + j] + t.value[2 * 5 + j]) / 2;
        }
        assert_true(out[4] == 3.25f);
        assert_rel_err_below(out, want, 10, 1e-6);
        /* rows 4..5 replaced from new values: in the caller's array, read by the next forward */
        tuk_table nw;
        tuk_table_fill(&nw, dt, 2, 5, FLAME_POOLING_SUM);
        assert_int_equal(flame_embedding_bag_update_rows(bag, 0, 4, 2, nw.data, dt, NULL, NULL), FLAME_OK);
        assert_memory_equal(rows + 4 * 5, nw.data, 2 * 5 * sizeof(uint16_t));
        tu_poison(out, 10);
        assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
        for (int j = 0; j < 5; j++) want[5 + j] = (nw.value[j] + t.value[2 * 5 + j]) / 2;
        assert_rel_err_below(out, want, 10, 1e-6);
        flame_embedding_bag_destroy(bag);
        tuk_table_free(&nw);
        tuk_table_free(&t);
    }
}

/* update_rows replaces rows (INT8 with its scale and bias); a forward sees them. */
static void test_tbe_update_rows(void **state)
{
    const flame_dtype dts[4] = {FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_INT8, FLAME_DTYPE_F32};
    for (int k = 0; k < 4; k++) {
        tuk_table t;
        tuk_table_fill(&t, dts[k], 10, 5, FLAME_POOLING_SUM);
        flame_status st;
        flame_embedding_bag *bag = make_bag(&t, 1, false, &st);
        assert_int_equal(st, FLAME_OK);
        tuk_table nw; /* two new rows for rows 3 and 4 */
        tuk_table_fill(&nw, dts[k], 2, 5, FLAME_POOLING_SUM);
        assert_int_equal(flame_embedding_bag_update_rows(bag, 0, 3, 2, nw.data, dts[k], nw.qp, NULL), FLAME_OK);
        int64_t ids[3] = {3, 4, 5};
        flame_embedding_bag_input in = {sizeof in, ids, NULL, 3, NULL};
        float out[15];
        tu_poison(out, 15);
        flame_embedding_bag_batch q = {sizeof q, 3, &in, 1, out, 0, FLAME_DTYPE_F32, NULL, 0, 0};
        assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
        double want[15];
        for (int j = 0; j < 5; j++) {
            want[j] = nw.value[j];
            want[5 + j] = nw.value[5 + j];
            want[10 + j] = t.value[5 * 5 + j];
        }
        assert_rel_err_below(out, want, 15, 1e-6);
        /* rejections write nothing */
        assert_status_msg(flame_embedding_bag_update_rows(bag, 0, 9, 2, nw.data, dts[k], nw.qp, NULL),
                          FLAME_ERR_INVALID_ARG, "rows 9..10 (2 rows) are not within 0..9");
        assert_status_msg(flame_embedding_bag_update_rows(bag, 1, 0, 1, nw.data, dts[k], nw.qp, NULL),
                          FLAME_ERR_INVALID_ARG, "table 1 is outside 0..0");
        const flame_dtype other = dts[k] == FLAME_DTYPE_BF16 ? FLAME_DTYPE_F16 : FLAME_DTYPE_BF16;
        assert_status_msg(flame_embedding_bag_update_rows(bag, 0, 0, 1, nw.data, other, nw.qp, NULL),
                          FLAME_ERR_INVALID_ARG, other == FLAME_DTYPE_BF16 ? "values_dtype BF16" : "values_dtype F16");
        if (nw.qp) {
            nw.qp[3] = NAN;
            assert_status_msg(flame_embedding_bag_update_rows(bag, 0, 0, 2, nw.data, dts[k], nw.qp, NULL),
                              FLAME_ERR_INVALID_ARG, "table 0 row 1: bias nan is not finite");
            assert_status_msg(flame_embedding_bag_update_rows(bag, 0, 0, 2, nw.data, dts[k], NULL, NULL),
                              FLAME_ERR_INVALID_ARG, "qparams missing");
        }
        tu_poison(out, 15);
        assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
        assert_rel_err_below(out, want, 15, 1e-6);
        flame_embedding_bag_destroy(bag);
        tuk_table_free(&nw);
        tuk_table_free(&t);
    }
}

/* Forwards running while another thread replaces rows see each row wholly before or after an
 * update, never a mix: every row is one generation's constant, so a torn row has two values. */
enum { RACE_DIM = 512, RACE_ROWS = 4, RACE_GENERATIONS = 400 };
typedef struct race {
    flame_embedding_bag *bag;
    int failures;
} race;

static void *race_reader(void *arg)
{
    race *r = arg;
    int64_t ids[RACE_ROWS] = {0, 1, 2, 3};
    flame_embedding_bag_input in = {sizeof in, ids, NULL, RACE_ROWS, NULL};
    static __thread float out[RACE_ROWS * RACE_DIM];
    flame_embedding_bag_batch q = {sizeof q, RACE_ROWS, &in, 1, out, 0, FLAME_DTYPE_F32, NULL, 1, 0};
    float last = 0;
    for (int it = 0; it < 2 * RACE_GENERATIONS; it++) {
        if (flame_embedding_bag_forward(r->bag, &q) != FLAME_OK) r->failures++;
        for (int b = 0; b < RACE_ROWS; b++)
            for (int j = 1; j < RACE_DIM; j++)
                if (out[b * RACE_DIM + j] != out[b * RACE_DIM]) r->failures++;
        if (out[0] < last) r->failures++; /* generations only grow */
        last = out[0];
    }
    return NULL;
}

static void test_tbe_update_rows_against_concurrent_forwards(void **state)
{
    static float table[RACE_ROWS * RACE_DIM];
    tuk_table t = {FLAME_DTYPE_F32, FLAME_POOLING_SUM, RACE_ROWS, RACE_DIM, table, NULL, NULL};
    flame_status st;
    race r = {make_bag(&t, 1, false, &st), 0};
    assert_int_equal(st, FLAME_OK);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, race_reader, &r), 0);
    static float rows[RACE_ROWS * RACE_DIM];
    for (int g = 1; g <= RACE_GENERATIONS; g++) {
        for (int i = 0; i < RACE_ROWS * RACE_DIM; i++) rows[i] = (float)g;
        assert_int_equal(flame_embedding_bag_update_rows(r.bag, 0, 0, RACE_ROWS, rows, FLAME_DTYPE_F32, NULL, NULL),
                         FLAME_OK);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    assert_int_equal(r.failures, 0);
    flame_embedding_bag_destroy(r.bag);
}

/* Every lookup rejection names its table, bag and value; the output stays poisoned. */
static void test_tbe_rejections(void **state)
{
    tuk_table t[2];
    tuk_table_fill(&t[0], FLAME_DTYPE_F32, 10, 4, FLAME_POOLING_SUM);
    tuk_table_fill(&t[1], FLAME_DTYPE_INT8, 20, 3, FLAME_POOLING_MEAN);
    flame_status st;
    flame_embedding_bag *bag = make_bag(t, 2, false, &st);
    assert_int_equal(st, FLAME_OK);
    int64_t off0[4] = {0, 1, 2, 3}, ids0[3] = {1, 2, 3};
    int64_t off1[4] = {0, 2, 2, 4}, ids1[4] = {0, 5, 19, 7};
    float w1[4] = {1, 1, 1, 1};
    flame_embedding_bag_input in[2] = {{sizeof in[0], ids0, off0, 3, NULL}, {sizeof in[1], ids1, off1, 4, w1}};
    float out[3 * 7 + 1];
    flame_embedding_bag_batch q = {sizeof q, 3, in, 2, out, 0, FLAME_DTYPE_F32, NULL, 0, 0};
#define REJECT(status, needle)                                                                                   \
    do {                                                                                                         \
        tu_poison(out, 22);                                                                                      \
        assert_status_msg(flame_embedding_bag_forward(bag, &q), status, needle);                                 \
        for (int i_ = 0; i_ < 22; i_++) assert_true(isnan(out[i_]));                                             \
    } while (0)
    tu_poison(out, 22);
    assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
    /* a caller built before device_indices: its struct_size ends before the field, which then
     * reads as 0 whatever the memory after it holds */
    q.struct_size = offsetof(flame_embedding_bag_batch, device_indices);
    q.device_indices = 7;
    assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
    q.struct_size = sizeof q;
    q.device_indices = 2;
    REJECT(FLAME_ERR_INVALID_ARG, "device_indices 2 (0 or 1)");
    /* a CPU handle's indices are host memory under either mode: checked at once */
    q.device_indices = 1;
    ids1[2] = 20;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1 bag 2: ids[2] = 20 is outside 0..19");
    assert_int_equal(flame_embedding_bag_index_status(bag, NULL), FLAME_OK); /* nothing deferred on the CPU */
    assert_status_msg(flame_embedding_bag_index_status(NULL, NULL), FLAME_ERR_INVALID_ARG, "NULL bag");
    q.device_indices = 0;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1 bag 2: ids[2] = 20 is outside 0..19");
    ids1[2] = -1;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1 bag 2: ids[2] = -1 is outside 0..19");
    ids1[2] = 19;
    off1[0] = 1;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1 bag 0: offsets[0] = 1, not 0");
    off1[0] = 0;
    off1[2] = 1;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1 bag 1: offsets[2] = 1 is outside offsets[1] = 2 .. num_ids = 4");
    off1[2] = 2;
    off1[3] = 3;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1: offsets[batch = 3] = 3 but num_ids = 4");
    off1[3] = 5;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1 bag 2: offsets[3] = 5 is outside offsets[2] = 2 .. num_ids = 4");
    off1[3] = 4;
    w1[3] = INFINITY;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1 bag 2: weights[3] = inf is not finite");
    w1[3] = 1;
    in[0].offsets = NULL;
    in[0].num_ids = 2;
    REJECT(FLAME_ERR_INVALID_ARG, "table 0: num_ids 2 without offsets (one id per bag) must equal batch 3");
    in[0].num_ids = 3;
    ids0[0] = 10;
    REJECT(FLAME_ERR_INVALID_ARG, "table 0 bag 0: ids[0] = 10 is outside 0..9");
    ids0[0] = 1;
    in[0].offsets = off0;
    in[0].num_ids = -1;
    REJECT(FLAME_ERR_INVALID_ARG, "table 0: num_ids -1 is negative");
    in[0].num_ids = 3;
    in[0].ids = NULL;
    REJECT(FLAME_ERR_INVALID_ARG, "table 0: ids is NULL with num_ids 3");
    in[0].ids = ids0;
    q.num_inputs = 1;
    REJECT(FLAME_ERR_INVALID_ARG, "num_inputs 1, the handle has 2 tables");
    q.num_inputs = 2;
    q.ld_out = 6;
    REJECT(FLAME_ERR_INVALID_ARG, "ld_out 6 is outside width 7..2^40");
    q.ld_out = 0;
    q.out_dtype = FLAME_DTYPE_INT8;
    REJECT(FLAME_ERR_INVALID_ARG, "out_dtype INT8 is not written by the CPU (F32, F16 or BF16)");
    q.out_dtype = FLAME_DTYPE_F32;
    q.threads = -1;
    REJECT(FLAME_ERR_INVALID_ARG, "threads -1 is outside 0..1024");
    q.threads = 0;
    q.batch = -2;
    REJECT(FLAME_ERR_INVALID_ARG, "batch -2 is outside 0..2^31-1");
    q.batch = 3;
    in[1].struct_size = 4;
    REJECT(FLAME_ERR_INVALID_ARG, "inputs[1].struct_size 4 differs from inputs[0]'s");
    in[1].struct_size = sizeof in[1];
    q.struct_size = 3;
    REJECT(FLAME_ERR_INVALID_ARG, "flame_embedding_bag_batch");
    q.struct_size = sizeof q;
    q.out = NULL;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "out is NULL with batch 3");
    /* batch 0: nothing to write, out may be NULL */
    q.batch = 0;
    off0[0] = off1[0] = 0;
    in[0].num_ids = in[1].num_ids = 0;
    assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
    assert_status_msg(flame_embedding_bag_forward(NULL, &q), FLAME_ERR_INVALID_ARG, "NULL bag or batch");
#undef REJECT
    flame_embedding_bag_destroy(bag);
    flame_embedding_bag_destroy(NULL);
    tuk_table_free(&t[0]);
    tuk_table_free(&t[1]);
}

/* A CPU bag that borrows table t, filled here (dtype, rows x dim, SUM pooling). */
static flame_embedding_bag *borrowed_cpu_bag(tuk_table *t, flame_dtype dtype, int64_t rows, int32_t dim)
{
    tuk_table_fill(t, dtype, rows, dim, FLAME_POOLING_SUM);
    flame_embedding_table d = tuk_desc(t);
    flame_embedding_bag_params p = {sizeof p, FLAME_DEVICE_CPU, FLAME_COMBINE_CONCAT, &d, 1, 1, 0};
    flame_embedding_bag *bag = NULL;
    assert_int_equal(flame_embedding_bag_create(&p, &bag), FLAME_OK);
    return bag;
}

/* An output over any array the forward reads is refused (rows are written while later bags
 * still read their indices): the arrays keep their values. So are a host num_ids past 2^47,
 * an unknown dtype (named by its number), and an update whose values overlap the rows they
 * replace, or whose row range overflows. */
static void test_tbe_overlaps_and_bounds(void **state)
{
    tuk_table t;
    flame_embedding_bag *bag = borrowed_cpu_bag(&t, FLAME_DTYPE_F32, 10, 2);
    /* one buffer: offsets [0..2], ids [3..5], weights (as floats) after them, room for out */
    int64_t buf[16] = {0, 1, 3, 0, 1, 9};
    float *w = (float *)(buf + 6);
    w[0] = w[1] = w[2] = 1.0f;
    int64_t keep[16];
    memcpy(keep, buf, sizeof buf);
    flame_embedding_bag_input in = {sizeof in, buf + 3, buf, 3, w};
    float out[4];
    flame_embedding_bag_batch q = {sizeof q, 2, &in, 1, out, 0, FLAME_DTYPE_F32, NULL, 0, 0};
    tu_poison(out, 4);
    assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
    const struct {
        void *at;
        const char *needle;
    } bad[4] = {{buf + 4, "out overlaps table 0's ids"},
                {buf + 1, "out overlaps table 0's offsets"},
                {w + 1, "out overlaps table 0's weights"},
                {(float *)t.data + 2 * 9, "out overlaps table 0's table"}};
    float tab_keep[20];
    memcpy(tab_keep, t.data, sizeof tab_keep);
    for (int i = 0; i < 4; i++) {
        q.out = bad[i].at;
        assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, bad[i].needle);
        assert_memory_equal(buf, keep, sizeof buf);
        assert_memory_equal(t.data, tab_keep, sizeof tab_keep);
    }
    q.out = out;
    q.ld_out = INT64_C(1) << 40;
    q.batch = 2048; /* 2^51 elements */
    in.offsets = NULL;
    in.num_ids = 2048;
    int64_t *many = calloc(2048, sizeof(int64_t));
    in.ids = many;
    in.weights = NULL;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG,
                      "batch 2048 x ld_out 1099511627776 exceeds 2^50 elements");
    free(many);
    q.ld_out = 0;
    q.batch = 1;
    in.ids = buf + 3;
    in.offsets = buf; /* {0, 1}: offsets[1] would have to equal num_ids */
    in.num_ids = (INT64_C(1) << 47) + 1;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG,
                      "table 0: num_ids 140737488355329 is outside 0..2^47");
    in.num_ids = 1;
    q.out_dtype = (flame_dtype)77;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "out_dtype 77 (unknown)");
    q.out_dtype = FLAME_DTYPE_F32;
    assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);

    /* updates */
    assert_status_msg(flame_embedding_bag_update_rows(bag, 0, INT64_MAX, 2, t.data, FLAME_DTYPE_F32, NULL, NULL),
                      FLAME_ERR_INVALID_ARG, "first_row 9223372036854775807 with num_rows 2 is not within 0..9");
    assert_status_msg(flame_embedding_bag_update_rows(bag, 0, 5, INT64_MAX, t.data, FLAME_DTYPE_F32, NULL, NULL),
                      FLAME_ERR_INVALID_ARG, "first_row 5 with num_rows 9223372036854775807 is not within 0..9");
    assert_status_msg(flame_embedding_bag_update_rows(bag, 0, 0, 2, t.data, (flame_dtype)77, NULL, NULL),
                      FLAME_ERR_INVALID_ARG, "values_dtype 77 (unknown)");
    /* rows 0..1 from rows 1..2 of the same (borrowed) table */
    assert_status_msg(flame_embedding_bag_update_rows(bag, 0, 0, 2, (float *)t.data + 2, FLAME_DTYPE_F32, NULL, NULL),
                      FLAME_ERR_INVALID_ARG, "table 0: values overlaps rows 0..1 it replaces");
    assert_memory_equal(t.data, tab_keep, sizeof tab_keep);
    /* from rows 2..3 (no overlap): done */
    assert_int_equal(flame_embedding_bag_update_rows(bag, 0, 0, 2, (float *)t.data + 4, FLAME_DTYPE_F32, NULL, NULL),
                     FLAME_OK);
    assert_memory_equal(t.data, tab_keep + 4, 4 * sizeof(float));
    flame_embedding_bag_destroy(bag);
    tuk_table_free(&t);
}

/* Lengths whose product passes 2^64 (batch 2^24 x ld_out 2^40, rows 2^24 x ld_q 2^40) are
 * refused, not wrapped to a small product; an update whose qparams lie over the rows' own
 * values is refused before anything is copied (the checked qparams would be overwritten by
 * values); arrays not aligned to their elements are refused. */
static void test_kernels_wraps_overlaps_alignment(void **state)
{
    tuk_table t;
    flame_embedding_bag *bag = borrowed_cpu_bag(&t, FLAME_DTYPE_F32, 10, 2);
    const int64_t big = INT64_C(1) << 24;
    int64_t *ids = calloc((size_t)big, sizeof(int64_t)); /* zero pages: never written */
    flame_embedding_bag_input in = {sizeof in, ids, NULL, big, NULL};
    float out[8];
    flame_embedding_bag_batch q = {sizeof q, big, &in, 1, out, INT64_C(1) << 40, FLAME_DTYPE_F32, NULL, 0, 0};
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG,
                      "batch 16777216 x ld_out 1099511627776 exceeds 2^50 elements");
    free(ids);
    /* misaligned ids, out */
    int64_t idbuf[4] = {1, 2, 3, 4};
    in.ids = (const int64_t *)((const char *)idbuf + 4);
    in.num_ids = 2;
    q.batch = 2;
    q.ld_out = 0;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "is not aligned to its 8-byte elements");
    in.ids = idbuf;
    q.out = (float *)((char *)out + 2);
    tu_poison(out, 8);
    float keep[8];
    memcpy(keep, out, sizeof out);
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "is not aligned to its 4-byte elements");
    assert_memory_equal(keep, out, sizeof out);
    q.out = out;
    assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
    flame_embedding_bag_destroy(bag);
    tuk_table_free(&t);

    /* INT8, borrowed: qparams given for row 0 that are row 0's own bytes */
    bag = borrowed_cpu_bag(&t, FLAME_DTYPE_INT8, 4, 8);
    const float qp_in_row[2] = {1.0f, 0.0f};
    memcpy(t.data, qp_in_row, sizeof qp_in_row); /* finite as qparams, so only the overlap refuses */
    int8_t vals[8];
    memset(vals, 0xff, sizeof vals);
    int8_t data_keep[32];
    float qp_keep[8];
    memcpy(data_keep, t.data, sizeof data_keep);
    memcpy(qp_keep, t.qp, sizeof qp_keep);
    assert_status_msg(flame_embedding_bag_update_rows(bag, 0, 0, 1, vals, FLAME_DTYPE_INT8, (const float *)t.data, NULL),
                      FLAME_ERR_INVALID_ARG, "table 0: qparams overlaps rows 0..0 it replaces (their values)");
    assert_memory_equal(t.data, data_keep, sizeof data_keep);
    assert_memory_equal(t.qp, qp_keep, sizeof qp_keep);
    assert_status_msg(flame_embedding_bag_update_rows(bag, 0, 0, 1, vals, FLAME_DTYPE_INT8,
                                                      (const float *)((const char *)qp_in_row + 1), NULL),
                      FLAME_ERR_INVALID_ARG, "qparams is not aligned to its 4-byte elements");
    flame_embedding_bag_destroy(bag);
    tuk_table_free(&t);

    /* attention: rows 2^24 x ld_q 2^40 (refused before any array is read), misaligned q */
    float qkvo[4][8] = {{0}};
    const int64_t cu_h[2] = {0, 0}, cu_c[2] = {0, big};
    flame_attention_params a = {0};
    a.struct_size = sizeof a;
    a.device = FLAME_DEVICE_CPU;
    a.dtype = FLAME_DTYPE_F32;
    a.heads = 1;
    a.head_dim = 4;
    a.num_seqs = 1;
    a.cu_history = cu_h;
    a.cu_candidates = cu_c;
    a.rows = big;
    a.q = qkvo[0];
    a.k = qkvo[1];
    a.v = qkvo[2];
    a.out = qkvo[3];
    a.ld_q = INT64_C(1) << 40;
    a.ld_k = a.ld_v = a.ld_out = 4;
    a.threads = 1;
    assert_status_msg(flame_sumi_attention(&a), FLAME_ERR_INVALID_ARG, "rows x ld_q exceeds 2^50");
    const int64_t cu_one[2] = {0, 1};
    a.cu_candidates = cu_one;
    a.rows = 1;
    a.ld_q = 4;
    a.q = (const float *)((const char *)qkvo[0] + 2);
    assert_status_msg(flame_sumi_attention(&a), FLAME_ERR_INVALID_ARG, "is not aligned to its 4-byte elements");
    a.q = qkvo[0];
    assert_int_equal(flame_sumi_attention(&a), FLAME_OK);
}

static void test_tbe_create_rejections(void **state)
{
    tuk_table t[2];
    tuk_table_fill(&t[0], FLAME_DTYPE_F32, 10, 4, FLAME_POOLING_SUM);
    tuk_table_fill(&t[1], FLAME_DTYPE_INT8, 20, 3, FLAME_POOLING_MEAN);
    flame_embedding_table d[2] = {tuk_desc(&t[0]), tuk_desc(&t[1])};
    flame_embedding_bag_params p = {sizeof p, FLAME_DEVICE_CPU, FLAME_COMBINE_CONCAT, d, 2, 0, 0};
    flame_embedding_bag *bag = (flame_embedding_bag *)&p; /* set to NULL on failure */
#define REJECT(status, needle)                                                                                   \
    do {                                                                                                         \
        assert_status_msg(flame_embedding_bag_create(&p, &bag), status, needle);                                 \
        assert_null(bag);                                                                                        \
    } while (0)
    p.combine = FLAME_COMBINE_SUM;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1: dim 3 differs from table 0's 4 under SUM combine");
    p.combine = (flame_combine)2;
    REJECT(FLAME_ERR_INVALID_ARG, "combine 2 is neither CONCAT (0) nor SUM (1)");
    p.combine = FLAME_COMBINE_CONCAT;
    d[1].qparams = NULL;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1: qparams missing for a INT8 table");
    d[1].qparams = t[1].qp;
    d[0].qparams = t[1].qp;
    REJECT(FLAME_ERR_INVALID_ARG, "table 0: qparams given for a F32 table");
    d[0].qparams = NULL;
    t[1].qp[2 * 7] = NAN;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1 row 7: scale nan is not finite");
    t[1].qp[2 * 7] = 0.01f;
    d[0].rows = 0;
    REJECT(FLAME_ERR_INVALID_ARG, "table 0: rows 0 is outside 1..2^40");
    d[0].rows = 10;
    d[0].dim = 0;
    REJECT(FLAME_ERR_INVALID_ARG, "table 0: dim 0 is outside 1..16384");
    d[0].dim = 4;
    d[0].dtype = (flame_dtype)9;
    REJECT(FLAME_ERR_INVALID_ARG, "table 0: dtype 9 is unknown");
    d[0].dtype = FLAME_DTYPE_F32;
    d[1].pooling = (flame_pooling)5;
    REJECT(FLAME_ERR_INVALID_ARG, "table 1: pooling 5 is neither SUM nor MEAN");
    d[1].pooling = FLAME_POOLING_MEAN;
    d[0].data = NULL;
    REJECT(FLAME_ERR_INVALID_ARG, "table 0: data is NULL");
    d[0].data = t[0].data;
    p.num_tables = 0;
    REJECT(FLAME_ERR_INVALID_ARG, "num_tables 0 is outside 1..64");
    p.num_tables = 2;
    d[1].struct_size = 16;
    REJECT(FLAME_ERR_INVALID_ARG, "tables[1].struct_size 16 differs from tables[0]'s");
    d[1].struct_size = sizeof d[1];
    p.device = -2;
    REJECT(FLAME_ERR_INVALID_ARG, "device -2");
    p.device = FLAME_DEVICE_CPU;
    p.borrow = 2;
    REJECT(FLAME_ERR_INVALID_ARG, "borrow 2 (0 or 1)");
    p.borrow = 0;
    assert_int_equal(flame_embedding_bag_create(&p, &bag), FLAME_OK);
    flame_embedding_bag_destroy(bag);
#undef REJECT
    tuk_table_free(&t[0]);
    tuk_table_free(&t[1]);
}

/* ---- attention */

typedef struct att_case {
    tuk_batch b;
    int32_t heads, dh;
    flame_attention_mask mask;
    bool fused;
    int64_t ldq, ldkv, ldo;
    float *qkv, *q, *k, *v, *out;
    double *dq, *dk, *dv;
} att_case;

static float *rand_rows(int64_t rows, int64_t ld, double **d)
{
    float *x = malloc((size_t)(rows * ld + 1) * sizeof(float));
    *d = malloc((size_t)(rows * ld + 1) * sizeof(double));
    for (int64_t i = 0; i < rows * ld; i++) (*d)[i] = x[i] = 2.0f * tu_uniform();
    return x;
}

static void att_make(att_case *c, flame_attention_params *p)
{
    tuk_batch_fill(&c->b, 1 + tu_below(5), 40, 10);
    c->heads = 1 + (int32_t)tu_below(3);
    c->dh = 1 + (int32_t)tu_below(40);
    c->mask = (flame_attention_mask)tu_below(3);
    c->fused = tu_below(2);
    const int64_t w = (int64_t)c->heads * c->dh, R = c->b.rows;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->device = FLAME_DEVICE_CPU;
    p->dtype = FLAME_DTYPE_F32;
    p->mask = c->mask;
    p->heads = c->heads;
    p->head_dim = c->dh;
    p->num_seqs = c->b.num_seqs;
    p->cu_history = c->b.cu_h;
    p->cu_candidates = c->b.cu_c;
    p->rows = R;
    c->q = c->k = c->v = c->qkv = NULL;
    if (c->fused) {
        c->ldq = c->ldkv = 3 * w + tu_below(3);
        c->qkv = rand_rows(R, c->ldq, &c->dq);
        c->dk = c->dq + w;
        c->dv = c->dq + 2 * w;
        p->qkv = c->qkv;
        p->ld_qkv = c->ldq;
    } else {
        c->ldq = w + tu_below(3);
        c->ldkv = w + tu_below(3);
        c->q = rand_rows(R, c->ldq, &c->dq);
        c->k = rand_rows(R, c->ldkv, &c->dk);
        c->v = rand_rows(R, c->ldkv, &c->dv);
        p->q = c->q;
        p->k = c->k;
        p->v = c->v;
        p->ld_q = c->ldq;
        p->ld_k = p->ld_v = c->ldkv;
    }
    c->ldo = w + tu_below(3);
    c->out = malloc((size_t)(R * c->ldo + 1) * sizeof(float));
    tu_poison(c->out, (size_t)(R * c->ldo + 1));
    p->out = c->out;
    p->ld_out = c->ldo;
    p->threads = 1 + (int32_t)tu_below(3);
}

static void att_free(att_case *c)
{
    if (c->fused) {
        free(c->qkv);
        free(c->dq);
    } else {
        free(c->q);
        free(c->k);
        free(c->v);
        free(c->dq);
        free(c->dk);
        free(c->dv);
    }
    free(c->out);
    tuk_batch_free(&c->b);
}

static void test_attention_against_reference(void **state)
{
    for (int rep = 0; rep < 120; rep++) {
        att_case c;
        flame_attention_params p;
        att_make(&c, &p);
        flame_status st = flame_sumi_attention(&p);
        if (st) fail_msg("attention: %s", flame_last_error());
        const int64_t w = (int64_t)c.heads * c.dh, R = c.b.rows;
        double *want = malloc((size_t)(R * w + 1) * sizeof(double));
        tuk_attention_reference(&c.b, c.mask, c.heads, c.dh, c.dq, c.ldq, c.dk, c.ldkv, c.dv, c.ldkv, want);
        float *got = malloc((size_t)(R * w + 1) * sizeof(float));
        for (int64_t r = 0; r < R; r++) {
            memcpy(got + r * w, c.out + r * c.ldo, (size_t)w * sizeof(float));
            for (int64_t j = w; j < c.ldo; j++) assert_true(isnan(c.out[r * c.ldo + j]));
        }
        if (R) assert_rel_err_below(got, want, (size_t)(R * w), 1e-5);
        /* the same bits on any number of the pool's threads (one task a sequence) */
        const int32_t first_threads = p.threads;
        p.threads = first_threads == 1 ? 4 : 1;
        tu_poison(c.out, (size_t)(R * c.ldo + 1));
        if (flame_sumi_attention(&p)) fail_msg("attention, %d threads: %s", p.threads, flame_last_error());
        for (int64_t r = 0; r < R; r++)
            if (memcmp(got + r * w, c.out + r * c.ldo, (size_t)w * sizeof(float)))
                fail_msg("attention: row %lld differs between %d and %d threads", (long long)r, first_threads,
                         p.threads);
        free(got);
        free(want);
        att_free(&c);
    }
}

/* Q, K, V and out side by side in the rows of one buffer, in either order ([Q K V O] and
 * [O Q K V], row stride 4 w + pad): no element is shared, so the call runs and gives the bits of
 * the same call on separate arrays; an out shifted by one element into V's columns, by one row
 * onto Q's next rows, or of another stride over the same rows is refused, and nothing is
 * written. */
static void test_attention_output_beside_qkv(void **state)
{
    for (int rep = 0; rep < 40; rep++) {
        att_case c;
        flame_attention_params p;
        att_make(&c, &p);
        const int64_t w = (int64_t)c.heads * c.dh, R = c.b.rows;
        if (R < 2) {
            att_free(&c);
            continue;
        }
        if (flame_sumi_attention(&p)) fail_msg("attention: %s", flame_last_error());
        const int64_t ld = 4 * w + (int64_t)tu_below(3);
        const size_t n = (size_t)((R + 1) * ld + 1); /* a row of slack: the refused outs below reach past R rows */
        float *buf = malloc(n * sizeof(float));
        for (int order = 0; order < 2; order++) { /* 0: [Q K V O], 1: [O Q K V] */
            const int64_t at_q = order ? w : 0, at_out = order ? 0 : 3 * w;
            tu_poison(buf, n);
            for (int64_t r = 0; r < R; r++)
                for (int64_t j = 0; j < w; j++) {
                    buf[r * ld + at_q + j] = c.fused ? c.qkv[r * c.ldq + j] : c.q[r * c.ldq + j];
                    buf[r * ld + at_q + w + j] = c.fused ? c.qkv[r * c.ldq + w + j] : c.k[r * c.ldkv + j];
                    buf[r * ld + at_q + 2 * w + j] = c.fused ? c.qkv[r * c.ldq + 2 * w + j] : c.v[r * c.ldkv + j];
                }
            flame_attention_params f = p;
            f.qkv = NULL;
            f.q = buf + at_q;
            f.k = buf + at_q + w;
            f.v = buf + at_q + 2 * w;
            f.ld_q = f.ld_k = f.ld_v = ld;
            f.out = buf + at_out;
            f.ld_out = ld;
            if (flame_sumi_attention(&f)) fail_msg("attention, out beside Q, K, V (order %d): %s", order, flame_last_error());
            for (int64_t r = 0; r < R; r++)
                if (memcmp(buf + r * ld + at_out, c.out + r * c.ldo, (size_t)w * sizeof(float)))
                    fail_msg("attention, out beside Q, K, V (order %d): row %lld differs from separate arrays", order,
                             (long long)r);
            /* refused, nothing written */
            struct {
                float *out;
                int64_t ld_out;
                const char *msg;
            } bad[3] = {{buf + at_q + 2 * w + (w > 1), ld, "out overlaps v"},
                        {buf + at_q + ld, ld, "out overlaps q"},
                        {buf + at_out, ld + 1, "out overlaps"}};
            for (int i = 0; i < 3; i++) {
                f.out = bad[i].out;
                f.ld_out = bad[i].ld_out;
                float *before = malloc(n * sizeof(float));
                memcpy(before, buf, n * sizeof(float));
                assert_status_msg(flame_sumi_attention(&f), FLAME_ERR_INVALID_ARG, bad[i].msg);
                assert_memory_equal(before, buf, n * sizeof(float));
                free(before);
            }
        }
        free(buf);
        att_free(&c);
    }
}

static void test_attention_rejections(void **state)
{
    att_case c;
    flame_attention_params p;
    do { /* a batch with at least two non-empty sequences, separate Q/K/V */
        att_make(&c, &p);
        if (c.b.num_seqs >= 2 && c.b.rows > 0 && !c.fused && c.b.cu_h[1] > 0) break;
        att_free(&c);
    } while (1);
    const size_t nout = (size_t)(c.b.rows * c.ldo);
#define REJECT(status, needle)                                                                                   \
    do {                                                                                                         \
        tu_poison(c.out, nout);                                                                                  \
        assert_status_msg(flame_sumi_attention(&p), status, needle);                                             \
        for (size_t i_ = 0; i_ < nout; i_++) assert_true(isnan(c.out[i_]));                                      \
    } while (0)
    char msg[200];
    int64_t *cu = c.b.cu_h, keep = cu[1];
    cu[1] = cu[2] + 1;
    snprintf(msg, sizeof msg, "sequence 1: cu_history[2] = %lld is outside cu_history[1] = %lld", (long long)cu[2],
             (long long)cu[1]);
    REJECT(FLAME_ERR_INVALID_ARG, msg);
    cu[1] = keep;
    cu[0] = 1;
    REJECT(FLAME_ERR_INVALID_ARG, "cu_history[0] = 1, not 0");
    cu[0] = 0;
    p.rows++;
    snprintf(msg, sizeof msg, "rows %lld, the sequences hold", (long long)p.rows);
    REJECT(FLAME_ERR_INVALID_ARG, msg);
    p.rows--;
    p.qkv = c.q;
    REJECT(FLAME_ERR_INVALID_ARG, "qkv is given together with q, k or v");
    p.qkv = NULL;
    p.ld_q = c.heads * c.dh - 1;
    REJECT(FLAME_ERR_INVALID_ARG, "ld_q");
    p.ld_q = c.ldq;
    p.ld_v = c.ldkv + 1;
    REJECT(FLAME_ERR_UNSUPPORTED, "ld_k");
    p.ld_v = c.ldkv;
    p.dtype = FLAME_DTYPE_F16;
    REJECT(FLAME_ERR_UNSUPPORTED, "the CPU computes F32 only");
    p.dtype = (flame_dtype)7;
    REJECT(FLAME_ERR_INVALID_ARG, "dtype 7");
    p.dtype = FLAME_DTYPE_F32;
    p.mask = (flame_attention_mask)3;
    REJECT(FLAME_ERR_INVALID_ARG, "mask 3");
    p.mask = c.mask;
    p.heads = 0;
    REJECT(FLAME_ERR_INVALID_ARG, "heads 0 is outside 1..65535");
    p.heads = c.heads;
    p.head_dim = 1025;
    REJECT(FLAME_ERR_INVALID_ARG, "head_dim 1025 is outside 1..1024");
    p.head_dim = c.dh;
    p.num_seqs = -1;
    REJECT(FLAME_ERR_INVALID_ARG, "num_seqs -1");
    p.num_seqs = c.b.num_seqs;
    p.cu_history = NULL;
    REJECT(FLAME_ERR_INVALID_ARG, "cu_history is NULL");
    p.cu_history = c.b.cu_h;
    p.k = NULL;
    REJECT(FLAME_ERR_INVALID_ARG, "k is NULL");
    p.k = c.k;
    p.v = c.out;
    p.ld_v = c.ldo;
    p.ld_k = c.ldo;
    REJECT(FLAME_ERR_INVALID_ARG, "out overlaps v");
    p.v = c.v;
    p.ld_k = p.ld_v = c.ldkv;
    p.threads = 2000;
    REJECT(FLAME_ERR_INVALID_ARG, "threads 2000");
    p.threads = 1;
    p.struct_size = 2;
    REJECT(FLAME_ERR_INVALID_ARG, "flame_attention_params");
    p.struct_size = sizeof p;
    assert_int_equal(flame_sumi_attention(&p), FLAME_OK);
    assert_status_msg(flame_sumi_attention(NULL), FLAME_ERR_INVALID_ARG, "NULL params");
#undef REJECT
    att_free(&c);
    /* no rows: nothing to do, pointers may be NULL */
    int64_t zero[3] = {0, 0, 0};
    flame_attention_params e = {0};
    e.struct_size = sizeof e;
    e.device = FLAME_DEVICE_CPU;
    e.heads = 2;
    e.head_dim = 8;
    e.num_seqs = 2;
    e.cu_history = zero;
    e.ld_q = e.ld_k = e.ld_v = e.ld_out = 16;
    assert_int_equal(flame_sumi_attention(&e), FLAME_OK);
}

/* ---- the GPU entry points where no GPU is usable */

static void test_gpu_calls_without_gpu(void **state)
{
    char why[256];
    if (fl_cuda_device_count(why, sizeof why) > 0) skip(); /* the GPU suite covers them */
    const flame_status want = strstr(why, "without CUDA") ? FLAME_ERR_UNSUPPORTED : FLAME_ERR_NO_DEVICE;
    tuk_table t;
    tuk_table_fill(&t, FLAME_DTYPE_F32, 4, 4, FLAME_POOLING_SUM);
    flame_embedding_table d = tuk_desc(&t);
    flame_embedding_bag_params p = {sizeof p, 0, FLAME_COMBINE_CONCAT, &d, 1, 0, 0};
    flame_embedding_bag *bag;
    assert_int_equal(flame_embedding_bag_create(&p, &bag), want);
    assert_null(bag);
    int64_t cu[2] = {0, 3};
    float x[3 * 12];
    flame_attention_params a = {0};
    a.struct_size = sizeof a;
    a.device = 0;
    a.dtype = FLAME_DTYPE_F16;
    a.heads = 1;
    a.head_dim = 4;
    a.num_seqs = 1;
    a.cu_history = cu;
    a.rows = 3;
    a.qkv = x;
    a.ld_qkv = 12;
    float o[12];
    a.out = o;
    a.ld_out = 4;
    assert_int_equal(flame_sumi_attention(&a), want);
    tuk_table_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tbe_against_reference),
        cmocka_unit_test(test_tbe_empty_bags_are_zero),
        cmocka_unit_test(test_tbe_half_outputs_many_bags_and_threads),
        cmocka_unit_test(test_tbe_half_output_rounding),
        cmocka_unit_test(test_tbe_half_output_extent_and_alignment),
        cmocka_unit_test(test_tbe_borrow),
        cmocka_unit_test(test_tbe_borrow_half),
        cmocka_unit_test(test_tbe_update_rows),
        cmocka_unit_test(test_tbe_update_rows_against_concurrent_forwards),
        cmocka_unit_test(test_tbe_rejections),
        cmocka_unit_test(test_tbe_overlaps_and_bounds),
        cmocka_unit_test(test_kernels_wraps_overlaps_alignment),
        cmocka_unit_test(test_tbe_create_rejections),
        cmocka_unit_test(test_attention_against_reference),
        cmocka_unit_test(test_attention_rejections),
        cmocka_unit_test(test_attention_output_beside_qkv),
        cmocka_unit_test(test_gpu_calls_without_gpu),
    };
    tu_seed();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
