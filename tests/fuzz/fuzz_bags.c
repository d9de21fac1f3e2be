/* Request validation: flame_score_batch on a small random model (2 side-feature slots over
 * tables of 7 and 13 rows, 40 items, 3 tasks) with requests built from the input: ids in and
 * out of range, offsets of any value, NULL or present bags, wrong slot counts, user-cache
 * flags, short output buffers. Every pointer/length pair handed to the library is consistent
 * (the caller's pointers are trusted): an ids array has exactly as many elements as its final
 * offset says. A call either fails with a message and writes no score, or writes finite
 * scores for every candidate. */
#include <math.h>
#include <string.h>

#include "fuzz.h"

#define MAX_REQ 4
#define MAX_TOK 12
#define MAX_IDS 16
#define SLOTS 2
#define TASKS 3

static flame_engine *engine;

static const char *CONFIG =
    "{\"format\":\"flame\",\"version\":1,\"d_model\":8,\"max_len\":6,"
    "\"tables\":[{\"name\":\"item\",\"rows\":40,\"dim\":8},{\"name\":\"cat\",\"rows\":7,\"dim\":8},"
    "{\"name\":\"tag\",\"rows\":13,\"dim\":8}],"
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\",\"pooling\":\"sum\"},"
    "{\"name\":\"cat\",\"table\":\"cat\",\"input\":\"side\",\"pooling\":\"sum\"},"
    "{\"name\":\"tag\",\"table\":\"tag\",\"input\":\"side\",\"pooling\":\"mean\"}],"
    "\"combine\":\"sum\",\"projection\":false,"
    "\"position\":{\"rule\":\"left_padded_slot\",\"rows\":6,\"candidate_position\":-1},"
    "\"input_layernorm\":true,"
    "\"blocks\":{\"count\":1,\"num_heads\":2,\"ffn_dim\":8,\"norm\":\"post\",\"activation\":\"gelu_erf\"},"
    "\"final_layernorm\":false,\"layernorm\":{\"eps\":1e-12,\"eps_inside_sqrt\":true},"
    "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[4],\"activation\":\"relu\"},"
    "{\"name\":\"b\",\"hidden\":[],\"activation\":\"relu\"},{\"name\":\"c\",\"hidden\":[],\"activation\":\"relu\"}]}}";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    flame_model *m = NULL;
    if (flame_model_create_random(CONFIG, 7, &m) || flame_engine_create(m, NULL, &engine)) {
        fprintf(stderr, "%s\n", flame_last_error());
        abort();
    }
    flame_model_destroy(m);
    return 0;
}

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static uint8_t byte(reader *r)
{
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

/* Mostly small values (valid ids and offsets), sometimes negative or huge. */
static int64_t value(reader *r)
{
    uint8_t b = byte(r);
    if (b < 0xf0) return b % 48;
    if (b < 0xf8) return -(int64_t)byte(r);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | byte(r);
    return (int64_t)v;
}

typedef struct bag {
    int64_t offsets[MAX_TOK + 1];
    int64_t *ids; /* exactly len of them: the array num_ids describes (the caller's lengths are trusted) */
    size_t len;
} bag;

static void make_bag(reader *r, size_t tokens, bag *b)
{
    uint8_t mode = byte(r);
    int64_t len = byte(r) % (MAX_IDS + 1);
    for (size_t t = 0; t <= tokens; t++)
        b->offsets[t] = mode & 1 ? value(r) : (int64_t)(len * t / (tokens ? tokens : 1)); /* fuzzed or a valid CSR */
    b->offsets[0] = mode & 2 ? b->offsets[0] : 0;
    b->offsets[tokens] = mode & 4 ? b->offsets[tokens] : len; /* a final offset that may contradict num_ids */
    b->len = (size_t)len;
    b->ids = malloc((size_t)len * sizeof *b->ids + 1);
    for (int64_t i = 0; i < len; i++) b->ids[i] = value(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader rd = {data, size}, *r = &rd;
    size_t nreq = 1 + byte(r) % MAX_REQ;
    flame_request req[MAX_REQ];
    int64_t hist[MAX_REQ][MAX_TOK], cand[MAX_REQ][MAX_TOK];
    flame_bags fb[MAX_REQ][2][SLOTS + 1];
    bag bags[MAX_REQ][2][SLOTS + 1];
    memset(bags, 0, sizeof bags);
    size_t total = 0;
    for (size_t q = 0; q < nreq; q++) {
        uint8_t flags = byte(r);
        size_t nh = byte(r) % (MAX_TOK + 1), nc = byte(r) % (MAX_TOK + 1);
        for (size_t i = 0; i < nh; i++) hist[q][i] = value(r);
        for (size_t i = 0; i < nc; i++) cand[q][i] = value(r);
        size_t slots = flags & 0x40 ? SLOTS + 1 : flags & 0x80 ? 1 : SLOTS;
        for (int side = 0; side < 2; side++)
            for (size_t s = 0; s < slots; s++) {
                make_bag(r, side ? nc : nh, &bags[q][side][s]);
                fb[q][side][s] = (flame_bags){.offsets = bags[q][side][s].offsets, .ids = bags[q][side][s].ids,
                                              .num_ids = bags[q][side][s].len};
            }
        req[q] = (flame_request){.struct_size = sizeof req[q], .user_id = value(r), .history = nh ? hist[q] : NULL,
                                 .history_len = nh, .candidates = nc ? cand[q] : NULL, .num_candidates = nc,
                                 .history_side = flags & 1 ? NULL : fb[q][0], .candidate_side = flags & 2 ? NULL : fb[q][1],
                                 .num_side_features = slots, .history_from_user_cache = flags & 4 ? (flags >> 3 & 3) : 0};
        total += nc;
    }
    size_t want = total * TASKS, len = byte(r) & 1 ? want - (want > 0) : want;
    float *out = malloc((len ? len : 1) * sizeof *out);
    for (size_t i = 0; i < len; i++) out[i] = -1.0f / 0.0f; /* a score is never -inf */
    flame_status st = flame_score_batch(engine, req, nreq, out, len);
    FZ_CHECK_ERROR(st);
    for (size_t i = 0; i < len; i++) {
        if (st == FLAME_OK)
            FZ_ASSERT(isfinite(out[i]) && out[i] >= 0 && out[i] <= 1, "score %zu of %zu is %g", i, len, out[i]);
        else
            FZ_ASSERT(isinf(out[i]), "a failed call (%s) wrote score %zu", flame_last_error(), i);
    }
    free(out);
    for (size_t q = 0; q < MAX_REQ; q++)
        for (int side = 0; side < 2; side++)
            for (size_t s = 0; s <= SLOTS; s++) free(bags[q][side][s].ids);
    return 0;
}
