/*
 * wall_target.c -- a process that measures its own allocation wall, the
 * truth `allocdiag wall` is checked against (reference/cpu-wall.md "Oracle
 * method").
 *
 *   wall_target mix   THREADS   threads alternate a compute phase and a batch
 *                               of malloc/free pairs (alloc_batch), timing each
 *                               phase with CLOCK_THREAD_CPUTIME_ID;
 *   wall_target lock  THREADS   threads malloc/free their own blocks of 1-8 KiB
 *                               (above glibc's tcache): arena lock contention
 *                               under glibc with MALLOC_ARENA_MAX=1, none with
 *                               an arena per thread;
 *   wall_target late  THREADS   as mix, but the threads start 0.6 s after READY
 *                               (threads created during a sampling window);
 *   wall_target churn THREADS   threads malloc a 256 KiB block, touch every
 *                               page, free it (mmap/munmap + faults with
 *                               MALLOC_MMAP_THRESHOLD_=131072).
 *
 * Prints READY, then every 0.2 s a line
 *   T mono_ns alloc_ns total_ns ops
 * (cumulative over all threads: CPU ns inside alloc_batch, CPU ns of the
 * worker loop, malloc+free calls made).  Runs until killed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BATCH 16384              /* CLOCK_THREAD_CPUTIME_ID is a syscall here: batch */
#define SLOTS 64
#define CHURN_BLOCK (256 * 1024)

static uint64_t alloc_ns, total_ns, ops;       /* __atomic */
static volatile uint64_t sink;

static uint64_t now(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

__attribute__((noinline)) static void alloc_batch(unsigned *seed)
{
    void *volatile slot[SLOTS];
    memset((void *)slot, 0, sizeof slot);
    for (int i = 0; i < BATCH; i++) {
        int k = i % SLOTS;
        if (slot[k])
            free(slot[k]);
        slot[k] = malloc(16 + rnd(seed) % 2048);
    }
    for (int k = 0; k < SLOTS; k++)
        free(slot[k]);
}

__attribute__((noinline)) static void compute(unsigned *seed)
{
    uint64_t x = *seed;
    for (int i = 0; i < 400000; i++)
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    sink = x;
}

static void *mix(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (;;) {
        uint64_t t0 = now(CLOCK_THREAD_CPUTIME_ID);
        compute(&seed);
        uint64_t t1 = now(CLOCK_THREAD_CPUTIME_ID);
        alloc_batch(&seed);
        uint64_t t2 = now(CLOCK_THREAD_CPUTIME_ID);
        __atomic_add_fetch(&alloc_ns, t2 - t1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&total_ns, t2 - t0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&ops, 2 * BATCH, __ATOMIC_RELAXED);
    }
    return NULL;
}

__attribute__((noinline)) static void lock_loop(unsigned *seed)
{
    void *volatile slot[SLOTS];
    memset((void *)slot, 0, sizeof slot);
    for (int i = 0; i < 4096; i++) {
        int k = rnd(seed) % SLOTS;
        free(slot[k]);
        slot[k] = malloc(1100 + rnd(seed) % 7000);
    }
    for (int k = 0; k < SLOTS; k++)
        free(slot[k]);
}

static void *lock(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (;;) {
        lock_loop(&seed);
        __atomic_add_fetch(&ops, 2 * 4096, __ATOMIC_RELAXED);
    }
    return NULL;
}

__attribute__((noinline)) static void churn_once(void)
{
    char *volatile p = malloc(CHURN_BLOCK);
    for (int i = 0; i < CHURN_BLOCK; i += 4096)
        p[i] = 1;
    free(p);
}

static void *churn(void *arg)
{
    (void)arg;
    for (;;) {
        for (int i = 0; i < 64; i++)
            churn_once();
        __atomic_add_fetch(&ops, 128, __ATOMIC_RELAXED);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: wall_target mix|lock|churn THREADS\n");
        return 2;
    }
    int late = !strcmp(argv[1], "late");
    void *(*fn)(void *) = (late || !strcmp(argv[1], "mix")) ? mix :
                          !strcmp(argv[1], "lock") ? lock : churn;
    int n = atoi(argv[2]);
    pthread_t t;
    if (late) {
        printf("READY threads=%d late\n", n);
        fflush(stdout);
        struct timespec ts = {0, 600000000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < n; i++)
        if (pthread_create(&t, NULL, fn, (void *)(uintptr_t)(i * 7919 + 1)))
            return 1;
    if (!late) {
        printf("READY threads=%d\n", n);
        fflush(stdout);
    }
    for (;;) {
        struct timespec ts = {0, 200000000};
        nanosleep(&ts, NULL);
        printf("T %llu %llu %llu %llu\n", (unsigned long long)now(CLOCK_MONOTONIC),
               (unsigned long long)__atomic_load_n(&alloc_ns, __ATOMIC_RELAXED),
               (unsigned long long)__atomic_load_n(&total_ns, __ATOMIC_RELAXED),
               (unsigned long long)__atomic_load_n(&ops, __ATOMIC_RELAXED));
        fflush(stdout);
    }
}
