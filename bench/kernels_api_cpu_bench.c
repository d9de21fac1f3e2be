/* kernels-api-cpu-bench: the public kernels (flame/kernels.h) on the CPU against the engine's
 * kernels they wrap, called directly, in the same run: what the handle, the struct reading and
 * the validation of every id and offset cost.
 *
 *   bench/kernels-api-cpu-bench [--json] [--reps N] [--rows R]
 *
 * Cases (one thread):
 *   tbe_T4_B2048_P20_D128_f32: 4 borrowed float32 tables of R rows (100000 by default), 2048
 *     bags of 20 uniform ids per table, sum pooling, concat; flame_embedding_bag_forward
 *     against fl_cpu_embedding_bag over the same tables, ids and output.
 *   sumi_attn_b8_l256_m64_h4_dh32_f32: flame_sumi_attention against fl_cpu_attention_sumi
 *     called per sequence.
 *   tbe_..._f16, tbe_..._bf16: the first case's tables rounded to fp16 / bf16 and borrowed
 *     (half their bytes), pooled straight from them; against fl_cpu_embedding_bag on the same
 *     16-bit tables. The float32 output of both must be bitwise equal.
 *   tbe_..._f32_out_f16, tbe_..._f32_out_bf16: the first case's float32 tables with an fp16 /
 *     bf16 output; against the same call with a float32 output (the ratio is the cost of the
 *     rounding pass). The output must be the float32 output rounded (fl_cpu_round_half).
 * Each time is the median over --reps calls; public and direct (or peer) calls alternate, so
 * a shared machine's load hits both alike. Outputs of both are compared (they must be bitwise
 * equal: the same kernel on the same inputs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/kernels.h"
#include "flame/kernels.h"
#include "cli_args.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

#define CHECK(call)                                                                                            \
    do {                                                                                                       \
        if ((call) != FLAME_OK) {                                                                              \
            fprintf(stderr, "kernels-api-cpu-bench: %s: %s\n", #call, flame_last_error());                     \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

/* reps calls of the public forward (seconds into ta) alternating with the engine's pooling loop
 * called directly on the same bags (tb, into out_direct). */
static void time_bag(flame_embedding_bag *bag, const flame_embedding_bag_batch *q, const fl_emb_feature *fe, int T,
                     int B, int width, float *out_direct, int reps, double *ta, double *tb)
{
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        CHECK(flame_embedding_bag_forward(bag, q));
        ta[r] = now() - t0;
        t0 = now();
        fl_cpu_embedding_bag(fe, T, B, out_direct, width, width);
        tb[r] = now() - t0;
    }
}

