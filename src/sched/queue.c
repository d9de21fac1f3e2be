/* The scheduler's queue: one FIFO of parts per priority level, the no-starvation rule that
 * picks the level of the next batch, deadlines and cancellation. Every function runs with
 * the scheduler's lock held; completing what they unlink (callbacks) is the caller's, unlocked. */
#include "sched/sched.h"

/* Weight of the newest gap in the moving average: 1/8, so a change of rate shows within about
 * eight arrivals and one straggler moves it by an eighth. */
#define GAP_WEIGHT 0.125

void fl_queue_push(flame_scheduler *s, fl_job *j)
{
    fl_level *lv = &s->levels[j->level];
    /* the arrival-rate estimate: gaps are capped at max_wait (a longer one only says "low
     * traffic", which max_wait already stands for); before any, traffic counts as low */
    const double cap = (double)s->max_wait_us;
    if (lv->last_arrival) {
        double gap = (double)(j->submit_us - lv->last_arrival);
        lv->gap_us += GAP_WEIGHT * ((gap < cap ? gap : cap) - lv->gap_us);
    } else {
        lv->gap_us = cap;
    }
    lv->last_arrival = j->submit_us;
    if (lv->form_ok && !lv->form_closed) /* the forming batch grows by these parts while they fit */
        for (size_t k = 0; k < j->nparts; k++) {
            const uint64_t c = j->parts[k].cand_n > lv->form_cands ? j->parts[k].cand_n : lv->form_cands;
            if (fl_profiles_fit(&s->profiles, lv->form_n + 1, c) < 0) {
                if (lv->form_n == 0) { /* a whole KV-cache request larger than every profile: alone */
                    lv->form_n = 1;
                    lv->form_cands = c;
                }
                lv->form_closed = true;
                break;
            }
            lv->form_n++;
            lv->form_cands = c;
            lv->form_closed = fl_profiles_fit(&s->profiles, lv->form_n + 1, c) < 0;
            if (lv->form_closed) break;
        }
    for (size_t k = 0; k + 1 < j->nparts; k++) j->parts[k].next = &j->parts[k + 1];
    j->parts[j->nparts - 1].next = NULL;
    if (lv->tail) lv->tail->next = &j->parts[0];
    else lv->head = &j->parts[0];
    lv->tail = &j->parts[j->nparts - 1];
    uint64_t weight = 0;
    for (size_t k = 0; k < j->nparts; k++) weight += j->parts[k].weight;
    lv->queued += weight;
    s->queued += weight;
    if (j->deadline_us < s->next_deadline) s->next_deadline = j->deadline_us;
}

/* The highest level with queued parts, unless a lower one has been bypassed max_bypass times:
 * then the lowest such level (it has waited longest by the rule's count). */
int fl_queue_pick(const flame_scheduler *s, bool *aged)
{
    *aged = false;
    for (int l = FL_LEVELS - 1; l > 0; l--)
        if (s->levels[l].head && s->levels[l].bypassed >= s->max_bypass) {
            *aged = true;
            return l;
        }
    for (int l = 0; l < FL_LEVELS; l++)
        if (s->levels[l].head) return l;
    return -1;
}

void fl_queue_take(flame_scheduler *s, int l, fl_part **out, size_t n)
{
    fl_level *lv = &s->levels[l];
    uint64_t weight = 0;
    for (size_t i = 0; i < n; i++) {
        out[i] = lv->head;
        lv->head = lv->head->next;
        out[i]->job->taken++;
        weight += out[i]->weight;
    }
    if (!lv->head) lv->tail = NULL;
    lv->form_ok = false;
    lv->queued -= weight;
    s->queued -= weight;
    lv->bypassed = 0;
    for (int k = l + 1; k < FL_LEVELS; k++) /* lower levels that waited through this batch */
        if (s->levels[k].head) s->levels[k].bypassed++;
}

/* Unlinks the parts of level lv for which drop(part) holds, appending them to *out; *removed
 * grows by their places of max_queue. */
static void unlink_if(fl_level *lv, bool (*drop)(const fl_part *, const void *), const void *arg, fl_part ***out,
                      uint64_t *removed)
{
    fl_part **link = &lv->head, *prev = NULL;
    while (*link) {
        fl_part *p = *link;
        if (drop(p, arg)) {
            *link = p->next;
            p->next = NULL;
            **out = p;
            *out = &p->next;
            lv->queued -= p->weight;
            lv->form_ok = false;
            *removed += p->weight;
        } else {
            prev = p;
            link = &p->next;
        }
    }
    lv->tail = prev;
    /* the count is of batches the waiting requests saw go ahead: with none left waiting it
     * leaves with them, or the next request of the level would start with their count */
    if (!lv->head) lv->bypassed = 0;
}

static bool expired(const fl_part *p, const void *now)
{
    return p->job->deadline_us <= *(const uint64_t *)now;
}

fl_part *fl_queue_expire(flame_scheduler *s, uint64_t now)
{
    fl_part *list = NULL, **end = &list;
    uint64_t removed = 0, next = UINT64_MAX;
    for (int l = 0; l < FL_LEVELS; l++) {
        unlink_if(&s->levels[l], expired, &now, &end, &removed);
        for (const fl_part *p = s->levels[l].head; p; p = p->next)
            if (p->job->deadline_us < next) next = p->job->deadline_us;
    }
    s->queued -= removed;
    s->next_deadline = next;
    return list;
}

size_t fl_queue_form(flame_scheduler *s, int l, bool *closed)
{
    fl_level *lv = &s->levels[l];
    if (!lv->form_ok) {
        const fl_profiles *ps = &s->profiles;
        size_t n = 0;
        uint64_t cands = 0;
        const fl_part *p = lv->head;
        for (; p; p = p->next) {
            const uint64_t c = p->cand_n > cands ? p->cand_n : cands;
            if (fl_profiles_fit(ps, n + 1, c) < 0) break;
            cands = c;
            n++;
        }
        if (n == 0 && lv->head) { /* a whole KV-cache request larger than every profile: alone (closed: p is it) */
            n = 1;
            cands = lv->head->cand_n;
        }
        lv->form_n = n;
        lv->form_cands = cands;
        lv->form_closed = p != NULL || fl_profiles_fit(ps, n + 1, cands) < 0;
        lv->form_ok = true;
    }
    *closed = lv->form_closed;
    return lv->form_n;
}

uint64_t fl_queue_due(const flame_scheduler *s, int l)
{
    const fl_level *lv = &s->levels[l];
    uint64_t due = lv->head->job->submit_us + s->max_wait_us;
    if (s->adaptive) { /* wait about as long as the next arrival is expected to take */
        const uint64_t expect = lv->last_arrival + (uint64_t)(lv->gap_us + 0.5);
        if (expect < due) due = expect;
    }
    return due;
}

static bool of_job(const fl_part *p, const void *job)
{
    return p->job == job;
}

fl_part *fl_queue_cancel(flame_scheduler *s, uint64_t id, bool *running)
{
    *running = false;
    for (int l = 0; l < FL_LEVELS; l++)
        for (const fl_part *p = s->levels[l].head; p; p = p->next) {
            if (p->job->id != id) continue;
            fl_job *j = p->job;
            if (j->taken) { /* a part is being scored: the request completes as it is */
                *running = true;
                return NULL;
            }
            fl_part *list = NULL, **end = &list;
            uint64_t removed = 0;
            unlink_if(&s->levels[l], of_job, j, &end, &removed);
            s->queued -= removed;
            return list; /* next_deadline may now be early: a sweep then finds nothing and recomputes it */
        }
    return NULL;
}
