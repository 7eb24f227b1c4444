/*
 * lying_rss.c -- "RSS says 256 MiB, but the program freed 95% of it."
 *
 * Field situation: a service allocates a large working set, frees almost all
 * of it, then goes quiet.  The freed pages were handed back with
 * madvise(MADV_FREE): they stay counted in RSS (as LazyFree, part of RssAnon)
 * until the kernel needs the memory, while the memory cgroup already counts
 * them as inactive_file, so a "working set" dashboard (usage - inactive_file)
 * drops and process RSS does not.  Two honest numbers that disagree.
 *
 * Modes:
 *   default      malloc 256 MiB in 64 KiB chunks, free 95% through the
 *                allocator.  Only produces LazyFree under jemalloc with
 *                MALLOC_CONF=background_thread:true,dirty_decay_ms:1000,
 *                muzzy_decay_ms:-1 (launch.py sets it by default for
 *                --allocator jemalloc; override with --env MALLOC_CONF=...):
 *                dirty pages decay to muzzy via MADV_FREE after ~1 s and,
 *                with muzzy decay disabled, are never purged.  glibc,
 *                stock jemalloc 5.3 (muzzy_decay_ms:0), gperftools and
 *                mimalloc 2.0.9 produce ~no LazyFree here.
 *   --madvise    mmap the working set directly and madvise(MADV_FREE) 95% of
 *                it: works under any allocator (allocdiag should then say the
 *                LazyFree is *not* allocator-held).
 *
 * Options: --mib N (256) --chunk-kib N (64) --keep-pct N (5) --settle S (10)
 *
 * READY mode=M allocated=B freed=B rss=B rss_anon=B lazyfree=B settle_ms=N
 *   printed once LazyFree stopped changing (or after --settle seconds).
 *
 * What allocdiag should show: rss ~= 270 MiB, lazyfree ~= 245-260 MiB (>90%
 * of rss_anon), cgroup working_set lower than usage by about lazyfree; for
 * jemalloc: allocated ~= 13 MiB, pmuzzy*page ~= lazyfree, opt.muzzy_decay_ms
 * -1 from MALLOC_CONF; advice: a finite muzzy_decay_ms (or arena.4096.purge)
 * returns it for real.
 *
 * Measured here (kernel 6.18, Debian 12, defaults: 256 MiB, 64 KiB chunks,
 * keep 5%; freed = 243.2 MiB; MiB = 2^20 bytes):
 *   jemalloc + LAZY conf    rss=276.4 rss_anon=273.2 lazyfree=258.0 (94% of
 *                           rss_anon; a bit more than we freed: jemalloc's
 *                           own freed extents too), READY after 2.5 s
 *   --madvise (glibc)       rss=257.4 rss_anon=256.1 lazyfree=243.1
 *   glibc, default mode     rss=256.7 lazyfree=0 (free chunks between the
 *                           survivors stay in the main arena's bins)
 *   jemalloc, MALLOC_CONF=  rss=276.5 lazyfree=0 (stock 5.3: muzzy decay 0,
 *                           no background thread: dirty pages stay resident)
 *   tcmalloc / mimalloc     lazyfree=0, rss=263.6 / 258.1
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static void on_term(int sig)
{
    (void)sig;
    _exit(0);
}

/* A "Key:   N kB" field of a /proc file, in bytes (0 when absent). */
static long long proc_field(const char *path, const char *key)
{
    char line[256];
    long long kib = 0;
    size_t n = strlen(key);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            kib = atoll(line + n + 1);
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

static void nap(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    long mib = 256, chunk_kib = 64, keep_pct = 5, settle_s = 10;
    int use_madvise = 0;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--madvise"))
            use_madvise = 1;
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = atol(argv[++i]);
        else if (!strcmp(argv[i], "--chunk-kib") && i + 1 < argc)
            chunk_kib = atol(argv[++i]);
        else if (!strcmp(argv[i], "--keep-pct") && i + 1 < argc)
            keep_pct = atol(argv[++i]);
        else if (!strcmp(argv[i], "--settle") && i + 1 < argc)
            settle_s = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--madvise] [--mib N] [--chunk-kib N] "
                    "[--keep-pct N] [--settle S]\n", argv[0]);
            return 2;
        }
    }
    if (mib <= 0 || chunk_kib <= 0 || keep_pct <= 0 || keep_pct > 100) {
        fprintf(stderr, "lying_rss: bad sizes\n");
        return 2;
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);

    size_t chunk = (size_t)chunk_kib * 1024;
    size_t n = (size_t)mib * 1024 * 1024 / chunk;
    size_t every = 100 / keep_pct;     /* keep chunk i when i % every == 0 */
    size_t freed = 0;

    if (!use_madvise) {
        char **p = calloc(n, sizeof *p);
        if (!p)
            return 1;
        for (size_t i = 0; i < n; i++) {
            p[i] = malloc(chunk);
            if (!p[i])
                return 1;
            memset(p[i], (int)(i | 1), chunk);      /* make it resident */
        }
        for (size_t i = 0; i < n; i++)
            if (i % every != 0) {
                free(p[i]);
                p[i] = NULL;
                freed += chunk;
            }
        /* p[] and the surviving 5% stay live for the process's lifetime. */
    } else {
        char *base = mmap(NULL, n * chunk, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        memset(base, 0x5a, n * chunk);
        for (size_t i = 0; i < n; i++)
            if (i % every != 0) {
                if (madvise(base + i * chunk, chunk, MADV_FREE) != 0) {
                    perror("madvise(MADV_FREE)");
                    return 1;
                }
                freed += chunk;
            }
    }

    /* Wait until LazyFree stops moving: jemalloc's background thread turns
     * dirty pages muzzy over dirty_decay_ms.  Stable = within 1 MiB for 1 s,
     * and at least 2.5 s after the free so a slow first decay is not missed. */
    double t0 = now(), stable_since = t0;
    long long last = -1;
    for (;;) {
        long long lf = proc_field("/proc/self/smaps_rollup", "LazyFree");
        double t = now();
        if (last < 0 || llabs(lf - last) > 1024 * 1024) {
            last = lf;
            stable_since = t;
        }
        if ((t - t0 >= 2.5 && t - stable_since >= 1.0) || t - t0 >= settle_s)
            break;
        nap(250);
    }

    printf("READY mode=%s allocated=%zu freed=%zu rss=%lld rss_anon=%lld "
           "lazyfree=%lld settle_ms=%d\n",
           use_madvise ? "madvise" : "allocator", n * chunk, freed,
           proc_field("/proc/self/status", "VmRSS"),
           proc_field("/proc/self/status", "RssAnon"),
           proc_field("/proc/self/smaps_rollup", "LazyFree"),
           (int)((now() - t0) * 1000));
    fflush(stdout);

    for (;;)
        nap(1000);      /* idle in nanosleep: a safe point for remote calls */
}