int main(int argc, char **argv)
{
    int reps = 41, json = 0;
    int64_t R = 100000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            { long long v_; if (!cli_int("kernels-api-cpu-bench", "--reps", argv[++i], 1, 1000000, &v_)) return 2; reps = (int)v_; }
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            { long long v_; if (!cli_int("kernels-api-cpu-bench", "--rows", argv[++i], 1, 1LL << 31, &v_)) return 2; R = (int64_t)v_; }
        else {
            fprintf(stderr, "usage: kernels-api-cpu-bench [--json] [--reps N] [--rows R]\n");
            return 2;
        }
    }
    if (reps < 1 || R < 1) return 2;
    enum { T = 4, B = 2048, P = 20, D = 128 };
    float *tab = malloc((size_t)T * R * D * sizeof(float));
    for (size_t i = 0; i < (size_t)T * R * D; i++) tab[i] = (float)(int)(next() % 255 - 127) / 128.0f;
    int64_t *ids = malloc((size_t)T * B * P * sizeof(int64_t)), *off = malloc((size_t)(B + 1) * sizeof(int64_t));
    for (size_t i = 0; i < (size_t)T * B * P; i++) ids[i] = (int64_t)(next() % (uint64_t)R);
    for (int b = 0; b <= B; b++) off[b] = (int64_t)b * P;
    flame_embedding_table t[T];
    fl_emb_feature fe[T];
    flame_embedding_bag_input in[T];
    for (int f = 0; f < T; f++) {
        t[f] = (flame_embedding_table){sizeof t[f], FLAME_DTYPE_F32, FLAME_POOLING_SUM, R, D, tab + (size_t)f * R * D, NULL};
        fe[f] = (fl_emb_feature){.table = tab + (size_t)f * R * D, .rows = R, .dim = D, .pooling = FL_KPOOL_SUM,
                                 .offsets = off, .ids = ids + (size_t)f * B * P, .out_col = f * D};
        in[f] = (flame_embedding_bag_input){sizeof in[f], ids + (size_t)f * B * P, off, (int64_t)B * P, NULL};
    }
    flame_embedding_bag_params p = {sizeof p, FLAME_DEVICE_CPU, FLAME_COMBINE_CONCAT, t, T, 1, 0};
    flame_embedding_bag *bag;
    CHECK(flame_embedding_bag_create(&p, &bag));
    float *o1 = malloc((size_t)B * T * D * sizeof(float)), *o2 = malloc((size_t)B * T * D * sizeof(float));
    flame_embedding_bag_batch q = {sizeof q, B, in, T, o1, 0, FLAME_DTYPE_F32, NULL, 1, 0};
    double *ta = malloc((size_t)reps * sizeof(double)), *tb = malloc((size_t)reps * sizeof(double));
    time_bag(bag, &q, fe, T, B, T * D, o2, reps, ta, tb);
    const int tbe_equal = !memcmp(o1, o2, (size_t)B * T * D * sizeof(float));
    const double tbe_api = median(ta, reps) * 1e6, tbe_direct = median(tb, reps) * 1e6;
    flame_embedding_bag_destroy(bag);

    enum { S = 8, L = 256, M = 64, H = 4, DH = 32, W = H * DH };
    const int64_t rows = (int64_t)S * (L + M);
    float *qkv = malloc((size_t)rows * 3 * W * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * 3 * W; i++) qkv[i] = (float)(int)(next() % 255 - 127) / 128.0f;
    float *a1 = malloc((size_t)rows * W * sizeof(float)), *a2 = malloc((size_t)rows * W * sizeof(float));
    float *scratch = malloc(fl_cpu_attention_scratch(L, DH) * sizeof(float));
    int64_t ch[S + 1], cc[S + 1];
    for (int s = 0; s <= S; s++) ch[s] = (int64_t)s * L, cc[s] = (int64_t)s * M;
    flame_attention_params ap = {0};
    ap.struct_size = sizeof ap;
    ap.device = FLAME_DEVICE_CPU, ap.dtype = FLAME_DTYPE_F32, ap.mask = FLAME_MASK_SUMI, ap.heads = H, ap.head_dim = DH;
    ap.num_seqs = S, ap.cu_history = ch, ap.cu_candidates = cc, ap.rows = rows, ap.qkv = qkv, ap.ld_qkv = 3 * W;
    ap.out = a1, ap.ld_out = W, ap.threads = 1;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        CHECK(flame_sumi_attention(&ap));
        ta[r] = now() - t0;
        t0 = now();
        for (int s = 0; s < S; s++) {
            const int64_t r0 = (int64_t)s * (L + M);
            fl_cpu_attention_sumi(L, M, H, DH, qkv + r0 * 3 * W, 3 * W, NULL, L + M, qkv + r0 * 3 * W + W,
                                  qkv + r0 * 3 * W + 2 * W, 3 * W, NULL, a2 + r0 * W, W, scratch);
        }
        tb[r] = now() - t0;
    }
    const int attn_equal = !memcmp(a1, a2, (size_t)rows * W * sizeof(float));
    const double attn_api = median(ta, reps) * 1e6, attn_direct = median(tb, reps) * 1e6;

    /* 16-bit tables (borrowed, pooled from their rows), then 16-bit outputs of the float32 tables */
    const char *const half_name[2] = {"f16", "bf16"};
    double half_tab_api[2], half_tab_direct[2], half_out_api[2], half_out_f32[2];
    int half_equal = 1;
    uint16_t *htab = malloc((size_t)T * R * D * sizeof(uint16_t)), *ho = malloc((size_t)B * T * D * sizeof(uint16_t));
    uint16_t *hr = malloc((size_t)B * T * D * sizeof(uint16_t));
    for (int k = 0; k < 2; k++) {
        const fl_half_kind kind = k ? FL_HALF_BF16 : FL_HALF_F16;
        fl_cpu_round_half(htab, tab, (int64_t)T * R * D, kind);
        for (int f = 0; f < T; f++) {
            t[f].dtype = k ? FLAME_DTYPE_BF16 : FLAME_DTYPE_F16;
            t[f].data = htab + (size_t)f * R * D;
            fe[f].table = NULL;
            fe[f].table_h16 = htab + (size_t)f * R * D;
            fe[f].h16_kind = kind;
        }
        CHECK(flame_embedding_bag_create(&p, &bag));
        q.out = o1;
        time_bag(bag, &q, fe, T, B, T * D, o2, reps, ta, tb);
        half_equal = half_equal && !memcmp(o1, o2, (size_t)B * T * D * sizeof(float));
        half_tab_api[k] = median(ta, reps) * 1e6, half_tab_direct[k] = median(tb, reps) * 1e6;
        flame_embedding_bag_destroy(bag);
    }
    for (int f = 0; f < T; f++) {
        t[f].dtype = FLAME_DTYPE_F32;
        t[f].data = tab + (size_t)f * R * D;
    }
    CHECK(flame_embedding_bag_create(&p, &bag));
    for (int k = 0; k < 2; k++) {
        for (int r = 0; r < reps; r++) {
            q.out = ho;
            q.out_dtype = k ? FLAME_DTYPE_BF16 : FLAME_DTYPE_F16;
            double t0 = now();
            CHECK(flame_embedding_bag_forward(bag, &q));
            ta[r] = now() - t0;
            q.out = o1;
            q.out_dtype = FLAME_DTYPE_F32;
            t0 = now();
            CHECK(flame_embedding_bag_forward(bag, &q));
            tb[r] = now() - t0;
        }
        fl_cpu_round_half(hr, o1, (int64_t)B * T * D, k ? FL_HALF_BF16 : FL_HALF_F16);
        half_equal = half_equal && !memcmp(ho, hr, (size_t)B * T * D * sizeof(uint16_t));
        half_out_api[k] = median(ta, reps) * 1e6, half_out_f32[k] = median(tb, reps) * 1e6;
    }
    flame_embedding_bag_destroy(bag);
    const int all_equal = tbe_equal && attn_equal && half_equal;
    if (json) {
        printf("{\"reps\":%d,\"rows_per_table\":%lld,\"api_cpu_tbe_T4_B2048_P20_D128_f32_us\":%.1f,"
               "\"direct_cpu_tbe_T4_B2048_P20_D128_f32_us\":%.1f,\"api_cpu_sumi_attn_b8_l256_m64_h4_dh32_us\":%.1f,"
               "\"direct_cpu_sumi_attn_b8_l256_m64_h4_dh32_us\":%.1f,",
               reps, (long long)R, tbe_api, tbe_direct, attn_api, attn_direct);
        for (int k = 0; k < 2; k++)
            printf("\"api_cpu_tbe_T4_B2048_P20_D128_%s_us\":%.1f,\"direct_cpu_tbe_T4_B2048_P20_D128_%s_us\":%.1f,"
                   "\"api_cpu_tbe_T4_B2048_P20_D128_f32_out_%s_us\":%.1f,\"api_cpu_tbe_T4_B2048_P20_D128_f32_out_f32_"
                   "beside_%s_us\":%.1f,",
                   half_name[k], half_tab_api[k], half_name[k], half_tab_direct[k], half_name[k], half_out_api[k],
                   half_name[k], half_out_f32[k]);
        printf("\"bitwise_equal\":%s}\n", all_equal ? "true" : "false");
    } else {
        printf("median of %d, one thread; %lld rows per table\n", reps, (long long)R);
        printf("TBE T4 B2048 P20 D128 f32    public %9.1f us  direct %9.1f us  public/direct %.3f  %s\n", tbe_api,
               tbe_direct, tbe_api / tbe_direct, tbe_equal ? "bitwise equal" : "OUTPUTS DIFFER");
        printf("SUMI attn B8 L256 M64 H4 dh32 public %9.1f us  direct %9.1f us  public/direct %.3f  %s\n", attn_api,
               attn_direct, attn_api / attn_direct, attn_equal ? "bitwise equal" : "OUTPUTS DIFFER");
        for (int k = 0; k < 2; k++)
            printf("TBE T4 B2048 P20 D128 %-4s   public %9.1f us  direct %9.1f us  public/direct %.3f  (borrowed %s "
                   "tables)\n",
                   half_name[k], half_tab_api[k], half_tab_direct[k], half_tab_api[k] / half_tab_direct[k], half_name[k]);
        for (int k = 0; k < 2; k++)
            printf("TBE ... f32 tables, %-4s out %9.1f us  f32 out %9.1f us  ratio %.3f\n", half_name[k],
                   half_out_api[k], half_out_f32[k], half_out_api[k] / half_out_f32[k]);
        printf("16-bit cases: %s\n", half_equal ? "bitwise equal" : "OUTPUTS DIFFER");
    }
    return all_equal ? 0 : 1;
}
