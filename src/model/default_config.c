/* The embedded default model: the reference GR ranking architecture (../anchors: 4 blocks,
 * pre-LN, SUMI, 3 sigmoid tasks, 4 single-id features pooled to 64 dims then projected)
 * at d_model 256 / FFN 1024 / 4 heads, so a 2-core CPU scores a request in milliseconds. */
#include "core/common.h"

static const char default_config[] =
    "{\"format\": \"flame\", \"version\": 1, \"d_model\": 256, \"max_len\": 256,\n"
    " \"tables\": [{\"name\": \"item\", \"rows\": 100000, \"dim\": 64},\n"
    "            {\"name\": \"artist\", \"rows\": 20000, \"dim\": 64},\n"
    "            {\"name\": \"album\", \"rows\": 50000, \"dim\": 64},\n"
    "            {\"name\": \"genre\", \"rows\": 500, \"dim\": 64}],\n"
    " \"features\": [{\"name\": \"item\", \"table\": \"item\", \"input\": \"item\", \"pooling\": \"sum\"},\n"
    "              {\"name\": \"artist\", \"table\": \"artist\", \"input\": \"side\", \"pooling\": \"sum\"},\n"
    "              {\"name\": \"album\", \"table\": \"album\", \"input\": \"side\", \"pooling\": \"sum\"},\n"
    "              {\"name\": \"genre\", \"table\": \"genre\", \"input\": \"side\", \"pooling\": \"mean\"}],\n"
    " \"combine\": \"sum\", \"projection\": true,\n"
    " \"position\": {\"rule\": \"from_recent\", \"rows\": 257, \"candidate_position\": 256},\n"
    " \"input_layernorm\": false,\n"
    " \"blocks\": {\"count\": 4, \"num_heads\": 4, \"ffn_dim\": 1024, \"norm\": \"pre\", \"activation\": \"gelu_erf\"},\n"
    " \"final_layernorm\": true,\n"
    " \"layernorm\": {\"eps\": 1e-5, \"eps_inside_sqrt\": true},\n"
    " \"head\": {\"type\": \"sumi\", \"tasks\": [\n"
    "    {\"name\": \"click\", \"hidden\": [128], \"activation\": \"relu\"},\n"
    "    {\"name\": \"like\", \"hidden\": [128], \"activation\": \"relu\"},\n"
    "    {\"name\": \"full_play\", \"hidden\": [128], \"activation\": \"relu\"}]}}\n";

FLAME_API const char *flame_default_model_config(void)
{
    return default_config;
}
