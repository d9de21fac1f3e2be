/* A program built only from an installed libflame (header + pkg-config), as a user would. */
#include <flame/flame.h>
#include <stdio.h>

int main(void)
{
    static const char *cfg =
        "{\"format\":\"flame\",\"version\":1,\"d_model\":8,\"max_len\":4,"
        "\"tables\":[{\"name\":\"item\",\"rows\":16,\"dim\":8}],"
        "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
        "\"blocks\":{\"count\":1,\"num_heads\":2,\"ffn_dim\":16,\"norm\":\"pre\",\"activation\":\"relu\"},"
        "\"final_layernorm\":true,\"head\":{\"type\":\"dot\",\"table\":\"item\"}}";
    flame_model *m = NULL;
    flame_engine *e = NULL;
    if (flame_version() != FLAME_VERSION_NUMBER || flame_model_create_random(cfg, 1, &m) ||
        flame_engine_create(m, NULL, &e)) {
        fprintf(stderr, "consumer: %s\n", flame_last_error());
        return 1;
    }
    int64_t hist[2] = {3, 4}, cand[2] = {5, 6};
    float s[2] = {0};
    flame_request r = {.struct_size = sizeof r, .history = hist, .history_len = 2, .candidates = cand,
                       .num_candidates = 2};
    flame_status st = flame_score(e, &r, s, 2);
    printf("consumer: libflame %s scored %.4f %.4f\n", flame_version_string(), s[0], s[1]);
    /* the same request through the scheduler, as README shows it */
    flame_scheduler *sched = NULL;
    float t[2] = {0};
    flame_status st2 = flame_scheduler_create(e, NULL, &sched);
    if (st2 == FLAME_OK) st2 = flame_scheduler_score(sched, &r, t, 2);
    flame_scheduler_destroy(sched);
    if (st2) fprintf(stderr, "consumer: scheduler: %s\n", flame_last_error());
    flame_engine_destroy(e);
    flame_model_destroy(m);
    return st == FLAME_OK && s[0] != s[1] && st2 == FLAME_OK && t[0] == s[0] && t[1] == s[1] ? 0 : 1;
}
