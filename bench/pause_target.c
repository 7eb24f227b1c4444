/* Target for bench/pause.py.
 *   pause_target NTHREADS GAPFILE [FRAG_MIB]
 * NTHREADS serving threads churn malloc/free (16 B - 256 KiB) and record the
 * longest gap between two of their iterations, in ns, into GAPFILE (mmap'd,
 * one uint64 per thread; the bench zeroes it to start a window).  FRAG_MIB
 * (default 0) first builds a fragmented heap of that many MiB: small blocks
 * of mixed sizes, every other one freed, so the free lists are long (the
 * case where a heap walk such as glibc's malloc_info is slow).  The main
 * thread prints READY and parks in read() on stdin, where a remote call
 * can borrow it.  A line "time N MODE" on stdin makes it run, N times,
 * in-process, the work one snapshot does with MODE, and print
 * "INPROC <median ns>":
 *   now       the calls allocdiag makes today (collectors/allocators)
 *   percall   the per-call path (jemalloc: epoch + one mallctl per name;
 *             gperftools: every property + GetStats; glibc: mallinfo2 +
 *             malloc_info, i.e. two heap walks)
 *   repeat    snapshots after the first in one allocdiag process: jemalloc
 *             the stats-only print ("Jgdablxeh"); gperftools and glibc as now
 *             (gperftools: GetStats only, its two knobs read from memory)
 *   walk      glibc only: one malloc_info, nothing else (the goal's unit)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t *gaps;
static volatile int stop;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

static void *churn(void *arg) {
    long i = (long)arg;
    unsigned seed = (unsigned)i * 2654435761u;
    void *slots[64] = {0};
    uint64_t last = now_ns();
    while (!stop) {
        int k = rand_r(&seed) % 64;
        free(slots[k]);
        size_t sz = 16u << (rand_r(&seed) % 15);          /* 16 B .. 256 KiB */
        slots[k] = malloc(sz);
        if (slots[k]) ((char *)slots[k])[0] = 1;
        uint64_t t = now_ns();
        if (t - last > gaps[i]) gaps[i] = t - last;
        last = t;
    }
    return NULL;
}

typedef int (*mallctl_t)(const char *, void *, size_t *, void *, size_t);
typedef int (*getprop_t)(const char *, size_t *);
typedef void (*print_t)(void (*)(void *, const char *), void *, const char *);

/* The names the per-call path reads (collectors/allocators/jemalloc/__init__.py MALLCTLS). */
static const char *JE_NAMES[] = {"version", "config.debug", "config.fill", "config.malloc_conf",
    "config.prof", "config.stats", "opt.retain", "opt.dss", "opt.narenas", "opt.percpu_arena",
    "opt.oversize_threshold", "opt.metadata_thp", "opt.background_thread", "opt.dirty_decay_ms",
    "opt.muzzy_decay_ms", "opt.tcache", "opt.tcache_max", "opt.lg_tcache_max", "opt.thp", "opt.prof",
    "opt.lg_prof_sample", "opt.zero_realloc", "background_thread", "arenas.narenas", "arenas.page",
    "arenas.quantum", "arenas.tcache_max", "arenas.dirty_decay_ms", "arenas.muzzy_decay_ms",
    "arenas.nbins", "arenas.nlextents", "stats.allocated", "stats.active", "stats.metadata",
    "stats.metadata_thp", "stats.resident", "stats.mapped", "stats.retained", "stats.zero_reallocs",
    "stats.background_thread.num_threads", "stats.background_thread.num_runs",
    "stats.background_thread.run_interval", "stats.arenas.4096.nthreads", "stats.arenas.4096.pactive",
    "stats.arenas.4096.pdirty", "stats.arenas.4096.pmuzzy", "stats.arenas.4096.dirty_npurge",
    "stats.arenas.4096.dirty_nmadvise", "stats.arenas.4096.dirty_purged",
    "stats.arenas.4096.muzzy_npurge", "stats.arenas.4096.muzzy_nmadvise",
    "stats.arenas.4096.muzzy_purged", "stats.arenas.4096.small.allocated",
    "stats.arenas.4096.large.allocated", "stats.arenas.4096.mapped", "stats.arenas.4096.retained",
    "stats.arenas.4096.base", "stats.arenas.4096.internal", "stats.arenas.4096.tcache_bytes",
    "stats.arenas.4096.resident", "stats.arenas.4096.abandoned_vm"};

/* gperftools: every property (the per-call path). */
static const char *TC_ALL[] = {"generic.current_allocated_bytes", "generic.heap_size",
    "generic.total_physical_bytes", "tcmalloc.pageheap_free_bytes", "tcmalloc.pageheap_unmapped_bytes",
    "tcmalloc.central_cache_free_bytes", "tcmalloc.transfer_cache_free_bytes",
    "tcmalloc.thread_cache_free_bytes", "tcmalloc.current_total_thread_cache_bytes",
    "tcmalloc.slack_bytes", "tcmalloc.max_total_thread_cache_bytes",
    "tcmalloc.aggressive_memory_decommit", "tcmalloc.heap_limit_mb",
    "tcmalloc.pageheap_committed_bytes", "tcmalloc.pageheap_scavenge_count",
    "tcmalloc.pageheap_commit_count", "tcmalloc.pageheap_total_commit_bytes",
    "tcmalloc.pageheap_decommit_count", "tcmalloc.pageheap_total_decommit_bytes",
    "tcmalloc.pageheap_reserve_count", "tcmalloc.pageheap_total_reserve_bytes"};

