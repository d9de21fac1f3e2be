/* Internals of the batch-profile scheduler: jobs (one submitted request) cut into parts (the
 * request, or a slice of its candidates), a FIFO of parts, and the profile arithmetic that
 * decides which parts form a batch. */
#ifndef FLAME_SCHED_SCHED_H
#define FLAME_SCHED_SCHED_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/common.h"
#include "metrics/histogram.h"

/* ---- profiles (profiles.c) */
typedef struct fl_profiles {
    flame_batch_profile p[FLAME_SCHED_MAX_PROFILES];
    int n;
    uint32_t max_candidates; /* the largest max_candidates: longer requests are split */
    uint32_t max_users;      /* the largest max_users: the most parts of one batch */
    bool count_candidates;   /* false under the dot head: only users bound a batch */
} fl_profiles;

/* Checks and copies the profiles (NULL with 0: the defaults); FLAME_ERR_INVALID_ARG naming
 * the bad one. */
flame_status fl_profiles_init(fl_profiles *ps, const flame_batch_profile *p, size_t n, bool count_candidates);
/* The smallest profile (max_users * max_candidates, then the first given) that holds `users`
 * requests of at most `candidates` candidates each; -1 if none does. */
int fl_profiles_fit(const fl_profiles *ps, uint64_t users, uint64_t candidates);
/* Parts a request of n candidates is cut into (1 when it fits whole); a kv_cache request is
 * kept whole but still holds this many places of max_queue. */
size_t fl_profiles_parts(const fl_profiles *ps, size_t n);

/* ---- jobs and parts */
typedef struct fl_job fl_job;

typedef struct fl_part {
    struct fl_part *next;      /* queue link */
    fl_job *job;
    size_t cand_off, cand_n;   /* the job's candidates [cand_off, cand_off + cand_n) */
    const flame_bags *cand_side; /* this slice's candidate bags (rebased), or the request's own */
    size_t weight;             /* places of max_queue it holds: 1, or for a kv_cache request kept
                                * whole the parts it would have been cut into */
} fl_part;

struct fl_job {
    flame_request req;         /* the caller's request in this header's layout */
    float *scores;             /* the caller's output */
    float *gather;             /* split jobs: the private output copied to scores when all parts succeeded */
    flame_score_done_fn done;
    void *user;
    uint64_t submit_us;
    uint64_t deadline_us;      /* on the scheduler's clock; UINT64_MAX = none */
    uint64_t id;               /* the ticket */
    int level;                 /* index into flame_scheduler.levels (0 = highest) */
    size_t taken;              /* parts gone to a worker (under the lock): cancellable while 0 */
    atomic_size_t parts_left;
    atomic_int status;         /* FLAME_OK until the first part fails */
    char message[512];         /* that failure's message (written by the part that set status) */
    bool pooled;               /* from the scheduler's pool of one-part jobs (returned there, not freed) */
    struct fl_job *pool_next;  /* the pool's free list */
    size_t nparts;
    fl_part parts[];           /* then the rebased bags and gather (one allocation) */
};

/* ---- priority levels (queue.c): one FIFO of parts per level */
#define FL_LEVELS 3            /* FLAME_PRIORITY_HIGH, _NORMAL, _LOW */

typedef struct fl_level {
    fl_part *head, *tail;
    uint64_t queued;           /* places of max_queue its parts hold (fl_part.weight) */
    uint32_t bypassed;         /* batches of higher levels taken while this level waited */
    uint64_t last_arrival;     /* the scheduler's clock at the latest push (0: none yet) */
    double gap_us;             /* moving average of the gaps between pushes (the adaptive wait) */
    /* the batch forming at the head (fl_queue_form), kept up to date by pushes so that a
     * submit can tell whether it closed the batch without walking the queue; form_ok false:
     * to be recomputed (after a take, an expiry or a cancel) */
    bool form_ok, form_closed;
    size_t form_n;
    uint64_t form_cands;
} fl_level;

/* A worker thread of the scheduler (scheduler.c). */
typedef struct fl_worker {
    flame_scheduler *s;
    pthread_cond_t cv;    /* this worker's wake-up (CLOCK_MONOTONIC for timed waits) */
    bool has_cv;
    bool asleep;          /* waiting on cv (under the lock) */
    uint64_t wake_at;     /* while asleep: when it looks again by itself (the scheduler's clock;
                           * UINT64_MAX: only when signalled; 0: signalled, about to look) */
    fl_job *recycle;      /* finished pooled jobs, returned to the pool at the next lock */
    fl_part **batch;      /* [profiles.max_users] */
    flame_request *reqs;  /* [profiles.max_users] */
    flame_status *status; /* [profiles.max_users]: a batch scored part by part */
    char **message;       /* [profiles.max_users]: their failures' messages */
    float *out;           /* the batch's scores, scattered to the jobs */
    size_t out_cap;
} fl_worker;

