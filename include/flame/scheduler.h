/*
 * libflame: the batch-profile scheduler.
 *
 * Part of the public API; included by flame/flame.h, and usable on its own. The conventions at
 * the top of flame/flame.h (statuses, ownership, units, the struct_size rule) hold here too.
 *
 * Dynamic batching in front of an engine (the stream orchestrator of FLAME, arXiv:2509.22681):
 * serving threads submit one user's request at a time; the scheduler groups queued requests
 * into batches that fit one of its batch profiles (at most max_users requests of at most
 * max_candidates candidates each), splits a request with more candidates than any profile
 * holds into parts (except one scored against the engine's KV cache, kv_cache = 1, which goes
 * whole: a batch of its own when no profile holds it), optionally waits up to max_wait_us for
 * a batch to fill when traffic is
 * low, and runs each batch as one flame_score_batch call on one of its worker threads (on a
 * GPU engine, one worker per executor, so consecutive batches overlap). docs/scheduler.md.
 */
#ifndef FLAME_SCHEDULER_H
#define FLAME_SCHEDULER_H

#include "flame/flame.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flame_scheduler flame_scheduler;

#define FLAME_SCHED_MAX_PROFILES 16

/* A batch shape: up to max_users requests (users) of up to max_candidates candidates each.
 * Under the dot head candidates are not tokens (they are scored by one product against the
 * item table after the encoder), so there requests are never split and only max_users
 * bounds a batch. */
typedef struct flame_batch_profile {
    uint32_t max_users;        /* 1..65536 */
    uint32_t max_candidates;   /* 1..2^24 */
} flame_batch_profile;

/* A field left 0 takes its default, so a zeroed struct (with struct_size set) is valid. */
typedef struct flame_scheduler_params {
    size_t struct_size;                  /* sizeof(flame_scheduler_params) */
    const flame_batch_profile *profiles; /* [num_profiles], copied at creation; NULL with 0 */
    size_t num_profiles;                 /* 1..FLAME_SCHED_MAX_PROFILES; 0 (profiles NULL) = the FLAME
                                          * paper's four: {1,128}, {2,128}, {4,64}, {8,32} */
    int64_t max_wait_us;                 /* longest the oldest queued request waits for its batch to
                                          * fill; 0 (default) = never wait: a free worker takes what is
                                          * queued (concurrent arrivals still batch while workers are
                                          * busy). 0..10000000 */
    uint32_t workers;                    /* threads calling the engine = batches in flight; 0 = the GPU
                                          * engine's executors (FLAME_OPT_CUDA_EXECUTORS), 1 on the CPU
                                          * (its BLAS uses the cores). 1..64 */
    uint32_t max_queue;                  /* parts (requests, or the parts of split ones; a kv_cache
                                          * request kept whole as the parts it would make) waiting at most;
                                          * a submit beyond is refused (load shedding). 0 = 65536 */
    uint32_t max_bypass;                 /* the no-starvation rule of the priority levels: batches of
                                          * higher levels that may go ahead of a waiting lower-level
                                          * request before one batch of its level goes. 0 = 8; 1..65536 */
    uint32_t adaptive_wait;              /* 1: the wait for company follows the arrival rate: a forming
                                          * batch goes once the next request is later than expected
                                          * (an average of the gaps between arrivals), and at the latest
                                          * after max_wait_us (docs/scheduler.md "Adaptive wait").
                                          * 0 (default): always up to max_wait_us. 0..1 */
} flame_scheduler_params;

/* Priority levels (flame_submit_options.priority). A batch holds requests of one level; a free
 * worker takes its batch from the highest level with queued requests, except that a level
 * whose requests have waited through max_bypass batches of higher levels goes next
 * (docs/scheduler.md "Priorities"). */
#define FLAME_PRIORITY_HIGH 1
#define FLAME_PRIORITY_NORMAL 0
#define FLAME_PRIORITY_LOW (-1)

/* Per-request admission options of flame_scheduler_submit_ex. A field left 0 takes its
 * default, so a zeroed struct (with struct_size set) is a plain submit. */
typedef struct flame_submit_options {
    size_t struct_size;        /* sizeof(flame_submit_options) */
    int32_t priority;          /* FLAME_PRIORITY_LOW, _NORMAL (0, default) or _HIGH */
    int64_t timeout_us;        /* deadline relative to the submit, us; 0 = none; 1..2^40 */
    uint64_t deadline_us;      /* absolute deadline on flame_scheduler_now_us's clock, us; 0 = none.
                                * With both set, the earlier one holds */
} flame_submit_options;

