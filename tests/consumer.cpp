// A C++ program built only from an installed libflame, as a C++ service would: the header
// compiles as C++ (17 and 20, -Wall -Wextra -Werror -pedantic) and its calls link from C++.
#include <flame/flame.h>

#include <cstdint>
#include <cstdio>
#include <vector>

int main()
{
    const char *cfg =
        "{\"format\":\"flame\",\"version\":1,\"d_model\":8,\"max_len\":4,"
        "\"tables\":[{\"name\":\"item\",\"rows\":16,\"dim\":8}],"
        "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
        "\"blocks\":{\"count\":1,\"num_heads\":2,\"ffn_dim\":16,\"norm\":\"pre\",\"activation\":\"relu\"},"
        "\"final_layernorm\":true,\"head\":{\"type\":\"dot\",\"table\":\"item\"}}";
    flame_model *m = nullptr;
    flame_engine *e = nullptr;
    if (flame_version() != FLAME_VERSION_NUMBER || flame_model_create_random(cfg, 1, &m) != FLAME_OK ||
        flame_engine_create(m, nullptr, &e) != FLAME_OK) {
        std::fprintf(stderr, "consumer++: %s\n", flame_last_error());
        return 1;
    }
    std::vector<int64_t> hist{3, 4}, cand{5, 6};
    std::vector<float> s(cand.size());
    flame_request r{};
    r.struct_size = sizeof r;
    r.history = hist.data();
    r.history_len = hist.size();
    r.candidates = cand.data();
    r.num_candidates = cand.size();
    flame_status st = flame_score(e, &r, s.data(), s.size());
    // a bad call gets a status and a message from C++ as from C
    flame_status bad = flame_score(e, &r, s.data(), 0);
    std::printf("consumer++: libflame %s scored %.4f %.4f; a 0-float output: %s\n", flame_version_string(),
                s[0], s[1], flame_status_string(bad));
    flame_engine_destroy(e);
    flame_model_destroy(m);
    return st == FLAME_OK && s[0] != s[1] && bad != FLAME_OK ? 0 : 1;
}