/* The clock of deadlines and waits (injectable for the tests: fl_sched_set_clock). */
typedef uint64_t (*fl_clock_fn)(void *user);
/* Internal test hook (fl_sched_set_freed_hook): told when the scheduler's memory is freed. */
typedef void (*fl_sched_freed_fn)(void *user);

struct flame_scheduler {
    struct flame_engine *engine;
    fl_profiles profiles;
    int32_t num_tasks;
    uint64_t max_wait_us;
    uint32_t num_workers, max_queue, max_bypass;
    bool adaptive;             /* the wait for company follows the arrival rate (queue.c fl_queue_due) */
    pthread_t *threads;
    uint32_t started;
    bool freed_by_worker;      /* destroyed from one of its workers: that worker frees it on its way out */
    fl_clock_fn clock;
    void *clock_user;
    fl_sched_freed_fn freed_hook; /* tests only (fl_sched_set_freed_hook); NULL otherwise */
    void *freed_user;
    pthread_mutex_t mu;        /* guards the levels, the ids, next_deadline, `stopping`, the
                                * workers' sleep state and the job pool */
    fl_worker *workers;        /* [num_workers]; each sleeps on its own condition variable */
    uint32_t sleepers;         /* workers waiting on their condition variable */
    uint64_t signals;          /* condition-variable signals sent to workers (the tests count them) */
    fl_job *pool;              /* free one-part jobs, reused by submit (no malloc a request) */
    uint32_t pool_n;
    fl_level levels[FL_LEVELS];
    uint64_t queued;           /* places of max_queue the parts of all levels hold */
    uint64_t next_id;          /* the last ticket given */
    uint64_t next_deadline;    /* no queued job's deadline is earlier (UINT64_MAX: none) */
    bool stopping;
    /* set, before `stopping`, by destroy: submit reads it before anything else, since a done
     * callback may submit after another callback of its batch destroyed the scheduler (and then
     * perhaps the engine) */
    atomic_bool closed;
    atomic_uint_fast64_t submitted, completed, failed, rejected, split, parts, batches, isolated;
    atomic_uint_fast64_t timeouts, cancelled, in_flight, candidates, slots_used, slots;
    atomic_uint_fast64_t profile_batches[FLAME_SCHED_MAX_PROFILES];
    fl_histogram latency, queue_wait;
};

/* ---- queue operations (queue.c), all with s->mu held */
/* Appends a job's parts to its level. */
void fl_queue_push(flame_scheduler *s, fl_job *j);
/* The level the next batch comes from (the no-starvation rule); -1 when nothing is queued. */
int fl_queue_pick(const flame_scheduler *s, bool *aged);
/* Removes the first n parts of level `lv` into out[] and counts the batch for the rule. */
void fl_queue_take(flame_scheduler *s, int lv, fl_part **out, size_t n);
/* The parts at the head of level l that form the next batch (>= 1; the level is not empty): as
 * many as some profile holds, in arrival order; a head part no profile holds (a kv_cache
 * request kept whole) alone. *closed: no further part could join (the next
 * one does not fit, or no profile holds one more user). Cached in the level. */
size_t fl_queue_form(flame_scheduler *s, int l, bool *closed);
/* When the batch forming at level l goes at the latest (the scheduler's clock): its oldest
 * part's submit + max_wait_us, or with the adaptive wait, earlier when the level's next
 * arrival is overdue. */
uint64_t fl_queue_due(const flame_scheduler *s, int l);
/* Unlinks every queued part of the jobs whose deadline is at or before `now` into a list
 * (linked by next) and recomputes next_deadline; the caller completes them unlocked. */
fl_part *fl_queue_expire(flame_scheduler *s, uint64_t now);
/* Unlinks the parts of the job with this ticket if none has gone to a worker: the list, or
 * NULL with *running true (some part was taken) or false (not queued). */
fl_part *fl_queue_cancel(flame_scheduler *s, uint64_t id, bool *running);

static inline uint64_t fl_sched_clock(const flame_scheduler *s)
{
    return s->clock(s->clock_user);
}
/* Tests: replaces the clock (before any submit) and wakes the workers after moving it. */
void fl_sched_set_clock(flame_scheduler *s, fl_clock_fn fn, void *user);
void fl_sched_kick(flame_scheduler *s);
/* Tests only, not part of the API: fn(user) runs once s is freed, on the thread that freed it
 * (the destroying one, or after a destroy from a done callback the worker that ran it, on its
 * way out), so a test can wait for the end of a scheduler's life instead of sleeping. Set it
 * before the first submit. */
void fl_sched_set_freed_hook(flame_scheduler *s, fl_sched_freed_fn fn, void *user);

uint64_t fl_sched_now_us(void);

#endif
