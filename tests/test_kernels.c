/* Every CPU kernel against an independent float64 reference on fresh random inputs
 * (normwise relative error < 1e-5); outputs are poisoned with NaN first. */
#include <float.h>
#include <string.h>

#include "testutil.h"
#include "tu_half.h"
#include "cpu/expf.h"
#include "cpu/kernels.h"

#define TOL 1e-5

static int setup(void **state)
{
    tu_seed();
    return 0;
}

static float *randf(size_t n)
{
    float *x = malloc(n * sizeof *x);
    tu_fill(x, n);
    return x;
}

/* ---- embedding bag */

static void check_embedding(bool concat)
{
    const int64_t rows[3] = {50, 7, 300};
    const int32_t dims[3] = {8, 8, 8};
    const int64_t T = 1 + tu_below(40);
    float *tables[3];
    for (int t = 0; t < 3; t++) tables[t] = randf((size_t)(rows[t] * dims[t]));
    int64_t *item_ids = malloc((size_t)T * sizeof(int64_t));
    for (int64_t t = 0; t < T; t++) item_ids[t] = tu_below(rows[0]);
    /* two bagged features: sum and mean; bags of 0..4 ids (empty bags included) */
    int64_t *off[2], *ids[2];
    for (int f = 0; f < 2; f++) {
        off[f] = malloc((size_t)(T + 1) * sizeof(int64_t));
        ids[f] = malloc((size_t)(4 * T + 1) * sizeof(int64_t));
        off[f][0] = 0;
        for (int64_t t = 0; t < T; t++) {
            int64_t n = tu_below(5);
            for (int64_t i = 0; i < n; i++) ids[f][off[f][t] + i] = tu_below(rows[f + 1]);
            off[f][t + 1] = off[f][t] + n;
        }
    }
    int32_t width = concat ? 24 : 8;
    fl_emb_feature fe[3] = {
        {.table = tables[0], .rows = rows[0], .dim = dims[0], .pooling = FL_KPOOL_SUM, .ids = item_ids},
        {.table = tables[1], .rows = rows[1], .dim = dims[1], .pooling = FL_KPOOL_SUM, .offsets = off[0], .ids = ids[0],
         .out_col = concat ? 8 : 0},
        {.table = tables[2], .rows = rows[2], .dim = dims[2], .pooling = FL_KPOOL_MEAN, .offsets = off[1], .ids = ids[1],
         .out_col = concat ? 16 : 0},
    };
    const int64_t ldo = width + 3; /* a strided output must leave the gap alone */
    float *out = malloc((size_t)(T * ldo) * sizeof(float));
    tu_poison(out, (size_t)(T * ldo));
    fl_cpu_embedding_bag(fe, 3, T, out, ldo, width);
    double *want = calloc((size_t)(T * width), sizeof(double));
    float *got = malloc((size_t)(T * width) * sizeof(float));
    for (int64_t t = 0; t < T; t++) {
        for (int j = 0; j < 8; j++) want[t * width + j] += tables[0][item_ids[t] * 8 + j];
        for (int f = 0; f < 2; f++) {
            int64_t n = off[f][t + 1] - off[f][t];
            for (int64_t i = off[f][t]; i < off[f][t + 1]; i++)
                for (int j = 0; j < 8; j++) {
                    double v = tables[f + 1][ids[f][i] * 8 + j];
                    want[t * width + fe[f + 1].out_col + j] += f == 1 ? v / (double)n : v;
                }
        }
        memcpy(got + t * width, out + t * ldo, (size_t)width * sizeof(float));
        for (int j = width; j < ldo; j++) assert_true(isnan(out[t * ldo + j]));
    }
    assert_rel_err_below(got, want, (size_t)(T * width), TOL);
    for (int t = 0; t < 3; t++) free(tables[t]);
    for (int f = 0; f < 2; f++) {
        free(off[f]);
        free(ids[f]);
    }
    free(item_ids);
    free(out);
    free(want);
    free(got);
}

static void test_embedding_bag_sum_combine(void **state)
{
    for (int rep = 0; rep < 20; rep++) check_embedding(false);
}

static void test_embedding_bag_concat(void **state)
{
    for (int rep = 0; rep < 20; rep++) check_embedding(true);
}

