/* NTHREADS threads each allocate once (so, with MALLOC_CONF=narenas:N, each
 * initialises an arena of its own) and then park; the main thread prints
 * READY and waits on stdin.  For the malloc_stats_print output-size test in
 * tests/test_livestats.py.   usage: many_arenas_je NTHREADS */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static sem_t ready;
static void *volatile keep[256];

static void *worker(void *arg) {
    long i = (long)arg;
    keep[i] = malloc(100 + i);
    memset(keep[i], 1, 100 + i);
    sem_post(&ready);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8;
    if (n > 256) n = 256;
    sem_init(&ready, 0, 0);
    pthread_t t;
    for (long i = 0; i < n; i++) pthread_create(&t, NULL, worker, (void *)i);
    for (int i = 0; i < n; i++) sem_wait(&ready);
    printf("READY %d\n", n);
    fflush(stdout);
    char line[64];
    while (read(0, line, sizeof line) > 0) {}
    return 0;
}
