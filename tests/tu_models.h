/* Model configurations and request fixtures the C suites share: the same few architectures
 * everywhere, written once, so a change to the config format is made in one place. */
#ifndef FLAME_TU_MODELS_H
#define FLAME_TU_MODELS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "flame/flame.h"

#define TU_STR_(x) #x
#define TU_STR(x) TU_STR_(x)

/* The sumi ranker with two side features: item table of ITEMS rows (dim 16), "artist" (20 rows,
 * sum pooling) and "genre" (5 rows, mean pooling) concatenated and projected to d_model 32; a
 * history window of MAX_LEN, candidates at position MAX_LEN (from_recent, MAX_LEN + 1 position
 * rows, given as POS_ROWS); 2 pre-LN blocks of 4 heads with ACTIVATION; tasks "a" (an MLP
 * [16]) and "b" (linear). */
#define TU_SUMI_SIDE_CONFIG(ITEMS, MAX_LEN, POS_ROWS, ACTIVATION)                                                      \
    "{\"format\":\"flame\",\"version\":1,\"d_model\":32,\"max_len\":" TU_STR(MAX_LEN) ","                              \
    "\"tables\":[{\"name\":\"item\",\"rows\":" TU_STR(ITEMS) ",\"dim\":16},"                                           \
    "{\"name\":\"artist\",\"rows\":20,\"dim\":8},{\"name\":\"genre\",\"rows\":5,\"dim\":8}],"                          \
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"},"                                         \
    "{\"name\":\"artist\",\"table\":\"artist\",\"input\":\"side\"},"                                                   \
    "{\"name\":\"genre\",\"table\":\"genre\",\"input\":\"side\",\"pooling\":\"mean\"}],"                               \
    "\"combine\":\"concat\",\"projection\":true,"                                                                      \
    "\"position\":{\"rule\":\"from_recent\",\"rows\":" TU_STR(POS_ROWS) ",\"candidate_position\":" TU_STR(MAX_LEN) "}," \
    "\"blocks\":{\"count\":2,\"num_heads\":4,\"ffn_dim\":64,\"norm\":\"pre\",\"activation\":\"" TU_STR(ACTIVATION) "\"}," \
    "\"final_layernorm\":true,"                                                                                        \
    "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[16]},{\"name\":\"b\",\"hidden\":[]}]}}"

/* The SASRec-style dot model: item table of ITEMS rows, d_model 16, window 8 (left-padded
 * positions), BLOCKS post-LN blocks of 2 heads (GELU, erf), the dot head over the item table;
 * EXTRA is more top-level keys, each followed by a comma ("" for none). */
#define TU_DOT_CONFIG(ITEMS, BLOCKS, EXTRA)                                                                            \
    "{\"format\":\"flame\",\"version\":1,\"d_model\":16,\"max_len\":8," EXTRA                                          \
    "\"tables\":[{\"name\":\"item\",\"rows\":" TU_STR(ITEMS) ",\"dim\":16}],"                                          \
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"                                        \
    "\"position\":{\"rule\":\"left_padded_slot\",\"rows\":8},"                                                         \
    "\"blocks\":{\"count\":" TU_STR(BLOCKS) ",\"num_heads\":2,\"ffn_dim\":32,\"norm\":\"post\","                        \
    "\"activation\":\"gelu_erf\"},"                                                                                    \
    "\"head\":{\"type\":\"dot\",\"table\":\"item\"}}"

/* The side features of item i in the sumi ranker above: slot 0 (artist) {i % 20}, slot 1
 * (genre) {i % 5, (i + 1) % 5} for odd i and none for even i; as CSR offs [3] over ids [3].
 * Returns the number of ids. */
static inline int64_t tu_item_record(int64_t item, int64_t *offs, int64_t *ids)
{
    offs[0] = 0;
    ids[0] = item % 20;
    offs[1] = 1;
    int64_t n = 1;
    if (item % 2) ids[n++] = item % 5, ids[n++] = (item + 1) % 5;
    offs[2] = n;
    return n;
}

/* The two side-feature bags of a token list (up to TU_BAGS_MAX_TOKENS tokens) as a request
 * gives them and an item cache resolves them: tu_item_record per item, or empty bags for an
 * item `known` says the source lacks (known NULL: every item is known). */
#define TU_BAGS_MAX_TOKENS 128
typedef struct tu_side_bags {
    int64_t off[2][TU_BAGS_MAX_TOKENS + 1], ids[2][3 * TU_BAGS_MAX_TOKENS];
    flame_bags b[2];
} tu_side_bags;

static inline void tu_side_bags_build(tu_side_bags *g, const int64_t *items, size_t n, bool (*known)(int64_t))
{
    if (n > TU_BAGS_MAX_TOKENS) {
        fprintf(stderr, "tu_side_bags_build: %zu tokens, at most %d\n", n, TU_BAGS_MAX_TOKENS);
        abort();
    }
    g->off[0][0] = g->off[1][0] = 0;
    for (size_t t = 0; t < n; t++) {
        int64_t offs[3] = {0, 0, 0}, v[3];
        if (!known || known(items[t])) tu_item_record(items[t], offs, v);
        for (int s = 0; s < 2; s++) {
            int64_t k = g->off[s][t];
            for (int64_t i = offs[s]; i < offs[s + 1]; i++) g->ids[s][k++] = v[i];
            g->off[s][t + 1] = k;
        }
    }
    for (int s = 0; s < 2; s++) g->b[s] = (flame_bags){g->off[s], g->ids[s], (size_t)g->off[s][n]};
}

#endif
