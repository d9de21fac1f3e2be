/* The no-trailing-padding rule (top of flame.h, docs/abi.md): sizeof of every public struct is
 * where its last field ends, so a field appended later always grows struct_size instead of
 * landing in what an older caller left as uninitialised padding.
 *
 * At compile time, over the public headers as a caller sees them: one static assertion per
 * public struct that sizeof equals the end of its last field, and one per reserved field that
 * it fills the end exactly. (tests/check-struct-padding.sh asks the compiler the same of every
 * struct the headers declare, so a struct added later and missing here is caught too.) At run
 * time: a non-zero reserved field is refused naming it through every entry point that reads
 * the struct, an older caller's struct is not refused for what was its padding, and the
 * library writes 0 into the reserved fields of the structs it fills. */
#include "testutil.h"
#include "tu_models.h"

#define END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
#define ENDS_AT(type, last) _Static_assert(sizeof(type) == END(type, last), #type ": padding after " #last)

/* flame.h */
ENDS_AT(flame_model_info, weight_bytes);
ENDS_AT(flame_bags, num_ids);
ENDS_AT(flame_request, reserved0);
ENDS_AT(flame_engine_stats, profile_padding_tokens);
/* flame/features.h */
ENDS_AT(flame_redis_options, backoff_max_ms);
ENDS_AT(flame_item_cache_params, clock_user);
ENDS_AT(flame_item_cache_stats, bytes);
/* flame/memory.h */
ENDS_AT(flame_numa_info, reserved0);
ENDS_AT(flame_pinned_pool_params, max_cached_bytes);
ENDS_AT(flame_pinned_pool_stats, reserved0);
ENDS_AT(flame_user_cache_params, ttl_us);
ENDS_AT(flame_user_features, age_us);
ENDS_AT(flame_user_cache_stats, corrupt);
/* flame/scheduler.h */
ENDS_AT(flame_batch_profile, max_candidates);
ENDS_AT(flame_scheduler_params, adaptive_wait);
ENDS_AT(flame_submit_options, deadline_us);
ENDS_AT(flame_scheduler_stats, batch_slots);
/* flame/kernels.h */
ENDS_AT(flame_embedding_table, qparams);
ENDS_AT(flame_embedding_bag_params, reserved0);
ENDS_AT(flame_embedding_bag_input, weights);
ENDS_AT(flame_embedding_bag_batch, device_indices);
ENDS_AT(flame_attention_params, reserved0);
/* flame/metrics.h */
ENDS_AT(flame_latency, max_us);
ENDS_AT(flame_metrics_sources, pinned_pool);