/* Called once per submitted request, on a worker thread (for flame_scheduler_cancel, on the
 * cancelling thread), when its scores are written (status FLAME_OK) or it failed (a status of flame_score_batch; `message` then says why, valid only
 * during the call; NULL on success). It should return quickly (the worker scores nothing
 * meanwhile). It may submit; flame_scheduler_score of the same scheduler is refused there
 * (it would wait for the worker it runs on); flame_scheduler_destroy of the same scheduler
 * is allowed (see there). */
typedef void (*flame_score_done_fn)(void *user, flame_status status, const char *message);

/*
 * flame_scheduler_create: a scheduler over an engine, with its workers started.
 *
 * Parameters:
 *   engine   the engine the batches run on; borrowed: it must outlive the scheduler.
 *   params   read by the struct_size rule and copied (profiles too); NULL = the defaults.
 *   out      receives the scheduler; the caller's, freed with flame_scheduler_destroy.
 * Thread-safety: thread-safe. On the scheduler made, submit, score, get_stats and
 *   reset_latency may be called concurrently from any threads; destroy must not run
 *   concurrently with them (but see flame_scheduler_destroy for done callbacks).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL engine or out, struct_size outside 8..4096,
 *   profiles NULL with num_profiles > 0 or set with 0, a value out of its range above: the
 *   message names it); FLAME_ERR_NOMEM; FLAME_ERR_INTERNAL (a worker thread could not be
 *   started). On failure *out is NULL.
 */
FLAME_API flame_status flame_scheduler_create(flame_engine *engine, const flame_scheduler_params *params,
                                              flame_scheduler **out);

/*
 * flame_scheduler_destroy: drains and frees a scheduler.
 *
 * Stops taking requests (submits from then on get FLAME_ERR_UNAVAILABLE), scores every request
 * already queued (each done callback runs), joins the workers and frees the scheduler.
 *
 * Parameters:
 *   scheduler  the caller's scheduler; NULL is a no-op.
 * Thread-safety: not concurrently with other calls on the scheduler, except from one of its
 *   own done callbacks (e.g. by a host language's garbage collector): it then returns once
 *   every queued request is scored and no batch will use the engine any more; the remaining
 *   callbacks of the calling worker's batch still run, and that worker frees the scheduler
 *   when it is through. Call it once per scheduler: a second call, from another thread or
 *   another done callback (two workers' callbacks each destroying it would wait for each
 *   other), is undefined, as freeing memory twice is.
 * Returns: nothing.
 */
FLAME_API void flame_scheduler_destroy(flame_scheduler *scheduler);

/*
 * flame_scheduler_submit: queues one request; done runs when it is scored.
 *
 * Batching: a request joins the batch being formed in arrival order (no overtaking) while
 * some profile holds the batch with it; the batch goes to a worker when no further request
 * could join it, when the next queued one does not fit, or when its oldest request has waited
 * max_wait_us. A request with more candidates than the largest max_candidates is split into
 * ceil(n / largest) parts of equal size (within one), scored as separate requests of the same
 * user (candidates never see each other under SUMI, so the scores are those of the whole
 * request, up to the float rounding of another batch shape). A request with kv_cache = 1 on an
 * engine with the KV cache (FLAME_OPT_KV_CACHE_BYTES) is never split: it is one job and one
 * engine call, so one cache lookup and one gather of the cached K/V (parts would each look up
 * and gather again, and on a miss compute the history again); no profile holding it, it is a
 * batch of its own, and the engine scores its candidates in chunks of the largest
 * max_candidates (this scheduler's profiles, given to the engine at creation; the last created
 * scheduler's where several share an engine). It holds ceil(n / largest) places of max_queue,
 * as many as its parts would. A batch whose flame_score_batch
 * fails with FLAME_ERR_INVALID_ARG is scored request by request, so one bad request fails
 * alone and the others succeed; any other failure (FLAME_ERR_UNAVAILABLE of a feature store,
 * FLAME_ERR_NOMEM) fails every request of the batch. A request without candidates is only
 * validated, on the calling thread: done runs before submit returns, with the status
 * flame_score would give it.
 *
 * Parameters:
 *   scheduler   the scheduler.
 *   request     copied (as flame_score reads it: the struct_size rule); the arrays it points
 *               to are borrowed until done runs and must stay unchanged.
 *   scores      output as flame_score's, float32 [num_candidates, num_tasks]; the caller's,
 *               borrowed until done runs. Nothing is written on failure (the parts of a
 *               split request are gathered privately and copied out when all succeeded).
 *   scores_len  capacity of scores in floats.
 *   done        called exactly once, on a worker thread (flame_score_done_fn), when submit
 *               returned FLAME_OK.
 *   user        passed to done unchanged.
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK (done will run exactly once); FLAME_ERR_INVALID_ARG (NULL scheduler,
 *   request or done, NULL scores or candidates with num_candidates > 0, struct_size outside
 *   8..4096, a non-zero reserved0 of the request, num_side_features other than the model's,
 *   more candidates than 2^24, broken
 *   candidate bags of a request to be split, more parts than max_queue);
 *   FLAME_ERR_BUFFER_TOO_SMALL (scores_len < num_candidates * num_tasks); FLAME_ERR_UNAVAILABLE
 *   (max_queue parts are waiting, or the scheduler is being destroyed: shed load);
 *   FLAME_ERR_NOMEM. On any failure done is not called and nothing is queued.
 */
