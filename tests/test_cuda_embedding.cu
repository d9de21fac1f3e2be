/* The CUDA table-batched embedding kernel (fl_cuda_embedding_bag) on int8 row-wise quantized
 * tables, alone and mixed with float tables, against a float64 reference computed from the
 * stored values (scale * q + bias for int8 rows), on fresh random inputs: dims that take the
 * 16-, 8- and 4-value int8 vectors and single values, misaligned tables (single values), sum
 * and mean pooling over bags of 0..9 ids and single-id features, sum and concat combine,
 * float/half/bfloat16 tables and outputs. Outputs are NaN-poisoned first and the gap of a
 * strided output must stay poisoned. Skipped with a message where no GPU is usable;
 * FLAME_REQUIRE_GPU turns the skip into a failure. */
#include <vector>

extern "C" {
#include "testutil.h"
#include "tu_gpu.h"
}
#include "kernels.cuh"
#include "tu_cuda.cuh"

// Device copies freed at the end of a case.
struct dev_bufs {
    std::vector<void *> p;
    template <typename X> X *put(const std::vector<X> &h, size_t extra_bytes = 0)
    {
        void *d = nullptr;
        const size_t bytes = h.size() * sizeof(X);
        if (cudaMalloc(&d, bytes + extra_bytes + 16) != cudaSuccess) return nullptr;
        p.push_back(d);
        uint8_t *at = static_cast<uint8_t *>(d) + extra_bytes;
        if (bytes && cudaMemcpy(at, h.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
        return reinterpret_cast<X *>(at);
    }
    ~dev_bufs()
    {
        for (void *d : p) cudaFree(d);
    }
};

struct host_feature {
    bool q8;
    int rows, dim, pooling;
    std::vector<int8_t> q;
    std::vector<float> qp; // [rows, 2]
    std::vector<float> f;  // float table values, as stored (rounded to T)
    std::vector<int64_t> off, ids;
};

// One random case; dim_class 0: multiples of 16, 1: of 8, 2: of 4, 3: any; misalign: tables
// offset from their allocation (no vector loads).
template <typename T, typename OutT> static void run_case(int dim_class, bool concat, bool misalign, bool all_q8)
{
    const int F = 1 + (int)tu_below(4);
    const int64_t tokens = 1 + tu_below(300);
    auto pick_dim = [&]() {
        static const int mult[4] = {16, 8, 4, 1};
        int m = mult[dim_class], d;
        do {
            d = m * (1 + (int)tu_below(dim_class == 0 ? 32 : 40 / m + 3));
        } while (dim_class > 0 && d % (2 * m) == 0 && m < 16); // a multiple of m but not of 2m
        return d;
    };
    const int sum_dim = pick_dim();
    std::vector<host_feature> hf(F);
    int width = 0;
    for (int f = 0; f < F; f++) {
        host_feature &h = hf[f];
        h.q8 = all_q8 || f == 0 || tu_below(2);
        h.rows = 1 + (int)tu_below(500);
        h.dim = concat ? pick_dim() : sum_dim;
        h.pooling = (int)tu_below(2);
        width = concat ? width + h.dim : sum_dim;
        if (h.q8) {
            h.q.resize((size_t)h.rows * h.dim);
            for (auto &x : h.q) x = (int8_t)(tu_below(256) - 128);
            h.qp.resize((size_t)h.rows * 2);
            for (int r = 0; r < h.rows; r++) {
                h.qp[2 * r] = tu_below(8) == 0 ? 0.0f : 0.05f * tu_uniform();
                h.qp[2 * r + 1] = tu_uniform();
            }
        } else {
            h.f.resize((size_t)h.rows * h.dim);
            for (auto &x : h.f) x = (float)from_t(to_t<T>(tu_uniform()));
        }
        const bool single = f == 0 && tu_below(2); // an item feature: ids[t] alone
        if (!single) {
            h.off.push_back(0);
            for (int64_t t = 0; t < tokens; t++) {
                const int64_t n = tu_below(10); // 0..9: empty bags, and runs past the 4 rows in flight
                for (int64_t i = 0; i < n; i++) h.ids.push_back(tu_below(h.rows));
                h.off.push_back(h.off.back() + n);
            }
        } else {
            for (int64_t t = 0; t < tokens; t++) h.ids.push_back(tu_below(h.rows));
        }
    }
    const int64_t ldo = width + 3;
    dev_bufs db;
    fl_dev_features fs;
    memset(&fs, 0, sizeof fs);
    fs.count = F;
    fs.width = width;
    fs.concat = concat;
    int col = 0;
    for (int f = 0; f < F; f++) {
        host_feature &h = hf[f];
        fl_dev_feature &df = fs.f[f];
        const size_t shift = misalign ? (h.q8 ? 1 + tu_below(15) : sizeof(T)) : 0;
        if (h.q8) {
            df.table = db.put(h.q, shift);
            df.qparams = db.put(h.qp);
            assert_non_null(df.qparams);
        } else {
            std::vector<T> tv(h.f.size());
            for (size_t i = 0; i < tv.size(); i++) tv[i] = to_t<T>(h.f[i]);
            df.table = db.put(tv, shift);
        }
        assert_non_null(df.table);
        df.dim = h.dim;
        df.pooling = h.pooling;
        df.out_col = concat ? col : 0;
        col += h.dim;
        df.offsets = h.off.empty() ? nullptr : db.put(h.off);
        df.ids = db.put(h.ids);
        assert_non_null(df.ids);
    }
    OutT *out = nullptr;
    const size_t out_bytes = (size_t)(tokens * ldo) * sizeof(OutT);
    CK(cudaMalloc(&out, out_bytes));
    CK(cudaMemset(out, 0xff, out_bytes)); // NaN in fp32, fp16 and bf16
    flame_status st = fl_cuda_embedding_bag<T, OutT>(fs, tokens, out, ldo, nullptr);
    if (st) fail_msg("fl_cuda_embedding_bag: %s", flame_last_error());
    CK(cudaDeviceSynchronize());
    std::vector<OutT> got((size_t)(tokens * ldo));
    CK(cudaMemcpy(got.data(), out, out_bytes, cudaMemcpyDeviceToHost));
    CK(cudaFree(out));
    std::vector<double> want((size_t)(tokens * width), 0.0);
    std::vector<float> gotf((size_t)(tokens * width));
    for (int64_t t = 0; t < tokens; t++) {
        for (int f = 0; f < F; f++) {
            const host_feature &h = hf[f];
            const int64_t b = h.off.empty() ? t : h.off[t], e = h.off.empty() ? t + 1 : h.off[t + 1];
            for (int64_t i = b; i < e; i++) {
                const int64_t r = h.ids[i];
                for (int j = 0; j < h.dim; j++) {
                    const double v = h.q8 ? (double)h.qp[2 * r] * h.q[r * h.dim + j] + h.qp[2 * r + 1]
                                          : (double)h.f[r * h.dim + j];
                    want[t * width + fs.f[f].out_col + j] += h.pooling ? v / (double)(e - b) : v;
                }
            }
        }
        for (int j = 0; j < width; j++) gotf[t * width + j] = (float)from_t(got[t * ldo + j]);
        for (int64_t j = width; j < ldo; j++) assert_true(isnan(from_t(got[t * ldo + j])));
    }
    const double tol = sizeof(OutT) == 4 ? 1e-5 : 1e-2;
    const double err = tu_rel_err(gotf.data(), want.data(), want.size());
    if (!(err < tol))
        fail_msg("dims class %d, %s, %d features%s: relative error %.3g >= %.3g", dim_class, concat ? "concat" : "sum",
                 F, misalign ? ", misaligned" : "", err, tol);
}

template <typename T, typename OutT> static void sweep()
{
    for (int rep = 0; rep < 6; rep++)
        for (int dc = 0; dc < 4; dc++) {
            run_case<T, OutT>(dc, rep & 1, false, rep == 0);
            if (rep == 0) run_case<T, OutT>(dc, dc & 1, true, false);
        }
}

static void test_q8_float_tables_float_out(void **state)
{
    TU_NEED_GPU();
    sweep<float, float>();
}

static void test_q8_half_tables_float_out(void **state)
{
    TU_NEED_GPU();
    sweep<__half, float>();
}

static void test_q8_half_out(void **state)
{
    TU_NEED_GPU();
    sweep<__half, __half>();
    sweep<float, __half>();
}

static void test_q8_bf16_out(void **state)
{
    TU_NEED_GPU();
    sweep<__nv_bfloat16, __nv_bfloat16>();
    sweep<__nv_bfloat16, float>();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_float_tables_float_out),
        cmocka_unit_test(test_q8_half_tables_float_out),
        cmocka_unit_test(test_q8_half_out),
        cmocka_unit_test(test_q8_bf16_out),
    };
    return cmocka_run_group_tests_name("cuda embedding (int8 tables)", tests, tu_gpu_setup, NULL);
}