/* The reserved fields: 4 bytes, right after the last real field, up to the end. */
#define FILLS(type, before)                                                                                  \
    _Static_assert(offsetof(type, reserved0) == END(type, before) && sizeof(((type *)0)->reserved0) == 4 &&  \
                       END(type, reserved0) == sizeof(type),                                               \
                   #type ".reserved0 does not fill the end after " #before)
FILLS(flame_request, kv_cache);
FILLS(flame_numa_info, current_node);
FILLS(flame_pinned_pool_stats, pinning);
FILLS(flame_embedding_bag_params, borrow);
FILLS(flame_attention_params, threads);

static const char *config = TU_DOT_CONFIG(50, 1, "");



/* Requests: a non-zero reserved0 is refused naming it, through every entry point that reads
 * requests (flame_score, flame_score_batch in place, the top-k path, the scheduler's copy),
 * with nothing written; an older caller's 80-byte request (the first 0.2.0 header's, which
 * ended at history_from_user_cache and so never had these bytes) scores as before. */
static void test_request_reserved_field(void **state)
{
    flame_model *m;
    flame_engine *e;
    flame_scheduler *s;
    assert_int_equal(flame_model_create_random(config, 3, &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &e), FLAME_OK);
    assert_int_equal(flame_scheduler_create(e, NULL, &s), FLAME_OK);
    int64_t hist[3] = {1, 2, 3}, cand[2] = {4, 5}, ids[2];
    float out[4], want[4], top[2];
    const flame_request good = {.struct_size = sizeof good, .history = hist, .history_len = 3, .candidates = cand,
                                .num_candidates = 2};
    assert_int_equal(flame_score(e, &good, want, 2), FLAME_OK);
    flame_request r[2] = {good, good};
    r[1].reserved0 = 0x80000000u;
    const char *needle = "flame_request.reserved0 = 2147483648: a reserved field, must be 0";
    tu_poison(out, 4);
    assert_status_msg(flame_score(e, &r[1], out, 2), FLAME_ERR_INVALID_ARG, needle);
    assert_status_msg(flame_score_batch(e, r, 2, out, 4), FLAME_ERR_INVALID_ARG, "request 1: flame_request.reserved0");
    for (int i = 0; i < 4; i++) assert_true(isnan(out[i])); /* nothing written */
    assert_status_msg(flame_score_batch_topk(e, r, 2, 1, 0, ids, top, 2), FLAME_ERR_INVALID_ARG, needle);
    assert_status_msg(flame_scheduler_score(s, &r[1], out, 2), FLAME_ERR_INVALID_ARG, needle);
    r[1].reserved0 = 0;
    assert_int_equal(flame_score_batch(e, r, 2, out, 4), FLAME_OK);
    const double want2[2] = {want[0], want[1]}; /* (a batch of two rounds differently from one) */
    assert_rel_err_below(out + 2, want2, 2, 1e-5);

    /* the older request, with what follows it in the caller's memory not zero */
    unsigned char older[sizeof(flame_request)];
    memset(older, 0xa5, sizeof older);
    const size_t older_size = offsetof(flame_request, history_from_user_cache) + 8; /* its trailing padding too */
    assert_int_equal(older_size, 80);
    memcpy(older, &good, older_size);
    memcpy(older, &older_size, sizeof older_size);
    tu_poison(out, 4);
    assert_int_equal(flame_score(e, (const flame_request *)older, out, 2), FLAME_OK);
    assert_memory_equal(out, want, 2 * sizeof(float));
    tu_poison(out, 4);
    assert_int_equal(flame_scheduler_score(s, (const flame_request *)older, out, 2), FLAME_OK);
    assert_memory_equal(out, want, 2 * sizeof(float));
    flame_scheduler_destroy(s);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

/* The kernels' input structs: a non-zero reserved0 is refused naming it before anything is
 * made or run (out stays NULL, nothing written); with it 0 the same call succeeds. */
static void test_kernel_reserved_fields(void **state)
{
    float rows[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8};
    flame_embedding_table t = {.struct_size = sizeof t, .rows = 4, .dim = 2, .data = rows};
    flame_embedding_bag_params bp = {.struct_size = sizeof bp, .device = FLAME_DEVICE_CPU, .tables = &t,
                                     .num_tables = 1, .reserved0 = 5};
    flame_embedding_bag *bag = (flame_embedding_bag *)&bp;
    assert_status_msg(flame_embedding_bag_create(&bp, &bag), FLAME_ERR_INVALID_ARG,
                      "flame_embedding_bag_params.reserved0 = 5: a reserved field, must be 0");
    assert_null(bag);
    bp.reserved0 = 0;
    assert_int_equal(flame_embedding_bag_create(&bp, &bag), FLAME_OK);
    const int64_t bag_ids[3] = {0, 3, 1}, offs[3] = {0, 2, 3};
    flame_embedding_bag_input in = {.struct_size = sizeof in, .ids = bag_ids, .offsets = offs, .num_ids = 3};
    float pooled[4];
    flame_embedding_bag_batch b = {.struct_size = sizeof b, .batch = 2, .inputs = &in, .num_inputs = 1,
                                   .out = pooled};
    assert_int_equal(flame_embedding_bag_forward(bag, &b), FLAME_OK);
    const float sums[4] = {1 + 7, 2 + 8, 3, 4}; /* rows 0 + 3, then row 1 */
    assert_memory_equal(pooled, sums, sizeof sums);
    flame_embedding_bag_destroy(bag);

    /* attention: refused before any of its arrays is read; then a real one-sequence call */
    float qkv[2 * 6], o[2 * 2];
    for (int i = 0; i < 12; i++) qkv[i] = (float)(i % 5) * 0.25f - 0.5f;
    const int64_t cu_h[2] = {0, 1}, cu_c[2] = {0, 1};
    flame_attention_params ap = {.struct_size = sizeof ap, .device = FLAME_DEVICE_CPU, .dtype = FLAME_DTYPE_F32,
                                 .heads = 1, .head_dim = 2, .num_seqs = 1, .cu_history = cu_h,
                                 .cu_candidates = cu_c, .rows = 2, .qkv = qkv, .ld_qkv = 6, .out = o, .ld_out = 2,
                                 .reserved0 = 6};
    tu_poison(o, 4);
    assert_status_msg(flame_sumi_attention(&ap), FLAME_ERR_INVALID_ARG,
                      "flame_attention_params.reserved0 = 6: a reserved field, must be 0");
    for (int i = 0; i < 4; i++) assert_true(isnan(o[i])); /* nothing written */
    ap.reserved0 = 0;
    assert_int_equal(flame_sumi_attention(&ap), FLAME_OK);
    /* row 0 (history) attends to itself only: its output is its V */
    assert_true(o[0] == qkv[4] && o[1] == qkv[5]);
}

/* Output structs: the library writes 0 into their reserved fields, whatever the caller's
 * bytes held. */
static void test_reserved_fields_written_as_zero(void **state)
{
    flame_pinned_pool *pool;
    assert_int_equal(flame_pinned_pool_create(NULL, &pool), FLAME_OK);
    flame_pinned_pool_stats ps;
    memset(&ps, 0xee, sizeof ps);
    ps.struct_size = sizeof ps;
    assert_int_equal(flame_pinned_pool_get_stats(pool, &ps), FLAME_OK);
    assert_int_equal(ps.reserved0, 0);
    flame_pinned_pool_destroy(pool);
    flame_numa_info ni;
    memset(&ni, 0xee, sizeof ni);
    ni.struct_size = sizeof ni;
#if FLAME_WITH_NUMA /* (without libnuma flame_numa_get_info is a stand-in: test_optional_modules) */
    assert_int_equal(flame_numa_get_info(&ni), FLAME_OK);
    assert_int_equal(ni.reserved0, 0);
#else
    assert_int_equal(flame_numa_get_info(&ni), FLAME_ERR_UNSUPPORTED);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_reserved_field),
        cmocka_unit_test(test_kernel_reserved_fields),
        cmocka_unit_test(test_reserved_fields_written_as_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
