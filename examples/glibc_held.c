/*
 * glibc_held.c -- "We freed it, why is RSS still 300 MiB?" (glibc ptmalloc2)
 *
 * Field situation: a request burst makes ~170k mixed-size allocations
 * (64 B - 8 KiB, log-uniform, ~300 MiB) in the main thread; almost all are
 * freed afterwards, but a few survivors (2%, spread through the heap, plus the
 * last allocation of the burst, right under the top chunk) stay live.  glibc
 * only gives memory back on its own by shrinking the *top* of the heap past
 * M_TRIM_THRESHOLD, and the late survivor pins the top, so the main arena
 * keeps ~280 MiB of free chunks resident.  malloc_trim(0) walks the bins and
 * madvise(MADV_DONTNEED)s every whole free page, which returns nearly all of
 * it.
 *
 * Options: --count N (170000) --keep-pct N (2) --trim
 *   --trim: on SIGUSR1 call malloc_trim(0) in the main thread and print
 *           TRIM rss_before=B rss_after=B released=B took_us=N
 *   (without --trim, SIGUSR1 prints "TRIM skipped"), then idle again.
 *
 * READY allocations=N live=B held=B rss=B arena=B uordblks=B fordblks=B
 *       keepcost=B hblkhd=B
 *   held = fordblks (free bytes in the main arena's bins, incl. top);
 *   the mallinfo2 fields are printed so allocdiag's numbers can be checked.
 *
 * What allocdiag should show (glibc): allocated (uordblks+hblkhd) ~= 6 MiB,
 * main arena system ~= 285 MiB, free-in-bins ~= 279 MiB, keepcost tiny (the
 * top is pinned), RSS ~= 289 MiB; a finding "glibc holds free memory:
 * malloc_trim(0) would return ~265 MiB" with a measured release-now action;
 * raising/lowering MALLOC_TRIM_THRESHOLD_ does not help (the top is pinned).
 *
 * Measured here (glibc 2.36, kernel 6.18, defaults, MiB = 2^20 bytes):
 *   READY allocations=170000 live=5.5 MiB held(fordblks)=278.9 MiB
 *         arena=284.8 MiB keepcost=0.1 MiB hblkhd=2.6 MiB (our two index
 *         arrays, mmapped) rss=288.5 MiB
 *   TRIM rss_before=288.8 MiB rss_after=24.2 MiB released=264.6 MiB (29 ms)
 *   /proc/PID/status VmRSS agreed: 295720 kB -> 24796 kB.
 *   --count 40000: held=65.5 MiB rss=68.9 MiB, TRIM released=61.5 MiB (7 ms)
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t trim_requested;

static void on_term(int sig)
{
    (void)sig;
    _exit(0);
}

static void on_usr1(int sig)
{
    (void)sig;
    trim_requested = 1;
}

static long long vmrss(void)
{
    char line[256];
    long long kib = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kib = atoll(line + 6);
            break;
        }
    fclose(f);
    return kib * 1024;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* xorshift64: a fixed, allocator-independent sequence of sizes. */
static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* log-uniform in [64, 8192]: 2^(6 + 7u) */
static size_t pick_size(void)
{
    unsigned bits = 6 + (unsigned)(next_rand() % 7);       /* 64 .. 4096 */
    size_t lo = (size_t)1 << bits;
    return lo + (size_t)(next_rand() % lo);                 /* .. 8191 */
}

int main(int argc, char **argv)
{
    long count = 170000, keep_pct = 2;
    int do_trim = 0;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--trim"))
            do_trim = 1;
        else if (!strcmp(argv[i], "--count") && i + 1 < argc)
            count = atol(argv[++i]);
        else if (!strcmp(argv[i], "--keep-pct") && i + 1 < argc)
            keep_pct = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--count N] [--keep-pct N] [--trim]\n",
                    argv[0]);
            return 2;
        }
    }
    if (count < 2 || keep_pct <= 0 || keep_pct > 100) {
        fprintf(stderr, "glibc_held: bad arguments\n");
        return 2;
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    signal(SIGUSR1, on_usr1);

    char **p = calloc((size_t)count, sizeof *p);
    size_t *sz = calloc((size_t)count, sizeof *sz);
    if (!p || !sz)
        return 1;

    /* The burst. */
    for (long i = 0; i < count; i++) {
        sz[i] = pick_size();
        p[i] = malloc(sz[i]);
        if (!p[i])
            return 1;
        memset(p[i], (int)i, sz[i]);
    }
    /* Most of it is freed; every (100/keep_pct)-th block survives, and so
     * does the last one (the late survivor right under the top chunk). */
    long every = 100 / keep_pct;
    size_t live = 0;
    for (long i = 0; i < count; i++) {
        if (i % every == 0 || i == count - 1)
            live += sz[i];
        else {
            free(p[i]);
            p[i] = NULL;
        }
    }

    struct mallinfo2 mi = mallinfo2();
    printf("READY allocations=%ld live=%zu held=%zu rss=%lld arena=%zu "
           "uordblks=%zu fordblks=%zu keepcost=%zu hblkhd=%zu\n",
           count, live, mi.fordblks, vmrss(), mi.arena, mi.uordblks,
           mi.fordblks, mi.keepcost, mi.hblkhd);
    fflush(stdout);

    for (;;) {
        struct timespec ts = { 1, 0 };
        nanosleep(&ts, NULL);           /* idle; SIGUSR1 interrupts it */
        if (!trim_requested)
            continue;
        trim_requested = 0;
        if (!do_trim) {
            printf("TRIM skipped (run with --trim)\n");
            fflush(stdout);
            continue;
        }
        long long before = vmrss();
        double t0 = now();
        malloc_trim(0);
        double took = now() - t0;
        long long after = vmrss();
        printf("TRIM rss_before=%lld rss_after=%lld released=%lld took_us=%d\n",
               before, after, before - after, (int)(took * 1e6));
        fflush(stdout);
    }
}
