/* Churn target for bench/heapprof_cost.py.  One worker thread replaces
 * blocks in a ring of live pointers (one malloc + one free per op, sizes
 * 16..4111 bytes) a few calls deep, so a profiler's stack capture has
 * frames to walk.  The main thread answers on stdin (a read: a safe point):
 *   rate S   ops per second over the next S seconds -> "OK <ops/s>"  */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RING 1024
#define SIZE_SPAN 4096
#define SIZE_MIN 16

static atomic_uint_fast64_t ops;
static void *ring[RING];

__attribute__((noinline)) static void *churn_alloc(size_t n) {
    void *p = malloc(n);
    *(volatile char *)p = 1;
    return p;
}

__attribute__((noinline)) static void churn_step(uint64_t i) {
    size_t slot = i % RING;
    free(ring[slot]);
    ring[slot] = churn_alloc(SIZE_MIN + (i * 2654435761u) % SIZE_SPAN);
}

static void *worker(void *arg) {
    (void)arg;
    for (uint64_t i = 0;; i++) {
        churn_step(i);
        atomic_fetch_add_explicit(&ops, 1, memory_order_relaxed);
    }
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(void) {
    pthread_t t;
    char line[64];
    double s;
    setvbuf(stdout, NULL, _IOLBF, 0);
    pthread_create(&t, NULL, worker, NULL);
    printf("READY %d\n", (int)getpid());
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "rate %lf", &s) == 1) {
            uint64_t a = atomic_load(&ops);
            double t0 = now();
            usleep((useconds_t)(s * 1e6));
            uint64_t b = atomic_load(&ops);
            printf("OK %.0f\n", (b - a) / (now() - t0));
        } else {
            printf("ERR %s", line);
        }
    }
    return 0;
}
