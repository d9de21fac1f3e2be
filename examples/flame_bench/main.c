/* flame-bench: a load generator for libflame (docs/scheduler.md "Load generator").
 *   flame-bench [--model FILE | --config JSON] [--device cpu|cuda|cuda:N] [--direct [--threads N]]
 *               [--profiles 8x32,4x64] [--max-wait-us N] [--adaptive] [--workers N] [--timeout-us N]
 *               [--qps Q | --sweep Q1,Q2,... | --sweep auto] [--diurnal] [--seconds S] [--requests N]
 *               [--candidates fixed:N|uniform:A:B|longtail:MEDIAN:MAX] [--history N] [--seed S]
 *               [--csv FILE] [--png FILE] [--json] [--no-overhead | --overhead-only]
 *               [--overhead-qps Q] [--submitters N] [--overhead-users N] [--overhead-wait-us N] [--burst-us N]
 *               [--dtype fp32|fp16|bf16] [--cuda-graphs 0|1] [--engine-profiles UxC[xL],...]
 * Open-loop arrivals (Poisson at each level's rate; --diurnal: the rate swings from peak/6 to
 * the peak and back over the run); each level stops after --seconds or --requests, whichever
 * first. --sweep auto doubles the rate from --qps until the achieved rate falls under 90% of
 * the offered one (saturation). Prints a table per level; --csv and --png (gnuplot) write the
 * levels; --json prints one object: {"levels": [...], "scheduler_overhead_us": ...,
 * "scheduler_cpu": {...}}, where the overhead is the median submit-to-batch-start of a model
 * with one token and one candidate, offered --overhead-qps (100,000/s) by --submitters (2)
 * threads in bursts, and scheduler_cpu the process's CPU time a request in that run, the
 * pass's share measured alone, and the difference (overhead.c). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench.h"
#include "cli_args.h"

#define MAX_LEVELS 32

static void usage(void)
{
    fprintf(stderr,
            "usage: flame-bench [--model FILE | --config JSON] [--device D] [--direct [--threads N]] [--profiles UxC,...]\n"
            "                   [--max-wait-us N] [--adaptive] [--workers N] [--timeout-us N]\n"
            "                   [--qps Q | --sweep Q1,Q2,...|auto] [--diurnal] [--seconds S] [--requests N]\n"
            "                   [--candidates fixed:N|uniform:A:B|longtail:MEDIAN:MAX] [--history N] [--seed S]\n"
            "                   [--csv FILE] [--png FILE] [--json] [--no-overhead | --overhead-only]\n"
            "                   [--overhead-qps Q] [--submitters N] [--overhead-users N] [--overhead-wait-us N]\n"
            "                   [--burst-us N] [--dtype fp32|fp16|bf16] [--cuda-graphs 0|1]\n"
            "                   [--engine-profiles UxC[xL],...]\n");
}

/* A decimal count at *s (digits only: strtoul would take "-1" as 2^64 - 1), at most max;
 * *s moves past it. */
static bool count_at(const char **s, unsigned long max, unsigned *out)
{
    if (**s < '0' || **s > '9') return false;
    char *end;
    errno = 0;
    const unsigned long v = strtoul(*s, &end, 10);
    if (errno || v > max) return false;
    *out = (unsigned)v, *s = end;
    return true;
}

static bool parse_cands(const char *s, cand_dist *d)
{
    unsigned a = 0, b = 0;
    const char *p = s;
    if (!strncmp(s, "fixed:", 6)) {
        p += 6;
        if (!count_at(&p, 100000, &a) || *p) return false;
        *d = (cand_dist){CAND_FIXED, a, a};
    } else {
        const bool uni = !strncmp(s, "uniform:", 8), tail = !strncmp(s, "longtail:", 9);
        if (!uni && !tail) return false;
        p += uni ? 8 : 9;
        if (!count_at(&p, 100000, &a) || *p++ != ':' || !count_at(&p, 100000, &b) || *p) return false;
        *d = (cand_dist){uni ? CAND_UNIFORM : CAND_LONGTAIL, a, b};
    }
    return d->a >= 1 && d->b >= d->a;
}

