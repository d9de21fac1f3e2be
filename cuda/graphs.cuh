// CUDA graphs of an executor's passes, replayed by signature: a signature is whatever fixes
// every pointer and launch parameter of a pass (cuda/forward.cu builds it), so two passes with
// equal signatures can replay one captured graph with only the uploaded data differing.
#pragma once

#include <atomic>
#include <vector>

#include "common.cuh"

struct fl_graph {
    std::vector<int64_t> signature;
    cudaGraphExec_t exec = nullptr;
    uint64_t last_use = 0;
};

// One executor's graphs (its stream's; used by one thread at a time, as the executor is).
// The first pass of a signature runs eagerly and is only remembered, the second is captured and
// replayed, so one-off shapes (a varying history length) never pay for a capture (hundreds of
// us) nor hold a graph. At most MAX graphs, the least recently used dropped; at most MAX_SEEN
// signatures remembered, the oldest dropped.
struct fl_graph_cache {
    static constexpr size_t MAX = 32, MAX_SEEN = 32;
    std::vector<fl_graph> graphs;
    std::vector<std::vector<int64_t>> seen;
    uint64_t clock = 0;
    std::atomic<uint64_t> captures{0}, replays{0}; // read by the stats from other threads
};

// Destroys every graph (the buffers they point into are about to move or go).
void fl_graph_clear(fl_graph_cache *c);

// Replays the graph of `sig` on s, capturing it first if `sig` was seen once before (enqueue
// then runs under stream capture and must enqueue the whole pass on s). *done false: the caller
// runs the pass uncaptured (the first sight of the signature, or a capture that failed, which
// is logged as a warning). A status is returned only for a failing CUDA call outside capture.
template <typename F>
flame_status fl_graph_run(fl_graph_cache *c, cudaStream_t s, const std::vector<int64_t> &sig, F &&enqueue, bool *done)
{
    *done = false;
    fl_graph *hit = nullptr;
    for (fl_graph &gr : c->graphs)
        if (gr.signature == sig) hit = &gr;
    if (!hit) {
        bool seen = false;
        for (size_t i = 0; i < c->seen.size() && !seen; i++)
            if (c->seen[i] == sig) {
                seen = true;
                c->seen.erase(c->seen.begin() + (long)i);
            }
        if (!seen) {
            if (c->seen.size() == fl_graph_cache::MAX_SEEN) c->seen.erase(c->seen.begin()); // the oldest
            c->seen.push_back(sig);
            return FLAME_OK;
        }
        cudaGraph_t graph = nullptr;
        FL_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        const flame_status st = enqueue();
        cudaError_t e = cudaStreamEndCapture(s, &graph);
        cudaGraphExec_t exec = nullptr;
        if (!st && e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (st || e != cudaSuccess) { // not capturable: say so in the log, run uncaptured
            (void)cudaGetLastError();
            fl_log(FLAME_LOG_WARN, "CUDA graph capture failed (%s); running uncaptured",
                   st ? flame_last_error() : cudaGetErrorString(e));
            return FLAME_OK;
        }
        if (c->graphs.size() == fl_graph_cache::MAX) { // drop the least recently used
            size_t lru = 0;
            for (size_t i = 1; i < c->graphs.size(); i++)
                if (c->graphs[i].last_use < c->graphs[lru].last_use) lru = i;
            cudaGraphExecDestroy(c->graphs[lru].exec);
            c->graphs.erase(c->graphs.begin() + (long)lru);
        }
        c->graphs.push_back({sig, exec, 0});
        hit = &c->graphs.back();
        c->captures++;
    }
    hit->last_use = ++c->clock;
    FL_CUDA_TRY(cudaGraphLaunch(hit->exec, s));
    c->replays++;
    *done = true;
    return FLAME_OK;
}