static void test_embedding_empty_bag_is_zero(void **state)
{
    float table[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t off[3] = {0, 0, 0}, ids[1] = {0};
    for (int pool = 0; pool < 2; pool++) {
        fl_emb_feature fe = {.table = table, .rows = 2, .dim = 4, .pooling = (fl_pooling_kind)pool, .offsets = off, .ids = ids};
        float out[8];
        tu_poison(out, 8);
        fl_cpu_embedding_bag(&fe, 1, 2, out, 4, 4);
        for (int i = 0; i < 8; i++) assert_true(out[i] == 0.0f);
    }
}

/* ---- embedding bag over int8 tables (row-wise scale and bias), mixed with float tables */

/* A random int8 table with per-row (scale, bias): scales of either sign and up to 0.05,
 * biases in [-1, 1), one row in eight constant (scale 0). */
static int8_t *rand_q8(int64_t rows, int32_t dim, float **qparams)
{
    int8_t *q = malloc((size_t)(rows * dim) + 1);
    for (int64_t i = 0; i < rows * dim; i++) q[i] = (int8_t)(tu_below(256) - 128);
    *qparams = malloc((size_t)rows * 2 * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        (*qparams)[2 * r] = tu_below(8) == 0 ? 0.0f : 0.05f * tu_uniform();
        (*qparams)[2 * r + 1] = tu_uniform();
    }
    return q;
}

/* value of row r, column j of an int8 table, in float64 from the stored scale and bias */
static double deq(const int8_t *q, const float *qp, int32_t dim, int64_t r, int32_t j)
{
    return (double)qp[2 * r] * q[r * dim + j] + (double)qp[2 * r + 1];
}

static void check_embedding_q8(bool concat)
{
    enum { F = 4 };
    /* sum: one dim; concat: dims of 16-, 8-, 4-multiples and odd ones */
    const int32_t sum_dim = 1 + (int32_t)tu_below(40);
    int32_t dims[F];
    for (int f = 0; f < F; f++) dims[f] = concat ? 1 + (int32_t)tu_below(40) : sum_dim;
    const int64_t rows[F] = {1 + tu_below(300), 1 + tu_below(10), 1 + tu_below(60), 1 + tu_below(60)};
    /* feature 0: the item id (int8); 1: int8 bags, sum; 2: int8 bags, mean; 3: a float table, mean */
    const fl_pooling_kind pool[F] = {FL_KPOOL_SUM, FL_KPOOL_SUM, FL_KPOOL_MEAN, FL_KPOOL_MEAN};
    const int64_t T = 1 + tu_below(40);
    int8_t *q[F] = {0};
    float *qp[F] = {0}, *ftab = randf((size_t)(rows[3] * dims[3]));
    for (int f = 0; f < 3; f++) q[f] = rand_q8(rows[f], dims[f], &qp[f]);
    int64_t *item_ids = malloc((size_t)T * sizeof(int64_t)), *off[F] = {0}, *ids[F] = {0};
    for (int64_t t = 0; t < T; t++) item_ids[t] = tu_below(rows[0]);
    for (int f = 1; f < F; f++) { /* bags of 0..5 ids, empty ones included */
        off[f] = malloc((size_t)(T + 1) * sizeof(int64_t));
        ids[f] = malloc((size_t)(5 * T + 1) * sizeof(int64_t));
        off[f][0] = 0;
        for (int64_t t = 0; t < T; t++) {
            int64_t n = tu_below(6);
            for (int64_t i = 0; i < n; i++) ids[f][off[f][t] + i] = tu_below(rows[f]);
            off[f][t + 1] = off[f][t] + n;
        }
    }
    fl_emb_feature fe[F];
    int32_t width = 0;
    for (int f = 0; f < F; f++) {
        fe[f] = (fl_emb_feature){.table = f == 3 ? ftab : NULL, .rows = rows[f], .dim = dims[f], .pooling = pool[f],
                                 .offsets = f ? off[f] : NULL, .ids = f ? ids[f] : item_ids,
                                 .out_col = concat ? width : 0, .table_q8 = q[f], .qparams = qp[f]};
        width = concat ? width + dims[f] : sum_dim;
    }
    const int64_t ldo = width + 3; /* a strided output must leave the gap alone */
    float *out = malloc((size_t)(T * ldo) * sizeof(float));
    tu_poison(out, (size_t)(T * ldo));
    fl_cpu_embedding_bag(fe, F, T, out, ldo, width);
    double *want = calloc((size_t)(T * width), sizeof(double));
    float *got = malloc((size_t)(T * width) * sizeof(float));
    for (int64_t t = 0; t < T; t++) {
        for (int32_t j = 0; j < dims[0]; j++) want[t * width + j] += deq(q[0], qp[0], dims[0], item_ids[t], j);
        for (int f = 1; f < F; f++) {
            const int64_t n = off[f][t + 1] - off[f][t];
            for (int64_t i = off[f][t]; i < off[f][t + 1]; i++)
                for (int32_t j = 0; j < dims[f]; j++) {
                    double v = f == 3 ? (double)ftab[ids[f][i] * dims[f] + j] : deq(q[f], qp[f], dims[f], ids[f][i], j);
                    want[t * width + fe[f].out_col + j] += pool[f] == FL_KPOOL_MEAN ? v / (double)n : v;
                }
        }
        memcpy(got + t * width, out + t * ldo, (size_t)width * sizeof(float));
        for (int64_t j = width; j < ldo; j++) assert_true(isnan(out[t * ldo + j]));
    }
    assert_rel_err_below(got, want, (size_t)(T * width), TOL);
    for (int f = 0; f < F; f++) {
        free(q[f]);
        free(qp[f]);
        free(off[f]);
        free(ids[f]);
    }
    free(ftab);
    free(item_ids);
    free(out);
    free(want);
    free(got);
}

static void test_embedding_bag_q8_sum_combine(void **state)
{
    for (int rep = 0; rep < 30; rep++) check_embedding_q8(false);
}

static void test_embedding_bag_q8_concat(void **state)
{
    for (int rep = 0; rep < 30; rep++) check_embedding_q8(true);
}

/* An int8 row is the same float32 value a table dequantized once to F32 holds, so the two
 * kernels give the same bits; and an empty bag is zeros, never the row's bias. */
static void test_embedding_q8_matches_dequantized_table_and_empty_bags(void **state)
{
    const int64_t rows = 37, T = 25;
    const int32_t dim = 1 + (int32_t)tu_below(70);
    float *qp;
    int8_t *q = rand_q8(rows, dim, &qp);
    float *deqf = malloc((size_t)(rows * dim) * sizeof(float));
    for (int64_t r = 0; r < rows; r++)
        for (int32_t j = 0; j < dim; j++) deqf[r * dim + j] = qp[2 * r] * (float)q[r * dim + j] + qp[2 * r + 1];
    int64_t off[T + 1], ids[4 * T];
    off[0] = 0;
    for (int64_t t = 0; t < T; t++) {
        int64_t n = t % 5 == 0 ? 0 : 1 + tu_below(4);
        for (int64_t i = 0; i < n; i++) ids[off[t] + i] = tu_below(rows);
        off[t + 1] = off[t] + n;
    }
    for (int pool = 0; pool < 2; pool++) {
        fl_emb_feature a = {.rows = rows, .dim = dim, .pooling = (fl_pooling_kind)pool, .offsets = off, .ids = ids,
                            .table_q8 = q, .qparams = qp};
        fl_emb_feature b = {.table = deqf, .rows = rows, .dim = dim, .pooling = (fl_pooling_kind)pool, .offsets = off,
                            .ids = ids};
        float *oa = malloc((size_t)(T * dim) * sizeof(float)), *ob = malloc((size_t)(T * dim) * sizeof(float));
        tu_poison(oa, (size_t)(T * dim));
        tu_poison(ob, (size_t)(T * dim));
        fl_cpu_embedding_bag(&a, 1, T, oa, dim, dim);
        fl_cpu_embedding_bag(&b, 1, T, ob, dim, dim);
        assert_memory_equal(oa, ob, (size_t)(T * dim) * sizeof(float));
        for (int64_t t = 0; t < T; t += 5)
            for (int32_t j = 0; j < dim; j++) assert_true(oa[t * dim + j] == 0.0f);
        free(oa);
        free(ob);
    }
    free(q);
    free(qp);
    free(deqf);
}

/* ---- fp16 and bf16 rows and outputs (src/cpu/half.c) */

/* The instruction sets this CPU runs, base first. */
static int half_isas(fl_cpu_isa *list)
{
    int n = 0;
    for (int i = FL_ISA_BASE; i <= (int)fl_cpu_isa_detect(); i++) list[n++] = (fl_cpu_isa)i;
    return n;
}

/* A random pattern of a finite value: any sign, mantissa and (fp16) exponent, zeros and
 * subnormals included; a bf16 exponent below 2^40, so that pooled sums stay finite. */
static uint16_t rand_half(bool bf16)
{
    for (;;) {
        const uint16_t h = (uint16_t)tu_below(65536);
        const double v = tuh_value(bf16, h);
        if (isfinite(v) && fabs(v) < 0x1p40) return h;
    }
}

/* dst += w * row on every isa, each value against dst + w * value in float32 (the widening is
 * exact, one product and one sum): the same bits, whatever the length (vector tails). */
static void test_add_row_half_every_isa(void **state)
{
    fl_cpu_isa list[3];
    const int nisa = half_isas(list);
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int32_t n = 0; n <= 70; n++) {
            uint16_t src[72];
            float dst0[72], dst[72], want[72];
            for (int32_t j = 0; j < n + 2; j++) src[j] = rand_half(bf16), dst0[j] = tu_uniform();
            const uint32_t snan = 0x7f800001u; /* past the end: any arithmetic on it would make it quiet */
            memcpy(&dst0[n], &snan, sizeof snan);
            memcpy(&dst0[n + 1], &snan, sizeof snan);
            const float w = tu_uniform() * 4.0f;
            for (int32_t j = 0; j < n + 2; j++) {
                const float p = w * (float)tuh_value(bf16, src[j]);
                want[j] = j < n ? dst0[j] + p : dst0[j];
            }
            for (int i = 0; i < nisa; i++) {
                memcpy(dst, dst0, sizeof dst);
                fl_cpu_add_row_half_isa(list[i], dst, src, n, w, bf16 ? FL_HALF_BF16 : FL_HALF_F16);
                if (memcmp(dst, want, (size_t)(n + 2) * sizeof(float)))
                    fail_msg("%s row of %d on %s: not dst + w * value (or past its end)", bf16 ? "bf16" : "fp16", n,
                             fl_cpu_isa_name(list[i]));
            }
        }
}