/* USERSxCANDIDATES[,...]: the number of profiles, or -1 (malformed, or more than the scheduler
 * takes: a list cut short would run another experiment than the one asked for). */
static int parse_profiles(const char *s, flame_batch_profile *p)
{
    int n = 0;
    while (*s) {
        unsigned u, c;
        if (n == FLAME_SCHED_MAX_PROFILES || !count_at(&s, UINT32_MAX, &u) || *s++ != 'x' ||
            !count_at(&s, UINT32_MAX, &c))
            return -1;
        p[n++] = (flame_batch_profile){u, c};
        if (*s == ',' && s[1]) s++;
        else if (*s) return -1;
    }
    return n;
}

static bool int_arg(const char *flag, const char *v, long long lo, long long hi, long long *out)
{
    return cli_int("flame-bench", flag, v, lo, hi, out);
}

static bool real_arg(const char *flag, const char *v, double lo, bool lo_open, double hi, double *out)
{
    return cli_real("flame-bench", flag, v, lo, lo_open, hi, out);
}

static void plot(const char *png, const char *csv)
{
    FILE *g = popen("gnuplot", "w");
    if (!g) {
        fprintf(stderr, "flame-bench: --png needs gnuplot (apt-get install gnuplot-nox)\n");
        return;
    }
    fprintf(g, "set terminal png size 900,600\nset output '%s'\nset datafile separator ','\n"
               "set key autotitle columnhead left top\nset xlabel 'achieved requests/s'\nset ylabel 'latency (us)'\n"
               "set logscale y\nset grid\nset title 'flame-bench: latency against throughput'\n"
               "plot '%s' using 2:3 with linespoints title 'P50', '' using 2:5 with linespoints title 'P99', "
               "'' using 2:6 with linespoints title 'P99.9'\n",
            png, csv);
    if (pclose(g) != 0) fprintf(stderr, "flame-bench: gnuplot failed to draw %s\n", png);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *config = NULL, *device = "cpu", *csv = NULL, *png = NULL, *sweep = NULL;
    const char *dtype = NULL, *engine_profiles = NULL; /* FLAME_OPT_BATCH_PROFILES (direct calls too) */
    long long graphs = -1; /* -1: the engine's default */
    bool direct = false, adaptive = false, json = false, diurnal = false, overhead = true, only_overhead = false;
    overhead_opts oo = {.qps = 100000, .seconds = 3, .submitters = 2, .max_users = 64, .burst_us = 1000};
    long long threads = 4, workers = 0, max_wait = 500, history = 20, requests = 100000, seed = 1, timeout_us = 0;
    long long submitters = oo.submitters, users = oo.max_users, ovh_wait = 0;
    double qps = 200, seconds = 5;
    cand_dist cands = {CAND_LONGTAIL, 16, 512};
    flame_batch_profile profiles[FLAME_SCHED_MAX_PROFILES];
    int nprof = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "--direct")) direct = true;
        else if (!strcmp(a, "--adaptive")) adaptive = true;
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--diurnal")) diurnal = true;
        else if (!strcmp(a, "--no-overhead")) overhead = false;
        else if (!strcmp(a, "--overhead-only")) only_overhead = true;
        else if (!v) return usage(), 2;
        else if (i++, !strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--config")) config = v; /* a model config (docs/model-format.md), random weights */
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--dtype")) dtype = v;
        else if (!strcmp(a, "--engine-profiles")) engine_profiles = v;
        else if (!strcmp(a, "--cuda-graphs")) ok = int_arg(a, v, 0, 1, &graphs);
        else if (!strcmp(a, "--threads")) ok = int_arg(a, v, 1, 64, &threads);
        else if (!strcmp(a, "--workers")) ok = int_arg(a, v, 0, 256, &workers);
        else if (!strcmp(a, "--max-wait-us")) ok = int_arg(a, v, 0, 10000000, &max_wait);
        else if (!strcmp(a, "--timeout-us")) ok = int_arg(a, v, 0, 1000000000000LL, &timeout_us);
        else if (!strcmp(a, "--history")) ok = int_arg(a, v, 0, 100000, &history);
        else if (!strcmp(a, "--qps")) ok = real_arg(a, v, 0, true, 1e7, &qps);
        else if (!strcmp(a, "--sweep")) sweep = v;
        else if (!strcmp(a, "--seconds")) ok = real_arg(a, v, 0, true, 86400, &seconds);
        else if (!strcmp(a, "--requests")) ok = int_arg(a, v, 1, 50000000, &requests);
        else if (!strcmp(a, "--seed")) ok = int_arg(a, v, 0, INT64_MAX, &seed);
        else if (!strcmp(a, "--overhead-qps")) ok = real_arg(a, v, 0, true, 1e7, &oo.qps);
        else if (!strcmp(a, "--submitters")) ok = int_arg(a, v, 1, 16, &submitters);
        else if (!strcmp(a, "--overhead-users")) ok = int_arg(a, v, 1, 65536, &users);
        else if (!strcmp(a, "--overhead-wait-us")) ok = int_arg(a, v, 0, 10000000, &ovh_wait);
        else if (!strcmp(a, "--burst-us")) ok = real_arg(a, v, 1, false, 1e6, &oo.burst_us);
        else if (!strcmp(a, "--csv")) csv = v;
        else if (!strcmp(a, "--png")) png = v;
        else if (!strcmp(a, "--candidates")) {
            if (!parse_cands(v, &cands)) {
                fprintf(stderr, "flame-bench: --candidates '%s': expected fixed:N, uniform:A:B or longtail:MEDIAN:MAX "
                                "(1 <= A <= B <= 100000)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--profiles")) {
            if ((nprof = parse_profiles(v, profiles)) <= 0) {
                fprintf(stderr, "flame-bench: --profiles '%s': expected up to %d USERSxCANDIDATES, comma-separated\n", v,
                        FLAME_SCHED_MAX_PROFILES);
                return 2;
            }
        } else return usage(), 2;
        if (!ok) return 2;
    }
    oo.submitters = (uint32_t)submitters, oo.max_users = (uint32_t)users, oo.max_wait_us = ovh_wait;
    double levels[MAX_LEVELS];
    int nlev = 0;
    const bool auto_sweep = sweep && !strcmp(sweep, "auto");
    if (sweep && !auto_sweep) {
        if (!*sweep) {
            fprintf(stderr, "flame-bench: --sweep '': expected rates in (0, 1e7], comma-separated, or auto\n");
            return 2;
        }
        for (const char *s = sweep; *s;) {
            char *end;
            const double q = strtod(s, &end);
            if (end == s || !isfinite(q) || q <= 0 || q > 1e7 || nlev == MAX_LEVELS || (*end && *end != ',') ||
                (*end == ',' && !end[1])) {
                fprintf(stderr, "flame-bench: --sweep '%s': expected up to %d rates in (0, 1e7], comma-separated, "
                                "or auto\n", sweep, MAX_LEVELS);
                return 2;
            }
            levels[nlev++] = q;
            s = *end == ',' ? end + 1 : end;
        }
    } else {
        levels[nlev++] = qps;
    }
    flame_model *m = NULL;
    flame_config *cfg = NULL;
    flame_engine *e = NULL;
    flame_scheduler *s = NULL;
    flame_status st = model_path ? flame_model_load(model_path, &m)
                                 : flame_model_create_random(config ? config : flame_default_model_config(), 1, &m);
    if (!st) st = flame_config_create(&cfg);
    if (!st) st = flame_config_set_string(cfg, FLAME_OPT_DEVICE, device);
    if (!st && dtype) st = flame_config_set_string(cfg, FLAME_OPT_DTYPE, dtype);
    if (!st && engine_profiles) st = flame_config_set_string(cfg, FLAME_OPT_BATCH_PROFILES, engine_profiles);
    if (!st && graphs >= 0) st = flame_config_set_int(cfg, FLAME_OPT_CUDA_GRAPHS, graphs);
    if (!st) st = flame_engine_create(m, cfg, &e);
    flame_scheduler_params sp = {.struct_size = sizeof sp, .profiles = nprof ? profiles : NULL,
                                 .num_profiles = (size_t)nprof, .max_wait_us = max_wait, .workers = (uint32_t)workers,
                                 .adaptive_wait = adaptive};
    if (!st && !direct) st = flame_scheduler_create(e, &sp, &s);
    flame_model_info info = {.struct_size = sizeof info};
    if (!st) st = flame_model_get_info(m, &info);
    flame_config_destroy(cfg);
    if (st) {
        fprintf(stderr, "flame-bench: %s\n", flame_last_error());
        flame_scheduler_destroy(s), flame_engine_destroy(e), flame_model_destroy(m);
        return 1;
    }
    FILE *out = json ? stderr : stdout; /* with --json, stdout holds the JSON alone */
    fprintf(out, "%s, %s; candidates %s %u..%u, history %lld; %s\n", model_path ? model_path : config ? "a random model of --config" : "embedded default model",
            device, cands.kind == CAND_FIXED ? "fixed" : cands.kind == CAND_UNIFORM ? "uniform" : "long-tailed",
            cands.a, cands.b, history,
            direct ? "direct calls" : adaptive ? "scheduler, adaptive wait" : "scheduler, fixed wait");
    fprintf(out, "%10s %10s %9s %9s %9s %9s %8s %8s %7s %9s\n", "offered/s", "achieved/s", "p50_us", "p90_us", "p99_us",
            "p99.9_us", "timeouts", "rejected", "batch", "late_p99");
    level_result res[MAX_LEVELS];
    int done = 0;
    for (int k = 0; !only_overhead && k < (auto_sweep ? MAX_LEVELS : nlev); k++) {
        const double rate = auto_sweep ? qps * (double)(1u << k) : levels[k];
        char label[32];
        snprintf(label, sizeof label, "level %d: %.0f/s", k + 1, rate);
        level_opts o = {.engine = e, .sched = s, .threads = (uint32_t)threads, .num_side = info.num_side_features,
                        .num_tasks = info.num_tasks, .num_items = info.num_items, .qps = rate, .diurnal = diurnal,
                        .seconds = seconds, .max_requests = requests, .cands = cands, .history = (uint32_t)history,
                        .timeout_us = timeout_us, .seed = seed + (uint64_t)k, .progress = isatty(2), .label = label};
        if (!run_level(&o, &res[done])) {
            flame_scheduler_destroy(s), flame_engine_destroy(e), flame_model_destroy(m);
            return 1;
        }
        const level_result *r = &res[done++];
        fprintf(out, "%10.0f %10.0f %9.0f %9.0f %9.0f %9.0f %8llu %8llu %7.2f %9.0f\n", r->offered_qps, r->achieved_qps,
                r->p50_us, r->p90_us, r->p99_us, r->p999_us, (unsigned long long)r->timeouts,
                (unsigned long long)r->rejected, r->mean_batch, r->late_p99_us);
        if (r->failed) fprintf(stderr, "flame-bench: %llu requests failed\n", (unsigned long long)r->failed);
        if (auto_sweep && r->achieved_qps < 0.9 * r->offered_qps) break; /* saturated */
        if (auto_sweep && !r->sent) break; /* --seconds too short for one arrival: no level says more */
    }
    overhead_result ov;
    oo.seconds = seconds < 3 ? seconds : 3;
    oo.adaptive = adaptive;
    const bool have_ovh = (overhead || only_overhead) && run_overhead(&oo, &ov);
    if (only_overhead && !have_ovh) {
        flame_scheduler_destroy(s), flame_engine_destroy(e), flame_model_destroy(m);
        return 1;
    }
    if (have_ovh) {
        fprintf(out, "scheduler overhead, 1 token, 1 candidate, profile %ux1, max_wait %lld us%s: offered %.0f/s by %u "
                     "submitters in bursts of %llu, achieved %.0f/s, mean batch %.1f\n",
                oo.max_users, (long long)oo.max_wait_us, oo.adaptive ? " adaptive" : "", ov.offered_qps, ov.submitters,
                (unsigned long long)ov.burst, ov.achieved_qps, ov.mean_batch);
        fprintf(out, "  median submit to batch start %.0f us; CPU time a request: workers %.2f us, of which the pass "
                     "%.2f us, and in submit %.2f us: the scheduler %.2f us\n",
                ov.queue_wait_p50_us, ov.worker_cpu_us, ov.pass_cpu_us, ov.submit_cpu_us, ov.sched_cpu_us);
    }
    if (csv || png) {
        const char *path = csv ? csv : "/tmp/flame-bench.csv";
        FILE *f = fopen(path, "w");
        if (!f) {
            perror(path);
            flame_scheduler_destroy(s), flame_engine_destroy(e), flame_model_destroy(m);
            return 1;
        }
        fprintf(f, "offered_qps,achieved_qps,p50_us,p90_us,p99_us,p999_us,timeouts,rejected,mean_batch\n");
        for (int k = 0; k < done; k++)
            fprintf(f, "%.1f,%.1f,%.0f,%.0f,%.0f,%.0f,%llu,%llu,%.3f\n", res[k].offered_qps, res[k].achieved_qps,
                    res[k].p50_us, res[k].p90_us, res[k].p99_us, res[k].p999_us, (unsigned long long)res[k].timeouts,
                    (unsigned long long)res[k].rejected, res[k].mean_batch);
        fclose(f);
        if (png) plot(png, path);
    }
    if (json) {
        printf("{\"levels\":[");
        for (int k = 0; k < done; k++)
            printf("%s{\"offered_qps\":%.1f,\"achieved_qps\":%.1f,\"p50_us\":%.0f,\"p90_us\":%.0f,\"p99_us\":%.0f,"
                   "\"p999_us\":%.0f,\"timeouts\":%llu,\"rejected\":%llu,\"mean_batch\":%.3f,"
                   "\"send_late_p50_us\":%.0f,\"send_late_p99_us\":%.0f}",
                   k ? "," : "", res[k].offered_qps, res[k].achieved_qps, res[k].p50_us, res[k].p90_us, res[k].p99_us,
                   res[k].p999_us, (unsigned long long)res[k].timeouts, (unsigned long long)res[k].rejected,
                   res[k].mean_batch, res[k].late_p50_us, res[k].late_p99_us);
        if (have_ovh)
            printf("],\"scheduler_overhead_us\":%.0f,\"scheduler_cpu\":{\"offered_qps\":%.0f,\"achieved_qps\":%.0f,"
                   "\"submitters\":%u,\"burst\":%llu,\"max_users\":%u,\"max_wait_us\":%lld,\"adaptive\":%s,"
                   "\"requests\":%llu,\"rejected\":%llu,\"mean_batch\":%.2f,\"worker_cpu_us_per_request\":%.3f,"
                   "\"pass_cpu_us_per_request\":%.3f,\"submit_cpu_us_per_request\":%.3f,"
                   "\"scheduler_cpu_us_per_request\":%.3f}",
                   ov.queue_wait_p50_us, ov.offered_qps, ov.achieved_qps, ov.submitters, (unsigned long long)ov.burst,
                   oo.max_users, (long long)oo.max_wait_us, oo.adaptive ? "true" : "false",
                   (unsigned long long)ov.requests, (unsigned long long)ov.rejected, ov.mean_batch, ov.worker_cpu_us,
                   ov.pass_cpu_us, ov.submit_cpu_us, ov.sched_cpu_us);
        else printf("],\"scheduler_overhead_us\":null,\"scheduler_cpu\":null");
        /* the engine's CUDA graphs over the whole run: captures after warm-up are one-off shapes */
        flame_engine_stats es = {.struct_size = sizeof es};
        if (flame_engine_get_stats(e, &es) == FLAME_OK)
            printf(",\"engine\":{\"graph_captures\":%llu,\"graph_replays\":%llu,\"requests\":%llu,"
                   "\"profile_passes\":%llu,\"profile_padding_tokens\":%llu}",
                   (unsigned long long)es.graph_captures, (unsigned long long)es.graph_replays,
                   (unsigned long long)es.requests, (unsigned long long)es.profile_passes,
                   (unsigned long long)es.profile_padding_tokens);
        printf("}\n");
    }
    flame_scheduler_destroy(s);
    flame_engine_destroy(e);
    flame_model_destroy(m);
    return 0;
}
