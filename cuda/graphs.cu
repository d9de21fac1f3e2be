// CUDA graphs of an executor's passes (graphs.cuh).
#include "graphs.cuh"

void fl_graph_clear(fl_graph_cache *c)
{
    for (fl_graph &gr : c->graphs) cudaGraphExecDestroy(gr.exec);
    c->graphs.clear();
}
