// benchmarks/wakeups.py's probe: one real-time thread per CPU, pinned there, each sleeping to
// the same absolute deadlines (every PERIOD) for SECONDS. Compiled, so no interpreter stands
// between the kernel's wake-up and the measure.
//
// Per CPU it counts how late each of its wake-ups came. Per deadline it also takes the first
// wake-up on any CPU at or past it: how late the earliest CPU was, the floor of a responder
// with one thread per CPU, where a thread on a CPU the machine holds up is not needed.
//
// usage: wakeup_probe SECONDS PERIOD_NS PRIORITY CPU[,CPU...] [STALLS_FILE]
// STALLS_FILE: also write there every wake-up more than 0.3 ms late, one line each,
//   `CPU DEADLINE_NS WOKE_NS` (CLOCK_MONOTONIC): when each CPU could not run the probe, to line
//   up with other stamps of the same clock (benchmarks/pause_load.py --probe). SIGTERM ends the
//   probe early, results printed as usual.
// prints one line per CPU,
//   cpu N wakes W late_0.5 A late_1 B late_2 C worst_ms X at T1 T2 ...   (T: moments past 1 ms)
// then
//   first deadlines D late_0.5 A late_1 B late_2 C worst_ms X
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CPUS 64
#define MAX_MOMENTS 20
#define MAX_STALLS 100000
#define STALL_NS 300000

struct cpu_stats {
    int cpu;
    long long wakes, late[3], worst;  // late past 0.5, 1 and 2 ms
    double moments[MAX_MOMENTS];
    int n_moments;
    long long (*stalls)[2];  // (deadline, woke) of wake-ups past STALL_NS, when a file wants them
    long long n_stalls;
};

static const long long LIMITS[3] = {500000, 1000000, 2000000};
static long long start_ns, period_ns, n_deadlines;
static volatile long long end_ns;  // SIGTERM brings it forward
static long long *first_wake;  // per deadline: the earliest wake-up at or past it, any CPU
static int priority;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void keep_earliest(long long *slot, long long t) {
    long long seen = __atomic_load_n(slot, __ATOMIC_RELAXED);
    while (t < seen && !__atomic_compare_exchange_n(slot, &seen, t, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static void count(long long late, long long counts[3], long long *worst) {
    for (int i = 0; i < 3; i++)
        counts[i] += late > LIMITS[i];
    if (late > *worst)
        *worst = late;
}

static void *probe(void *arg) {
    struct cpu_stats *s = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(s->cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set))
        fprintf(stderr, "cpu %d: cannot pin\n", s->cpu);
    struct sched_param p = {.sched_priority = priority};
    if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &p))
        fprintf(stderr, "cpu %d: no real-time priority\n", s->cpu);
    long long served = 0;  // deadlines this thread has woken past
    for (long long now = now_ns(); now < end_ns; now = now_ns()) {
        long long k = now < start_ns ? 0 : (now - start_ns) / period_ns + 1;
        long long deadline = start_ns + k * period_ns;
        struct timespec d = {deadline / 1000000000LL, deadline % 1000000000LL};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &d, NULL);
        long long woke = now_ns(), late = woke - deadline;
        s->wakes++;
        count(late, s->late, &s->worst);
        if (late > LIMITS[1] && s->n_moments < MAX_MOMENTS)
            s->moments[s->n_moments++] = woke / 1e9;
        if (s->stalls && late > STALL_NS && s->n_stalls < MAX_STALLS) {
            s->stalls[s->n_stalls][0] = deadline;
            s->stalls[s->n_stalls++][1] = woke;
        }
        long long upto = (woke - start_ns) / period_ns;
        if (upto >= n_deadlines)
            upto = n_deadlines - 1;
        for (long long t = served + 1; t <= upto; t++)
            keep_earliest(&first_wake[t], woke);
        if (upto > served)
            served = upto;
    }
    return NULL;
}

static void end_now(int sig) {
    (void)sig;
    end_ns = 0;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: %s SECONDS PERIOD_NS PRIORITY CPU[,CPU...] [STALLS_FILE]\n", argv[0]);
        return 2;
    }
    signal(SIGTERM, end_now);
    double seconds = atof(argv[1]);
    period_ns = atoll(argv[2]);
    priority = atoi(argv[3]);
    struct cpu_stats stats[MAX_CPUS];
    int n = 0;
    for (char *tok = strtok(argv[4], ","); tok && n < MAX_CPUS; tok = strtok(NULL, ","))
        stats[n++] = (struct cpu_stats){.cpu = atoi(tok), .stalls = argc == 6 ? malloc(MAX_STALLS * sizeof *stats[0].stalls) : NULL};
    n_deadlines = (long long)(seconds * 1e9 / period_ns) + 1;
    first_wake = malloc(n_deadlines * sizeof *first_wake);
    if (!first_wake || n == 0 || period_ns <= 0)
        return 2;
    for (long long t = 0; t < n_deadlines; t++)
        first_wake[t] = LLONG_MAX;
    start_ns = now_ns() + 20000000LL;  // every thread pinned and asleep before the first deadline
    end_ns = start_ns + (long long)(seconds * 1e9);
    pthread_t threads[MAX_CPUS];
    for (int i = 0; i < n; i++)
        pthread_create(&threads[i], NULL, probe, &stats[i]);
    for (int i = 0; i < n; i++)
        pthread_join(threads[i], NULL);
    if (argc == 6) {
        FILE *f = fopen(argv[5], "w");
        if (!f) {
            perror(argv[5]);
            return 1;
        }
        for (int i = 0; i < n; i++)
            for (long long k = 0; k < stats[i].n_stalls; k++)
                fprintf(f, "%d %lld %lld\n", stats[i].cpu, stats[i].stalls[k][0], stats[i].stalls[k][1]);
        fclose(f);
    }
    for (int i = 0; i < n; i++) {
        struct cpu_stats *s = &stats[i];
        printf("cpu %d wakes %lld late_0.5 %lld late_1 %lld late_2 %lld worst_ms %.3f at", s->cpu, s->wakes,
               s->late[0], s->late[1], s->late[2], s->worst / 1e6);
        for (int m = 0; m < s->n_moments; m++)
            printf(" %.3f", s->moments[m]);
        printf("\n");
    }
    long long deadlines = 0, late[3] = {0, 0, 0}, worst = 0;
    for (long long t = 1; t < n_deadlines - 1; t++) {  // the last may have had no wake-up past it
        if (first_wake[t] == LLONG_MAX)
            continue;
        deadlines++;
        count(first_wake[t] - (start_ns + t * period_ns), late, &worst);
    }
    printf("first deadlines %lld late_0.5 %lld late_1 %lld late_2 %lld worst_ms %.3f\n", deadlines, late[0],
           late[1], late[2], worst / 1e6);
    return 0;
}