FLAME_API flame_status flame_scheduler_submit(flame_scheduler *scheduler, const flame_request *request, float *scores,
                                              size_t scores_len, flame_score_done_fn done, void *user);

/*
 * flame_scheduler_submit_ex: flame_scheduler_submit with a priority, a deadline and a ticket.
 *
 * Parameters:
 *   scheduler  the scheduler.
 *   request    as flame_scheduler_submit (copied; its arrays and scores stay valid until done).
 *   scores     [num_candidates * num_tasks] float32 output, written only on FLAME_OK.
 *   scores_len capacity of scores in floats.
 *   options    priority and deadline (NULL = a plain submit); read by the struct_size rule.
 *   done       the completion callback, as flame_scheduler_submit.
 *   user       its argument.
 *   ticket     out (may be NULL): the request's handle for flame_scheduler_cancel, unique
 *              within the scheduler, never 0; 0 for a request without candidates (done already ran).
 * Thread-safety: as flame_scheduler_submit.
 * Returns: the statuses of flame_scheduler_submit; FLAME_ERR_INVALID_ARG also for a priority
 *   other than the three levels, a timeout_us outside 0..2^40 (the message names the value).
 *   Once accepted (FLAME_OK), done runs exactly once whatever happens: with the request's
 *   scoring status; FLAME_ERR_TIMEOUT when its deadline passes before its batch starts (scores
 *   not written; a request already in a running batch completes); FLAME_ERR_CANCELLED when
 *   cancelled; and at destroy (which still scores what is queued, deadlines applying).
 *   A deadline is noticed by the next worker that is free (immediately when one is idle; at
 *   the latest when a running batch ends), and done then runs on that worker.
 */
FLAME_API flame_status flame_scheduler_submit_ex(flame_scheduler *scheduler, const flame_request *request,
                                                 float *scores, size_t scores_len,
                                                 const flame_submit_options *options, flame_score_done_fn done,
                                                 void *user, uint64_t *ticket);

/*
 * flame_scheduler_cancel: withdraws a queued request.
 *
 * Parameters:
 *   scheduler  the scheduler.
 *   ticket     what flame_scheduler_submit_ex returned for the request.
 * Thread-safety: thread-safe, also from a done callback. A request is cancelled only while no
 *   part of it has gone to a worker; its done runs with FLAME_ERR_CANCELLED on the calling
 *   thread before this returns (nothing is written to its scores). O(queued parts).
 * Returns: FLAME_OK when the request was cancelled; FLAME_ERR_UNAVAILABLE when it is no longer
 *   queued (it, or a part of a split one, is being scored, or it completed: done has run or will
 *   run with its own status); FLAME_ERR_INVALID_ARG for a NULL scheduler or a ticket this scheduler never gave
 *   (0, or above the last one; the message names it).
 */
FLAME_API flame_status flame_scheduler_cancel(flame_scheduler *scheduler, uint64_t ticket);

/*
 * flame_scheduler_now_us: the scheduler's clock, for absolute deadlines.
 *
 * Parameters:
 *   scheduler  the scheduler.
 * Thread-safety: thread-safe.
 * Returns: microseconds on CLOCK_MONOTONIC (the clock of flame_submit_options.deadline_us); 0
 *   for NULL.
 */
FLAME_API uint64_t flame_scheduler_now_us(const flame_scheduler *scheduler);

/*
 * flame_scheduler_score: submits and waits (flame_score through the scheduler).
 *
 * For callers that block anyway; the request is batched with others as a submit is.
 *
 * Parameters:
 *   scheduler   the scheduler.
 *   request     as flame_scheduler_submit; borrowed for the call.
 *   scores      output as flame_score's; the caller's.
 *   scores_len  capacity of scores in floats.
 * Thread-safety: thread-safe; not from a done callback of the same scheduler.
 * Returns: the request's status (flame_last_error() carries its message on this thread), or
 *   the statuses of flame_scheduler_submit; FLAME_ERR_INVALID_ARG when called from a done
 *   callback of the same scheduler (it would wait for the worker it runs on).
 */