/* fp16/bf16 tables pooled by the embedding kernel give the bits of the same tables widened to
 * float32 first: sum and mean, one id per token and bags (empty ones too), concat and sum combine. */
static void test_embedding_half_tables_match_float32_copies(void **state)
{
    enum { F = 3 };
    for (int rep = 0; rep < 40; rep++) {
        const bool concat = rep % 2, bf16 = rep % 4 >= 2;
        const int64_t T = 1 + tu_below(30), rows = 1 + tu_below(50);
        const int32_t sum_dim = 1 + (int32_t)tu_below(70);
        int32_t dims[F], width = 0;
        uint16_t *h[F];
        float *f32[F];
        int64_t *off[F], *ids[F];
        fl_emb_feature a[F], b[F];
        for (int f = 0; f < F; f++) {
            dims[f] = concat ? 1 + (int32_t)tu_below(70) : sum_dim;
            const size_t n = (size_t)(rows * dims[f]);
            h[f] = malloc(n * sizeof(uint16_t));
            f32[f] = malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) f32[f][i] = (float)tuh_value(bf16, h[f][i] = rand_half(bf16));
            off[f] = f ? malloc((size_t)(T + 1) * sizeof(int64_t)) : NULL;
            ids[f] = malloc((size_t)(6 * T + 1) * sizeof(int64_t));
            if (f) {
                off[f][0] = 0;
                for (int64_t t = 0; t < T; t++) off[f][t + 1] = off[f][t] + tu_below(6);
            }
            for (int64_t i = 0; i < (f ? off[f][T] : T); i++) ids[f][i] = tu_below(rows);
            const fl_pooling_kind pool = f == 2 ? FL_KPOOL_MEAN : FL_KPOOL_SUM;
            a[f] = (fl_emb_feature){.rows = rows, .dim = dims[f], .pooling = pool, .offsets = off[f], .ids = ids[f],
                                    .out_col = concat ? width : 0, .table_h16 = h[f],
                                    .h16_kind = bf16 ? FL_HALF_BF16 : FL_HALF_F16};
            b[f] = (fl_emb_feature){.table = f32[f], .rows = rows, .dim = dims[f], .pooling = pool, .offsets = off[f],
                                    .ids = ids[f], .out_col = concat ? width : 0};
            width = concat ? width + dims[f] : sum_dim;
        }
        float *oa = malloc((size_t)(T * width) * sizeof(float)), *ob = malloc((size_t)(T * width) * sizeof(float));
        tu_poison(oa, (size_t)(T * width));
        tu_poison(ob, (size_t)(T * width));
        fl_cpu_embedding_bag(a, F, T, oa, width, width);
        fl_cpu_embedding_bag(b, F, T, ob, width, width);
        for (int64_t i = 0; i < T * width; i++) assert_false(isnan(oa[i]));
        assert_memory_equal(oa, ob, (size_t)(T * width) * sizeof(float));
        for (int f = 0; f < F; f++) {
            free(h[f]);
            free(f32[f]);
            free(off[f]);
            free(ids[f]);
        }
        free(oa);
        free(ob);
    }
}

static unsigned f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* Appends x, then the float32 values either side of it. */
static size_t add_around(float *v, size_t n, float x)
{
    v[n++] = x;
    v[n++] = nextafterf(x, INFINITY);
    v[n++] = nextafterf(x, -INFINITY);
    return n;
}

/* Rounding to fp16/bf16 on every isa against the correctly rounded pattern of each value
 * (tu_half.h's search): every value of the format and of both signs, the midpoints between
 * neighbours (ties) and the float32 values either side of them, overflow thresholds,
 * infinities, NaNs and float32 subnormals, and random float32 patterns of every class; the
 * lengths 0..40 at odd offsets for the vector tails. A NaN stays a quiet NaN of its sign. */
