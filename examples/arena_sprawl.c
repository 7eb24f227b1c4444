/*
 * arena_sprawl.c -- "VSZ is 2 GiB and RSS keeps creeping; we have 32 threads."
 *
 * Field situation: glibc gives each thread that allocates under contention its
 * own arena, up to 8 x CPUs arenas (64-bit).  Every non-main arena lives in
 * "heaps" of 64 MiB of reserved address space (HEAP_MAX_SIZE, 64 MiB-aligned,
 * rw-p for the used part, ---p for the rest) and keeps its own free chunks,
 * which other threads cannot reuse and which are trimmed only from each
 * heap's top.  The usual fix is MALLOC_ARENA_MAX (glibc.malloc.arena_max).
 *
 * Each of --threads N (32) workers churns its own live set (--live N blocks,
 * 64, of 256 B - 32 KiB, --ops N replacements, 20000) so that it attaches to an
 * arena and leaves free chunks in it, keeps the live set, and parks: even
 * workers block in read() on a pipe nobody writes to, odd ones loop in
 * nanosleep().  The main thread also idles in nanosleep().  No thread parks in
 * epoll/futex only, so a remote stats call can always borrow one.  With
 * --busy the odd workers keep replacing blocks after READY instead: their
 * allocation wall (`allocdiag wall`: arena-lock waits under MALLOC_ARENA_MAX=1,
 * none with an arena per thread).  --duty PCT (100) bounds their CPU: they
 * churn for the first PCT ms of every 100 ms of CLOCK_MONOTONIC, all in the
 * same phase (so they still meet on the lock), and sleep the rest.
 *
 * READY threads=N arenas=A heaps=H live=B rss=B vsz=B cpus=C
 *   heaps  = 64 MiB-aligned anonymous regions of /proc/self/maps whose first
 *            mapping is rw-p and which cover a full 64 MiB (rw-p + ---p);
 *   arenas = distinct arena pointers in those heaps' heap_info headers
 *            (first field of every heap), i.e. non-main arenas;
 *   cpus   = CPUs in our affinity mask (glibc 2.36 sizes the arena limit
 *            from it: limit = 8 x cpus arenas incl. main, so at most
 *            8 x cpus - 1 non-main arenas).
 *
 * What allocdiag should show (glibc): number of arenas (non-main = min(threads,
 * 8 x cpus - 1)), each with system/in-use/free, address space >> RSS, and a
 * finding "arena sprawl" with knob MALLOC_ARENA_MAX / glibc.malloc.arena_max.
 * Under jemalloc/tcmalloc/mimalloc the same program shows no glibc heaps.
 *
 * Measured here (2 CPUs, glibc 2.36; live set 32 MiB in all runs):
 *   defaults                          arenas=15 heaps=15 rss=45 MiB vsz=0.95 GiB
 *                                     (the cap on 2 CPUs: 8 x 2 = 16 arenas
 *                                     incl. main, so 15 non-main)
 *   GLIBC_TUNABLES=glibc.malloc.arena_max=64  arenas=32 heaps=32 rss=49 MiB
 *                                     vsz=2.0 GiB
 *   MALLOC_ARENA_MAX=2                arenas=1 heaps=1 rss=39 MiB vsz=93 MiB
 *   --allocator jemalloc              arenas=0 heaps=0 rss=80 MiB vsz=130 MiB
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HEAP_MAX (64UL * 1024 * 1024)   /* glibc HEAP_MAX_SIZE on 64-bit */

static long n_threads = 32, live_blocks = 64, ops = 20000;
static int busy;                         /* --busy: odd workers keep churning after READY */
static long duty = 100;                  /* --duty: percent of each DUTY_PERIOD_MS spent churning */
#define DUTY_PERIOD_MS 100
#define DUTY_CHECK_EVERY 64              /* replacements between clock reads */
static int park_pipe[2];
static int parked;                       /* updated with __atomic builtins */
static size_t live_total;

static void on_term(int sig)
{
    (void)sig;
    _exit(0);
}

