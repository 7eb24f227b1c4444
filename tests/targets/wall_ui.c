/*
 * wall_ui.c -- a busy server-shaped process for the captured wall fixtures of
 * the Time tab, the report and the exporter (tests/targets/capture_wall.py).
 *
 *   wall_ui THREADS
 *
 * Each thread loops over "requests": parse_request (small malloc/free
 * pairs), build_response (1-8 KiB blocks kept in volatile slots, freed in a
 * later request), spill_buffer (a 256 KiB block, every page touched: an
 * mmap/munmap pair and 64 faults with MALLOC_MMAP_THRESHOLD_=131072), and a
 * compute phase.  Several threads on one glibc arena (MALLOC_ARENA_MAX=1)
 * queue on its lock.  Prints READY, runs until killed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SLOTS 64
#define SPILL (256 * 1024)
#define PAGE 4096

static volatile uint64_t sink;

__attribute__((noinline)) static void compute(unsigned n)
{
    uint64_t x = n;
    for (unsigned i = 0; i < 20000; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink += x;
}

__attribute__((noinline)) static void parse_request(unsigned *seed)
{
    for (int i = 0; i < 32; i++) {
        char *volatile p = malloc(16 + rand_r(seed) % 240);
        p[0] = 1;
        free(p);
    }
}

__attribute__((noinline)) static void build_response(char *volatile *slots, unsigned *seed)
{
    for (int i = 0; i < 16; i++) {
        unsigned k = rand_r(seed) % SLOTS;
        free(slots[k]);
        slots[k] = malloc(1024 + rand_r(seed) % 7168);
        slots[k][0] = 1;
    }
}

__attribute__((noinline)) static void spill_buffer(void)
{
    char *volatile p = malloc(SPILL);
    for (size_t off = 0; off < SPILL; off += PAGE)
        p[off] = 1;
    free(p);
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    char *volatile slots[SLOTS] = {0};
    for (unsigned n = 0;; n++) {
        parse_request(&seed);
        build_response(slots, &seed);
        if (n % 8 == 0)
            spill_buffer();
        compute(n);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    pthread_t t;
    for (int i = 0; i < threads; i++)
        if (pthread_create(&t, NULL, worker, (void *)(uintptr_t)(i + 1)) != 0)
            return 1;
    printf("READY %d\n", threads);
    fflush(stdout);
    for (;;)
        pause();
}