static void test_round_half_every_isa(void **state)
{
    fl_cpu_isa list[3];
    const int nisa = half_isas(list);
    const size_t cap = (size_t)1 << 21;
    float *v = malloc(cap * sizeof(float));
    uint16_t *got = malloc(cap * sizeof(uint16_t)), *first = malloc(cap * sizeof(uint16_t));
    for (int bf16 = 0; bf16 < 2; bf16++) {
        const uint32_t inf = bf16 ? 0x7f80u : 0x7c00u;
        size_t n = 0;
        for (uint32_t k = 0; k < inf; k++)
            for (int sign = 0; sign < 2; sign++) {
                const double lo = tuh_value(bf16, (uint16_t)k);
                const double hi = k + 1 == inf ? (bf16 ? ldexp(1.0, 128) : 65536.0) : tuh_value(bf16, (uint16_t)(k + 1));
                const float s = sign ? -1.0f : 1.0f;
                v[n++] = s * (float)lo;
                n = add_around(v, n, s * (float)((lo + hi) / 2)); /* exact in float32 */
            }
        static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                           0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fffffffu,
                                           0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu, 0x477ff000u,
                                           0x477fefffu, 0x33000000u, 0x33000001u, 0x7f7f8000u, 0x7f7f7fffu};
        for (size_t i = 0; i < sizeof special / sizeof *special; i++) {
            float x;
            memcpy(&x, &special[i], sizeof x);
            v[n++] = x;
        }
        while (n < cap) {
            const uint32_t u = (uint32_t)tu_u64();
            memcpy(&v[n++], &u, sizeof(float));
        }
        const fl_half_kind kind = bf16 ? FL_HALF_BF16 : FL_HALF_F16;
        for (int i = 0; i < nisa; i++) {
            memset(got, 0xa5, cap * sizeof(uint16_t));
            fl_cpu_round_half_isa(list[i], got, v, (int64_t)n, kind);
            for (size_t j = 0; j < n; j++) {
                const uint16_t want = tuh_nearest(bf16, v[j]);
                if (tuh_is_nan(bf16, want) ? !tuh_is_nan(bf16, got[j]) || (got[j] ^ want) & (0x8000u | (bf16 ? 0x40u : 0x200u))
                                           : got[j] != want)
                    fail_msg("%s on %s: %.9g (float32 %08x) gave %04x, correctly rounded %04x", bf16 ? "bf16" : "fp16",
                             fl_cpu_isa_name(list[i]), (double)v[j], f32_bits(v[j]),
                             got[j], want);
            }
            if (i == 0)
                memcpy(first, got, n * sizeof(uint16_t));
            else if (memcmp(first, got, n * sizeof(uint16_t)))
                fail_msg("%s on %s: not the bits of the base code (NaN payloads included)", bf16 ? "bf16" : "fp16",
                         fl_cpu_isa_name(list[i]));
            for (int64_t len = 0; len <= 40; len++) {
                const size_t at = (size_t)tu_below((int64_t)(n - 64)) | 1u;
                uint16_t out[42];
                memset(out, 0xa5, sizeof out);
                fl_cpu_round_half_isa(list[i], out + 1, v + at, len, kind);
                assert_true(out[0] == 0xa5a5u && out[len + 1] == 0xa5a5u); /* nothing written around it */
                assert_memory_equal(out + 1, first + at, (size_t)len * sizeof(uint16_t));
            }
        }
    }
    free(v);
    free(got);
    free(first);
}

/* ---- LayerNorm */

static void test_layernorm(void **state)
{
    for (int rep = 0; rep < 30; rep++) {
        int64_t rows = 1 + tu_below(20);
        int32_t d = 1 + (int32_t)tu_below(300);
        bool inside = rep & 1, with_res = rep & 2, in_place = rep & 4;
        float eps = inside ? 1e-12f : 1e-5f;
        float *x = randf((size_t)(rows * d)), *r = randf((size_t)(rows * d)), *w = randf((size_t)d), *b = randf((size_t)d);
        for (int64_t i = 0; i < rows * d; i++) x[i] = x[i] * 3.0f + 0.5f; /* non-zero mean */
        double *want = malloc((size_t)(rows * d) * sizeof(double));
        for (int64_t i = 0; i < rows; i++) {
            double mean = 0, var = 0;
            for (int j = 0; j < d; j++) mean += (double)x[i * d + j] + (with_res ? r[i * d + j] : 0.0);
            mean /= d;
            for (int j = 0; j < d; j++) {
                double z = (double)x[i * d + j] + (with_res ? r[i * d + j] : 0.0) - mean;
                var += z * z;
            }
            var /= d;
            double den = inside ? sqrt(var + eps) : sqrt(var) + eps;
            for (int j = 0; j < d; j++) {
                double z = (double)x[i * d + j] + (with_res ? r[i * d + j] : 0.0);
                want[i * d + j] = (z - mean) / den * w[j] + b[j];
            }
        }
        float *out = in_place ? x : malloc((size_t)(rows * d) * sizeof(float));
        if (!in_place) tu_poison(out, (size_t)(rows * d));
        fl_cpu_layernorm(rows, d, x, d, with_res ? r : NULL, d, w, b, eps, inside, out, d);
        assert_rel_err_below(out, want, (size_t)(rows * d), TOL);
        if (!in_place) free(out);
        free(x);
        free(r);
        free(w);
        free(b);
        free(want);
    }
}

/* ---- linear + activations */

static double act_ref(double v, fl_act_kind a)
{
    switch (a) {
    case FL_KACT_RELU: return v > 0 ? v : 0;
    case FL_KACT_GELU_ERF: return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
    case FL_KACT_GELU_TANH: return 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    default: return v;
    }
}