static void nap(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* --duty: sleep out the idle part of the current period, if we are in it. */
static void duty_wait(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long ms = (long)(now.tv_nsec / 1000000L) % DUTY_PERIOD_MS;
    if (ms >= duty)
        nap(DUTY_PERIOD_MS - ms);
}

/* Replace one block of the live set by a new one of a random size. */
static void replace_one(long id, uint64_t *r, char **blk, size_t *sz)
{
    *r ^= *r << 13;
    *r ^= *r >> 7;
    *r ^= *r << 17;
    long k = (long)(*r % (uint64_t)live_blocks);
    free(blk[k]);
    sz[k] = 256 + (size_t)((*r >> 20) % (32 * 1024 - 256));
    blk[k] = malloc(sz[k]);
    if (!blk[k])
        abort();
    memset(blk[k], (int)id, sz[k]);
}

static void *worker(void *arg)
{
    long id = (long)arg;
    uint64_t r = 0x9e3779b97f4a7c15ULL * (uint64_t)(id + 1);
    char **blk = calloc((size_t)live_blocks, sizeof *blk);   /* first malloc: picks the arena */
    size_t *sz = calloc((size_t)live_blocks, sizeof *sz);
    if (!blk || !sz)
        abort();
    for (long i = 0; i < ops; i++)
        replace_one(id, &r, blk, sz);
    size_t live = 0;
    for (long k = 0; k < live_blocks; k++)
        live += blk[k] ? sz[k] : 0;
    __atomic_add_fetch(&live_total, live, __ATOMIC_RELAXED);
    __atomic_add_fetch(&parked, 1, __ATOMIC_RELEASE);
    if (busy && id % 2 == 1)
        for (long i = 0;; i++) {         /* --busy: the allocation wall (allocdiag wall) */
            if (duty < 100 && i % DUTY_CHECK_EVERY == 0)
                duty_wait();
            replace_one(id, &r, blk, sz);
        }

    /* Park, keeping the live set (blk stays reachable from this frame). */
    if (id % 2 == 0) {
        char c;
        while (read(park_pipe[0], &c, 1) != 0)
            ;                    /* nobody writes; EINTR just loops */
    }
    for (;;)
        nap(3600 * 1000);
    return blk;
}

/* Count glibc heaps in our own maps and the distinct arenas owning them. */
static void count_heaps(long *heaps, long *arenas, long long *vsz)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    uintptr_t owners[1024];
    long nowners = 0;
    uintptr_t cur_start = 0, cur_end = 0;     /* candidate heap being extended */
    int in_candidate = 0;

    *heaps = *arenas = 0;
    *vsz = 0;
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        unsigned long s, e, off, inode;
        char perms[8], dev[16], path[256] = "";
        int n = sscanf(line, "%lx-%lx %7s %lx %15s %lu %255s", &s, &e, perms,
                       &off, dev, &inode, path);
        if (n < 6)
            continue;
        *vsz += (long long)(e - s);
        int anon = inode == 0 && path[0] == '\0';
        if (in_candidate && anon && s == cur_end && perms[0] == '-')
            cur_end = e;                       /* the ---p reserve after it */
        else
            in_candidate = 0;
        if (!in_candidate && anon && (s % HEAP_MAX) == 0 && !strncmp(perms, "rw", 2)) {
            in_candidate = 1;
            cur_start = s;
            cur_end = e;
        }
        if (in_candidate && cur_end - cur_start >= HEAP_MAX) {
            in_candidate = 0;
            (*heaps)++;
            uintptr_t owner = *(uintptr_t *)cur_start;   /* heap_info.ar_ptr */
            int seen = 0;
            for (long i = 0; i < nowners; i++)
                seen |= owners[i] == owner;
            if (!seen && nowners < 1024)
                owners[nowners++] = owner;
        }
    }
    fclose(f);
    *arenas = nowners;
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

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            n_threads = atol(argv[++i]);
        else if (!strcmp(argv[i], "--live") && i + 1 < argc)
            live_blocks = atol(argv[++i]);
        else if (!strcmp(argv[i], "--ops") && i + 1 < argc)
            ops = atol(argv[++i]);
        else if (!strcmp(argv[i], "--busy"))
            busy = 1;
        else if (!strcmp(argv[i], "--duty") && i + 1 < argc)
            duty = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--threads N] [--live N] [--ops N] [--busy] [--duty PCT]\n",
                    argv[0]);
            return 2;
        }
    }
    if (n_threads < 1 || n_threads > 1000 || live_blocks < 1 || ops < 0 || duty < 1
        || duty > 100) {
        fprintf(stderr, "arena_sprawl: bad arguments\n");
        return 2;
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    if (pipe(park_pipe) != 0)
        return 1;

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (long i = 0; i < n_threads; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, worker, (void *)i) != 0) {
            perror("pthread_create");
            return 1;
        }
        pthread_detach(t);
    }
    while (__atomic_load_n(&parked, __ATOMIC_ACQUIRE) < n_threads)
        nap(10);
    nap(50);                       /* let the last ones reach their wait */

    cpu_set_t set;
    int cpus = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        cpus = CPU_COUNT(&set);
    long heaps, arenas;
    long long vsz;
    count_heaps(&heaps, &arenas, &vsz);
    printf("READY threads=%ld arenas=%ld heaps=%ld live=%zu rss=%lld vsz=%lld cpus=%d\n",
           n_threads, arenas, heaps, __atomic_load_n(&live_total, __ATOMIC_RELAXED),
           vmrss(), vsz, cpus);
    fflush(stdout);
    for (;;)
        nap(1000);
}
