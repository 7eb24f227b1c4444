/* Target for bench/pause.py.
 *   pause_target NTHREADS GAPFILE
 * NTHREADS serving threads churn malloc/free (16 B - 256 KiB) and record the
 * longest gap between two of their iterations, in ns, into GAPFILE (mmap'd,
 * one uint64 per thread; the bench zeroes it to start a window).  The main
 * thread prints READY and parks in read() on stdin, where a remote call
 * can borrow it.  A line "time N" on stdin makes it run the same stats
 * calls allocdiag makes, N times, in-process, and print "INPROC <median ns>".
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

static const char *JE_NAMES[] = {"version", "config.stats", "opt.background_thread", "background_thread",
    "opt.narenas", "opt.dirty_decay_ms", "opt.muzzy_decay_ms", "opt.retain", "arenas.narenas", "arenas.page",
    "arenas.dirty_decay_ms", "arenas.muzzy_decay_ms", "stats.allocated", "stats.active", "stats.metadata",
    "stats.metadata_thp", "stats.resident", "stats.mapped", "stats.retained", "stats.zero_reallocs",
    "stats.background_thread.num_threads", "stats.background_thread.num_runs",
    "stats.background_thread.run_interval", "stats.arenas.4096.pactive", "stats.arenas.4096.pdirty",
    "stats.arenas.4096.pmuzzy", "stats.arenas.4096.dirty_decay_ms", "stats.arenas.4096.muzzy_decay_ms",
    "stats.arenas.4096.tcache_bytes", "opt.tcache", "opt.percpu_arena", "opt.prof", "config.malloc_conf",
    "config.prof", "opt.lg_tcache_max", "opt.tcache_max"};

/* The calls allocdiag makes for the serving allocator, in-process. */
static void stats_calls(void) {
    static char buf[48 * 1024];
    mallctl_t mallctl = (mallctl_t)dlsym(RTLD_DEFAULT, "mallctl");
    getprop_t getprop = (getprop_t)dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty");
    if (mallctl) {
        uint64_t e = 1; size_t sz = 8;
        mallctl("epoch", &e, &sz, &e, sz);
        for (size_t i = 0; i < sizeof JE_NAMES / sizeof *JE_NAMES; i++) {
            uint64_t v = 0; sz = 8;
            mallctl(JE_NAMES[i], &v, &sz, NULL, 0);
        }
    } else if (getprop) {
        static const char *p[] = {"generic.current_allocated_bytes", "generic.heap_size",
            "generic.total_physical_bytes", "tcmalloc.pageheap_free_bytes", "tcmalloc.pageheap_unmapped_bytes",
            "tcmalloc.central_cache_free_bytes", "tcmalloc.transfer_cache_free_bytes",
            "tcmalloc.thread_cache_free_bytes", "tcmalloc.current_total_thread_cache_bytes",
            "tcmalloc.max_total_thread_cache_bytes"};
        size_t v;
        for (size_t i = 0; i < sizeof p / sizeof *p; i++) getprop(p[i], &v);
        void (*gs)(char *, int) = (void (*)(char *, int))dlsym(RTLD_DEFAULT, "MallocExtension_GetStats");
        if (gs) gs(buf, sizeof buf);
    } else {
        struct mallinfo2 mi = mallinfo2();
        (void)mi;
        FILE *f = fmemopen(buf, sizeof buf, "w");
        setvbuf(f, NULL, _IONBF, 0);
        malloc_info(0, f);
        fclose(f);
    }
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
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
        uint64_t *ns = calloc(reps, sizeof *ns);
        for (int r = 0; r < reps; r++) {
            uint64_t a = now_ns();
            stats_calls();
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