static void test_linear(void **state)
{
    for (int rep = 0; rep < 40; rep++) {
        int64_t rows = 1 + tu_below(30);
        int32_t in = 1 + (int32_t)tu_below(200), out = 8 + (int32_t)tu_below(200);
        fl_act_kind act = (fl_act_kind)(rep % 4);
        float beta = (rep / 4) % 2 && act == FL_KACT_NONE ? 1.0f : 0.0f;
        float *x = randf((size_t)(rows * in)), *w = randf((size_t)out * in), *b = randf((size_t)out);
        float *y = randf((size_t)(rows * out));
        double *want = malloc((size_t)(rows * out) * sizeof(double));
        for (int64_t i = 0; i < rows; i++)
            for (int32_t o = 0; o < out; o++) {
                double s = b[o] + beta * (double)y[i * out + o];
                for (int32_t k = 0; k < in; k++) s += (double)x[i * in + k] * w[(int64_t)o * in + k];
                want[i * out + o] = act_ref(s, act);
            }
        if (beta == 0.0f) tu_poison(y, (size_t)(rows * out));
        fl_cpu_linear(rows, in, out, x, in, w, b, beta, act, y, out);
        assert_rel_err_below(y, want, (size_t)(rows * out), TOL);
        free(x);
        free(w);
        free(b);
        free(y);
        free(want);
    }
}

static void test_sigmoid_extremes(void **state)
{
    float x[6] = {-1000.0f, -20.0f, 0.0f, 3.0f, 20.0f, 1000.0f};
    double want[6];
    for (int i = 0; i < 6; i++) want[i] = 1.0 / (1.0 + exp(-(double)x[i]));
    fl_cpu_sigmoid(x, 6, 1);
    for (int i = 0; i < 6; i++) {
        assert_false(isnan(x[i]));
        assert_true(fabs(x[i] - want[i]) <= 1e-7 * fmax(1e-30, fabs(want[i])) + 1e-38);
    }
}

/* Each dot product against the float64 one within the float32 rounding bound of any
 * summation order (Higham, Accuracy and Stability of Numerical Algorithms, 3.1: |error| <=
 * gamma_n * sum_j |a_j b_j|, gamma_n = n u / (1 - n u), u = 2^-24), with n = d + 16 for the
 * lanes' tree: a near-cancelling product (a small result of large terms) is judged by its
 * terms, not by its size, and a wrong row or a dropped term is far outside. */
static void assert_dots_within_bound(const float *got, int64_t stride, const double *want, const double *abs_terms,
                                     int64_t n, int32_t d)
{
    const double u = 1.0 / 16777216.0, nu = (double)(d + 16) * u, gamma = nu / (1.0 - nu);
    for (int64_t i = 0; i < n; i++) {
        const double g = got[i * stride], err = fabs(g - want[i]), bound = gamma * abs_terms[i] + 1e-30;
        if (!(err <= bound))
            fail_msg("dot %lld of %lld (d %d): %.9g, float64 %.9g: error %.3g above the bound %.3g", (long long)i,
                     (long long)n, d, g, want[i], err, bound);
    }
}

static void test_dot_gather(void **state)
{
    for (int rep = 0; rep < 20; rep++) {
        int32_t d = 1 + (int32_t)tu_below(130);
        int64_t rows = 1 + tu_below(100), n = 16 + tu_below(60);
        float *h = randf((size_t)d), *table = randf((size_t)(rows * d));
        int64_t *ids = malloc((size_t)(n + 1) * sizeof(int64_t));
        for (int64_t i = 0; i < n; i++) ids[i] = tu_below(rows);
        float *out = malloc((size_t)(2 * n + 1) * sizeof(float));
        tu_poison(out, (size_t)(2 * n + 1));
        double *want = malloc((size_t)(n + 1) * sizeof(double)), *absw = malloc((size_t)(n + 1) * sizeof(double));
        float *got = malloc((size_t)(n + 1) * sizeof(float));
        for (int64_t i = 0; i < n; i++) {
            double s = 0, a = 0;
            for (int32_t j = 0; j < d; j++) {
                s += (double)h[j] * table[ids[i] * d + j];
                a += fabs((double)h[j] * table[ids[i] * d + j]);
            }
            want[i] = s;
            absw[i] = a;
        }
        fl_cpu_dot_rows(h, d, table, ids, 0, n, out, 2);
        for (int64_t i = 0; i < n; i++) got[i] = out[2 * i];
        assert_dots_within_bound(got, 1, want, absw, n, d);
        /* the contiguous form: rows first .. first + m - 1 */
        int64_t first = tu_below(rows), m = rows - first < n ? rows - first : n;
        for (int64_t i = 0; i < m; i++) {
            double sum = 0, a = 0;
            for (int32_t j = 0; j < d; j++) {
                sum += (double)h[j] * table[(first + i) * d + j];
                a += fabs((double)h[j] * table[(first + i) * d + j]);
            }
            want[i] = sum;
            absw[i] = a;
        }
        tu_poison(got, (size_t)n + 1);
        fl_cpu_dot_rows(h, d, table, NULL, first, m, got, 1);
        assert_dots_within_bound(got, 1, want, absw, m, d);
        for (int64_t i = 0; i < m; i++) assert_false(isnan(got[i]));
        free(h);
        free(table);
        free(ids);
        free(out);
        free(want);
        free(absw);
        free(got);
    }
}

/* The int8 dot head: scale * <h, q> + bias * sum(h) against float64 <h, scale * q + bias>,
 * gathered and contiguous rows; split over 2 threads it gives the same bits as over 1. */