static char buf[56 * 1024];

/* collectors/allocators/mimalloc OPTIONS_2_0: mi_option_t values 0..25 */
#define MI_OPTIONS_2_0 26

static void glibc_walk(void) {
    FILE *f = fmemopen(buf, sizeof buf, "w");
    setvbuf(f, NULL, _IONBF, 0);
    malloc_info(0, f);
    fclose(f);
}

/* The calls a snapshot makes for the serving allocator, in-process.
 * percall: 0 today's calls, 1 the per-call path, 2 jemalloc's repeat print. */
static void stats_calls(int percall) {
    mallctl_t mallctl = (mallctl_t)dlsym(RTLD_DEFAULT, "mallctl");
    print_t print = (print_t)dlsym(RTLD_DEFAULT, "malloc_stats_print");
    getprop_t getprop = (getprop_t)dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty");
    if (mallctl) {
        uint64_t v = 0; size_t sz = 8;
        if (percall == 1) {
            uint64_t e = 1;
            mallctl("epoch", &e, &sz, &e, sz);
            for (size_t i = 0; i < sizeof JE_NAMES / sizeof *JE_NAMES; i++) {
                sz = 8;
                mallctl(JE_NAMES[i], &v, &sz, NULL, 0);
            }
        } else {
            buf[0] = 0;
            /* now: a first snapshot's print, the general section as a table */
            print((void (*)(void *, const char *))strcat, buf, percall == 2 ? "Jgdablxeh" : "dablxeh");
        }
    } else if (getprop) {
        size_t v;
        /* now and repeat: GetStats only, the two knob properties it does not
         * print (EVERY_SNAPSHOT) being read from memory; percall: every one */
        if (percall == 1)
            for (size_t i = 0; i < sizeof TC_ALL / sizeof *TC_ALL; i++)
                getprop(TC_ALL[i], &v);
        void (*gs)(char *, int) = (void (*)(char *, int))dlsym(RTLD_DEFAULT, "MallocExtension_GetStats");
        if (gs) gs(buf, 48 * 1024);
    } else if (dlsym(RTLD_DEFAULT, "mi_stats_print_out")) {
        /* mimalloc: mi_stats_print_out(fputs, fmemopen stream); the
         * per-call path also mi_process_info and its 26 options (2.0), which
         * a snapshot reads from memory (_mi_stats_main, the option table) */
        void (*info)(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *,
                     size_t *) = dlsym(RTLD_DEFAULT, "mi_process_info");
        long (*option_get)(int) = (long (*)(int))dlsym(RTLD_DEFAULT, "mi_option_get");
        void (*print_out)(void (*)(const char *, void *), void *) =
            dlsym(RTLD_DEFAULT, "mi_stats_print_out");
        size_t v[8];
        if (info && percall == 1) info(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
        for (int i = 0; percall == 1 && option_get && i < MI_OPTIONS_2_0; i++)
            (void)option_get(i);
        FILE *f = fmemopen(buf, sizeof buf, "w");
        print_out((void (*)(const char *, void *))fputs, f);
        fclose(f);
    } else {
        if (percall == 1) {
            struct mallinfo2 mi = mallinfo2();
            (void)mi;
        }
        glibc_walk();
    }
}

/* A heap of FRAG_MIB MiB of small blocks, every other one freed. */
static void fragment(size_t mib) {
    size_t n = (mib << 20) / 272 + 1, total = 0;   /* mean block ~272 B */
    void **p = malloc(n * sizeof *p);
    unsigned seed = 12345;
    size_t i;
    for (i = 0; i < n && total < (mib << 20); i++) {
        size_t sz = 16 + 16 * (rand_r(&seed) % 32);   /* 16 .. 512 B */
        p[i] = malloc(sz);
        memset(p[i], 1, sz);
        total += sz;
    }
    for (size_t j = 0; j < i; j += 2) free(p[j]);
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 3 && atoi(argv[3]) > 0) fragment((size_t)atoi(argv[3]));
    int fd = open(argv[2], O_RDWR | O_CREAT, 0644);
    ftruncate(fd, 4096);
    gaps = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    pthread_t t[64];
    for (long i = 0; i < n && i < 64; i++) pthread_create(&t[i], NULL, churn, (void *)i);
    printf("READY %d\n", n);
    fflush(stdout);
    char line[64];
    ssize_t got;
    while ((got = read(0, line, sizeof line - 1)) > 0) {
        line[got] = 0;
        int reps = atoi(line + 5);
        if (strncmp(line, "time ", 5) != 0 || reps <= 0) continue;
        const char *mode = strchr(line + 5, ' ');
        mode = mode ? mode + 1 : "now";
        uint64_t *ns = calloc(reps, sizeof *ns);
        for (int r = 0; r < reps; r++) {
            uint64_t a = now_ns();
            if (strncmp(mode, "walk", 4) == 0) glibc_walk();
            else stats_calls(strncmp(mode, "percall", 7) == 0 ? 1 :
                             strncmp(mode, "repeat", 6) == 0 ? 2 : 0);
            ns[r] = now_ns() - a;
        }
        qsort(ns, reps, sizeof *ns, cmp);
        printf("INPROC %llu\n", (unsigned long long)ns[reps / 2]);
        fflush(stdout);
        free(ns);
    }
    stop = 1;
    return 0;
}