FLAME_API flame_status flame_scheduler_score(flame_scheduler *scheduler, const flame_request *request, float *scores,
                                             size_t scores_len);

/*
 * flame_scheduler_score_ex: flame_scheduler_score with a priority and a deadline.
 *
 * Submits as flame_scheduler_submit_ex does and waits for the request's done (a request
 * server's handler that blocks per request needs no callback of its own).
 *
 * Parameters:
 *   scheduler   the scheduler.
 *   request     as flame_scheduler_submit; borrowed for the call.
 *   scores      output as flame_score's, float32 [num_candidates * num_tasks]; the caller's;
 *               written only when FLAME_OK is returned.
 *   scores_len  capacity of scores in floats.
 *   options     priority and deadline as flame_scheduler_submit_ex's (NULL = none); read by
 *               the struct_size rule.
 * Thread-safety: thread-safe; not from a done callback of the same scheduler.
 * Returns: as flame_scheduler_score; FLAME_ERR_TIMEOUT when the deadline passed before the
 *   request's batch started (scores not written); the option errors of
 *   flame_scheduler_submit_ex.
 */
FLAME_API flame_status flame_scheduler_score_ex(flame_scheduler *scheduler, const flame_request *request,
                                                float *scores, size_t scores_len, const flame_submit_options *options);

typedef struct flame_scheduler_stats {
    size_t struct_size;             /* sizeof(flame_scheduler_stats) */
    uint64_t submitted;             /* requests queued (submit returned FLAME_OK) */
    uint64_t completed;             /* requests done with FLAME_OK */
    uint64_t failed;                /* requests done with an error of scoring (not timeouts, cancels) */
    uint64_t rejected;              /* submits refused with FLAME_ERR_UNAVAILABLE (queue full, stopping) */
    uint64_t split;                 /* requests split into parts */
    uint64_t parts;                 /* parts scored (a request not split is one part) */
    uint64_t batches;               /* flame_score_batch calls (isolating retries not counted) */
    uint64_t isolated;              /* batches rescored request by request after FLAME_ERR_INVALID_ARG */
    uint64_t queued;                /* parts waiting now (a kv_cache request kept whole: as its parts) */
    uint64_t profile_batches[FLAME_SCHED_MAX_PROFILES]; /* batches by the smallest profile holding them
                                                         * (profiles in the order given) */
    /* Latency, in us, of the requests completed since creation or the last
     * flame_scheduler_reset_latency: from submit to the start of done (latency_*) and, per
     * part, from submit to the start of its batch (queue_wait_*). Log-linear buckets: a
     * percentile is within 1/16 (6.25%) of the true value, rounded up. 0 when none. */
    uint64_t latency_p50_us, latency_p99_us, latency_max_us;
    uint64_t queue_wait_p50_us, queue_wait_p99_us;
    /* admission (flame_scheduler_submit_ex); `failed` counts neither */
    uint64_t timeouts;              /* requests done with FLAME_ERR_TIMEOUT */
    uint64_t cancelled;             /* requests done with FLAME_ERR_CANCELLED */
    uint64_t in_flight;             /* batches being scored now */
    uint64_t candidates;            /* candidates of the requests queued (submit returned FLAME_OK) */
    /* batch fill: per batch, the candidates it holds (users under the dot head) and the
     * capacity of its profile (max_users x max_candidates; max_users under the dot head);
     * batch_slots_used / batch_slots is the mean fill ratio */
    uint64_t batch_slots_used, batch_slots;
} flame_scheduler_stats;

/*
 * flame_scheduler_get_stats: the scheduler's counters and latency percentiles.
 *
 * Parameters:
 *   scheduler  the scheduler.
 *   stats      written up to stats->struct_size bytes (the struct_size rule); the caller sets
 *              struct_size.
 * Thread-safety: thread-safe (counters read one by one, not as one snapshot).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL scheduler or stats, stats->struct_size outside
 *   8..4096; *stats untouched).
 * Math: percentiles from log-linear histograms (16 sub-buckets per power of two, as
 *   HdrHistogram), within 1/16 of the true value, rounded up.
 */
FLAME_API flame_status flame_scheduler_get_stats(flame_scheduler *scheduler, flame_scheduler_stats *stats);

/*
 * flame_scheduler_reset_latency: empties the latency histograms.
 *
 * The percentiles then cover what completes from now on: a monitoring loop calls this after
 * each read. Counters are not reset.
 *
 * Parameters:
 *   scheduler  the scheduler.
 * Thread-safety: thread-safe (requests completing meanwhile land in either window).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL scheduler).
 */
FLAME_API flame_status flame_scheduler_reset_latency(flame_scheduler *scheduler);

#ifdef __cplusplus
}
#endif
#endif /* FLAME_SCHEDULER_H */