static void test_dot_rows_q8(void **state)
{
    for (int rep = 0; rep < 20; rep++) {
        /* the first two: over 2 x 256 KiB of int8 rows, so 2 threads split them */
        const int32_t d = rep < 2 ? 64 + (int32_t)tu_below(67) : 1 + (int32_t)tu_below(130);
        const int64_t rows = rep < 2 ? 9000 + tu_below(3000) : 1 + tu_below(100);
        const int64_t n = rep < 2 ? 9000 + tu_below(1000) : 16 + tu_below(60);
        float *qp, *h = randf((size_t)d);
        int8_t *q = rand_q8(rows, d, &qp);
        int64_t *ids = malloc((size_t)n * sizeof(int64_t));
        for (int64_t i = 0; i < n; i++) ids[i] = tu_below(rows);
        float *got = malloc((size_t)(2 * n + 1) * sizeof(float)), *got2 = malloc((size_t)(2 * n + 1) * sizeof(float));
        double *want = malloc((size_t)n * sizeof(double)), *absw = malloc((size_t)n * sizeof(double));
        for (int pass = 0; pass < 2; pass++) { /* gathered ids, then the contiguous range first.. */
            const int64_t first = pass ? tu_below(rows) : 0, m = pass ? (rows - first < n ? rows - first : n) : n;
            for (int64_t i = 0; i < m; i++) {
                const int64_t r = pass ? first + i : ids[i];
                double s = 0, hq = 0, hs = 0; /* the kernel's terms: scale * <h, q> + bias * sum(h) */
                for (int32_t j = 0; j < d; j++) {
                    s += (double)h[j] * deq(q, qp, d, r, j);
                    hq += fabs((double)h[j] * q[r * d + j]);
                    hs += fabs((double)h[j]);
                }
                want[i] = s;
                absw[i] = fabs((double)qp[2 * r]) * hq + fabs((double)qp[2 * r + 1]) * hs;
            }
            tu_poison(got, (size_t)(2 * n + 1));
            tu_poison(got2, (size_t)(2 * n + 1));
            fl_cpu_dot_rows_q8_mt(h, d, q, qp, pass ? NULL : ids, first, m, got, 2, 1);
            fl_cpu_dot_rows_q8_mt(h, d, q, qp, pass ? NULL : ids, first, m, got2, 2, 2);
            float *flat = malloc((size_t)(m + 1) * sizeof(float));
            for (int64_t i = 0; i < m; i++) {
                flat[i] = got[2 * i];
                assert_true(isnan(got[2 * i + 1])); /* the stride's gap is left alone */
                assert_true(memcmp(&got[2 * i], &got2[2 * i], sizeof(float)) == 0);
            }
            assert_dots_within_bound(flat, 1, want, absw, m, d);
            for (int64_t i = 0; i < m; i++) assert_false(isnan(flat[i]));
            free(flat);
        }
        free(h);
        free(q);
        free(qp);
        free(ids);
        free(got);
        free(got2);
        free(want);
        free(absw);
    }
}

/* ---- e^x of the attention softmax (cpu/expf.h) */

static float float_of_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Every 127th float32 of [-104, 89] (every exponent, mantissas spread) plus fresh random
 * arguments: relative error < 2e-7 wherever e^x is a normal float, within one subnormal step
 * (2^-149) below FLT_MIN; exact at the ends. */
static void test_expf_accuracy(void **state)
{
    double worst = 0.0, worst_x = 0.0;
    uint32_t n = 0;
    for (int sign = 0; sign < 2; sign++)
        for (uint32_t b = 0; b <= 0x42d00000u; b += 127) { /* |x| from 0 to 104 */
            const float x = sign ? -float_of_bits(b) : float_of_bits(b);
            if (x > 89.0f || x < -104.0f) continue;
            const double want = exp((double)x);
            const float got = fl_cpu_expf(x);
            n++;
            if (want > FLT_MAX) {
                if (!(isinf(got) && got > 0)) fail_msg("expf(%.9g) = %.9g, want +inf", x, got);
            } else if (want >= FLT_MIN) {
                const double rel = fabs((double)got - want) / want;
                if (rel > worst) worst = rel, worst_x = x;
            } else if (!(fabs((double)got - want) <= 0x1p-149)) {
                fail_msg("expf(%.9g) = %.9g, want %.9g (subnormal)", x, got, want);
            }
        }
    for (int i = 0; i < 1000000; i++) {
        const float x = -87.0f * (tu_uniform() + 1.0f) * 0.5f; /* the softmax's arguments: x <= 0 */
        const double want = exp((double)x), rel = fabs((double)fl_cpu_expf(x) - want) / want;
        if (rel > worst) worst = rel, worst_x = x;
    }
    print_message("expf: %u grid points, worst relative error %.3g at x = %.9g\n", n, worst, worst_x);
    if (!(worst < 2e-7)) fail_msg("expf relative error %.3g at x = %.9g", worst, worst_x);
    assert_true(fl_cpu_expf(0.0f) == 1.0f);
    assert_true(fl_cpu_expf(-0.0f) == 1.0f);
    assert_true(fl_cpu_expf(-INFINITY) == 0.0f);
    assert_true(fl_cpu_expf(-104.0f) == 0.0f);
    assert_true(fl_cpu_expf(-1000.0f) == 0.0f);
    assert_true(fl_cpu_expf(-FLT_MAX) == 0.0f);
    assert_true(fl_cpu_expf(88.7228f) < INFINITY); /* just below ln(FLT_MAX) */
    assert_true(isinf(fl_cpu_expf(88.73f)) && fl_cpu_expf(88.73f) > 0);
    assert_true(isinf(fl_cpu_expf(INFINITY)) && fl_cpu_expf(INFINITY) > 0);
    assert_true(isinf(fl_cpu_expf(FLT_MAX)));
    assert_true(isnan(fl_cpu_expf(NAN)));
    assert_true(fl_cpu_expf(-103.0f) > 0.0f); /* subnormal, not flushed */
}

/* ---- SUMI attention */

/* Plain reference: explicit visibility test per (query, key), softmax in double. */
static void attention_ref(int64_t nh, int64_t nc, int32_t H, int32_t dh, const float *q, const int32_t *qpos,
                          int64_t nq, const float *k, const float *v, const uint8_t *valid, double *out)
{
    int64_t T = nh + nc, d = (int64_t)H * dh;
    double *p = malloc((size_t)T * sizeof(double));
    for (int64_t i = 0; i < nq; i++) {
        int64_t pos = qpos ? qpos[i] : i;
        for (int32_t h = 0; h < H; h++) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < T; j++) {
                bool vis = pos < nh ? j <= pos : (j < nh || j == pos);
                vis = vis && (!valid || valid[j]);
                p[j] = -INFINITY;
                if (!vis) continue;
                double s = 0;
                for (int32_t e = 0; e < dh; e++) s += (double)q[i * d + h * dh + e] * k[j * d + h * dh + e];
                p[j] = s / sqrt((double)dh);
                if (p[j] > mx) mx = p[j];
            }
            double sum = 0;
            for (int64_t j = 0; j < T; j++) sum += p[j] == -INFINITY ? 0 : exp(p[j] - mx);
            for (int32_t e = 0; e < dh; e++) {
                double acc = 0;
                for (int64_t j = 0; j < T; j++)
                    if (p[j] != -INFINITY) acc += exp(p[j] - mx) / sum * v[j * d + h * dh + e];
                out[i * d + h * dh + e] = acc; /* no visible key: 0 */
            }
        }
    }
    free(p);
}

static void check_attention(int64_t nh, int64_t nc, int32_t H, int32_t dh, bool subset, bool masked)
{
    int64_t T = nh + nc, d = (int64_t)H * dh;
    float *k = randf((size_t)(T * d)), *v = randf((size_t)(T * d));
    for (int64_t i = 0; i < T * d; i++) k[i] *= 3.0f; /* peaky softmax */
    int32_t *qpos = malloc((size_t)(T + 1) * sizeof(int32_t));
    int64_t nq = 0;
    for (int64_t p = 0; p < T; p++)
        if (!subset || tu_below(2)) qpos[nq++] = (int32_t)p;
    float *q = randf((size_t)((nq + 1) * d));
    uint8_t *valid = NULL;
    if (masked) {
        valid = malloc((size_t)T);
        for (int64_t j = 0; j < T; j++) valid[j] = tu_below(4) != 0;
        if (T) valid[0] = 0; /* query 0 then sees nothing: its row must be zeros */
    }
    float *out = malloc((size_t)((nq + 1) * d) * sizeof(float));
    tu_poison(out, (size_t)((nq + 1) * d));
    float *scratch = malloc(fl_cpu_attention_scratch(nh, dh) * sizeof(float));
    fl_cpu_attention_sumi(nh, nc, H, dh, q, d, subset ? qpos : NULL, nq, k, v, d, valid, out, d, scratch);
    double *want = malloc((size_t)((nq + 1) * d) * sizeof(double));
    attention_ref(nh, nc, H, dh, q, subset ? qpos : NULL, nq, k, v, valid, want);
    if (nq) assert_rel_err_below(out, want, (size_t)(nq * d), TOL);
    if (masked && nq && qpos[0] == 0 && nh > 0)
        for (int64_t e = 0; e < d; e++) assert_true(out[e] == 0.0f);
    free(k);
    free(v);
    free(q);
    free(qpos);
    free(valid);
    free(out);
    free(scratch);
    free(want);
}

static void test_attention_causal_history_only(void **state)
{
    for (int rep = 0; rep < 10; rep++) check_attention(1 + tu_below(100), 0, 1 + (int32_t)tu_below(4), 8 << tu_below(3), false, false);
}

static void test_attention_sumi(void **state)
{
    for (int rep = 0; rep < 10; rep++)
        check_attention(tu_below(150), 1 + tu_below(70), 1 + (int32_t)tu_below(4), 8 << tu_below(3), false, false);
}

static void test_attention_query_subset(void **state)
{
    for (int rep = 0; rep < 10; rep++)
        check_attention(tu_below(150), tu_below(70) + 1, 2, 16, true, false);
}

static void test_attention_padding_mask_and_empty_rows(void **state)
{
    for (int rep = 0; rep < 10; rep++) check_attention(1 + tu_below(100), tu_below(30), 2, 8, rep & 1, true);
    /* every key masked: every row is zeros, never NaN */
    int64_t T = 6, d = 8;
    float *k = randf(T * d), *v = randf(T * d), *q = randf(T * d), out[48];
    float *scratch = malloc(fl_cpu_attention_scratch(4, 8) * sizeof(float));
    uint8_t none[6] = {0};
    tu_poison(out, 48);
    fl_cpu_attention_sumi(4, 2, 1, 8, q, d, NULL, T, k, v, d, none, out, d, scratch);
    for (int i = 0; i < 48; i++) assert_true(out[i] == 0.0f);
    free(scratch);
    free(k);
    free(v);
    free(q);
}

/* Query positions of a call: all (qpos NULL), a random subset mixing history and candidate
 * rows, the candidates only (a KV-cache hit), or every row at the last position (the
 * NONE-mask caller, where a query sees every key). */
typedef enum { QP_ALL, QP_SUBSET, QP_CANDS, QP_LAST } qpos_kind;

/* The blocked kernel's edges (blocks of 16 query rows, 8 keys and 8 columns at a time) against
 * the float64 reference with an explicit visibility test. Rows are strided with gaps that must
 * stay untouched; a row that sees no key must be exactly zero. mask_every: 0 no key_valid, 1
 * every key masked, n a key masked with probability 1/n. */
static void check_attention_edges(int64_t nh, int64_t nc, int32_t H, int32_t dh, qpos_kind kind, int mask_every)
{
    const int64_t T = nh + nc, d = (int64_t)H * dh, ldq = d + 5, ldkv = d + 2, ldo = d + 3;
    float *k = randf((size_t)(T * ldkv + 1)), *v = randf((size_t)(T * ldkv + 1));
    for (int64_t i = 0; i < T * ldkv; i++) k[i] *= 3.0f; /* peaky softmax */
    int32_t *qpos = malloc((size_t)(T + 1) * sizeof(int32_t));
    int64_t nq = 0;
    for (int64_t p = 0; p < T; p++) {
        if (kind == QP_SUBSET && tu_below(3) == 0) continue;
        if (kind == QP_CANDS && p < nh) continue;
        qpos[nq++] = (int32_t)(kind == QP_LAST ? T - 1 : p);
    }
    uint8_t *valid = NULL;
    if (mask_every) {
        valid = malloc((size_t)T + 1);
        for (int64_t j = 0; j < T; j++) valid[j] = tu_below(mask_every) != 0;
    }
    float *q = randf((size_t)(nq * ldq + 1)), *out = malloc((size_t)(nq * ldo + 1) * sizeof(float));
    const size_t ns = fl_cpu_attention_scratch(nh, dh);
    float *scratch = malloc(ns * sizeof(float));
    tu_poison(out, (size_t)(nq * ldo + 1));
    tu_poison(scratch, ns);
    fl_cpu_attention_sumi(nh, nc, H, dh, q, ldq, kind == QP_ALL ? NULL : qpos, nq, k, v, ldkv, valid, out, ldo,
                          scratch);

    /* dense copies for the reference */
    float *qd = malloc((size_t)(nq * d + 1) * sizeof(float)), *kd = malloc((size_t)(T * d + 1) * sizeof(float));
    float *vd = malloc((size_t)(T * d + 1) * sizeof(float)), *got = malloc((size_t)(nq * d + 1) * sizeof(float));
    for (int64_t i = 0; i < nq; i++)
        for (int64_t c = 0; c < d; c++) qd[i * d + c] = q[i * ldq + c], got[i * d + c] = out[i * ldo + c];
    for (int64_t j = 0; j < T; j++)
        for (int64_t c = 0; c < d; c++) kd[j * d + c] = k[j * ldkv + c], vd[j * d + c] = v[j * ldkv + c];
    double *want = malloc((size_t)(nq * d + 1) * sizeof(double));
    attention_ref(nh, nc, H, dh, qd, qpos, nq, kd, vd, valid, want);
    if (nq) assert_rel_err_below(got, want, (size_t)(nq * d), TOL);
    for (int64_t i = 0; i < nq; i++) {
        for (int64_t g = d; g < ldo; g++)
            if (!isnan(out[i * ldo + g])) fail_msg("row %lld: gap column %lld written", (long long)i, (long long)g);
        int64_t seen = 0;
        for (int64_t j = 0; j < T; j++) {
            const bool vis = qpos[i] < nh ? j <= qpos[i] : (j < nh || j == qpos[i]);
            seen += vis && (!valid || valid[j]);
        }
        for (int64_t c = 0; seen == 0 && c < d; c++)
            if (got[i * d + c] != 0.0f)
                fail_msg("row %lld (position %d) sees no key but column %lld is %g", (long long)i, qpos[i],
                         (long long)c, got[i * d + c]);
    }
    free(k);
    free(v);
    free(q);
    free(qpos);
    free(valid);
    free(out);
    free(scratch);
    free(qd);
    free(kd);
    free(vd);
    free(got);
    free(want);
}

static void test_attention_block_edges(void **state)
{
    const int32_t dhs[] = {16, 24, 64, 128, 1, 5, 37};
    const int64_t nhs[] = {0, 1, 15, 16, 17, 100};
    const int masks[] = {0, 4, 1, 2};
    int n = 0;
    for (size_t a = 0; a < sizeof dhs / sizeof dhs[0]; a++)
        for (size_t b = 0; b < sizeof nhs / sizeof nhs[0]; b++)
            for (int kind = QP_ALL; kind <= QP_LAST; kind++, n++) {
                const int64_t nc = n % 5 == 0 ? 0 : 1 + tu_below(40); /* n_cand 0 too */
                check_attention_edges(nhs[b], nc, 1 + (int32_t)(n % 2), dhs[a], (qpos_kind)kind, masks[n % 4]);
            }
}

/* A row's output is the same bits whichever rows share its block: a random subset of positions
 * against the same rows computed among all positions. */
static void test_attention_rows_independent_of_block(void **state)
{
    const int32_t dhs[] = {8, 24, 33, 64};
    for (int rep = 0; rep < 16; rep++) {
        const int64_t nh = tu_below(60), nc = 1 + tu_below(40), T = nh + nc;
        const int32_t H = 1 + (int32_t)(rep % 2), dh = dhs[rep % 4];
        const int64_t d = (int64_t)H * dh;
        float *q = randf((size_t)(T * d)), *k = randf((size_t)(T * d)), *v = randf((size_t)(T * d));
        uint8_t *valid = NULL;
        if (rep & 2) {
            valid = malloc((size_t)T);
            for (int64_t j = 0; j < T; j++) valid[j] = tu_below(3) != 0;
        }
        float *all = malloc((size_t)(T * d) * sizeof(float)), *sub = malloc((size_t)(T * d) * sizeof(float));
        float *qs = malloc((size_t)(T * d) * sizeof(float));
        int32_t *qpos = malloc((size_t)T * sizeof(int32_t));
        float *scratch = malloc(fl_cpu_attention_scratch(nh, dh) * sizeof(float));
        int64_t nq = 0;
        for (int64_t p = 0; p < T; p++)
            if (tu_below(2)) {
                memcpy(qs + nq * d, q + p * d, (size_t)d * sizeof(float));
                qpos[nq++] = (int32_t)p;
            }
        tu_poison(all, (size_t)(T * d));
        tu_poison(sub, (size_t)(T * d));
        fl_cpu_attention_sumi(nh, nc, H, dh, q, d, NULL, T, k, v, d, valid, all, d, scratch);
        fl_cpu_attention_sumi(nh, nc, H, dh, qs, d, qpos, nq, k, v, d, valid, sub, d, scratch);
        for (int64_t i = 0; i < nq; i++)
            if (memcmp(sub + i * d, all + qpos[i] * d, (size_t)d * sizeof(float)))
                fail_msg("position %d: other bits in a block of other rows (n_hist %lld, dh %d)", qpos[i],
                         (long long)nh, dh);
        free(q);
        free(k);
        free(v);
        free(valid);
        free(all);
        free(sub);
        free(qs);
        free(qpos);
        free(scratch);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_bag_sum_combine),
        cmocka_unit_test(test_embedding_bag_concat),
        cmocka_unit_test(test_embedding_empty_bag_is_zero),
        cmocka_unit_test(test_embedding_bag_q8_sum_combine),
        cmocka_unit_test(test_embedding_bag_q8_concat),
        cmocka_unit_test(test_embedding_q8_matches_dequantized_table_and_empty_bags),
        cmocka_unit_test(test_add_row_half_every_isa),
        cmocka_unit_test(test_embedding_half_tables_match_float32_copies),
        cmocka_unit_test(test_round_half_every_isa),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_sigmoid_extremes),
        cmocka_unit_test(test_dot_gather),
        cmocka_unit_test(test_dot_rows_q8),
        cmocka_unit_test(test_expf_accuracy),
        cmocka_unit_test(test_attention_causal_history_only),
        cmocka_unit_test(test_attention_sumi),
        cmocka_unit_test(test_attention_query_subset),
        cmocka_unit_test(test_attention_padding_mask_and_empty_rows),
        cmocka_unit_test(test_attention_block_edges),
        cmocka_unit_test(test_attention_rows_independent_of_block),
    };
    return cmocka_run_group_tests_name("cpu kernels", tests, setup, NULL);
}
