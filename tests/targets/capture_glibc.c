/* Capture glibc malloc_info XML + mallinfo2 at a quiescent point.
 *
 * Usage: capture_glibc            print and exit (fixture capture)
 *        capture_glibc --serve    print, then "READY" and block (test target)
 *
 * Output: "=== BEGIN malloc_info" / XML / "=== END malloc_info", then
 * "TRUTH <mallinfo2 field> <value>" lines.  mallinfo2() is called right
 * before malloc_info(0, stdout) with nothing allocating in between (the
 * stdout buffer is allocated by the first printf, before both calls), so
 * the two describe the same heap state.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static sem_t ready;
static void *keep[64];
/* Every pointer escapes into this array so the compiler keeps each malloc/free. */
void *volatile sink[256];
static int nsink;
#define KEEP(p) (sink[nsink++ % 256] = (p))

static void *worker(void *arg) {
    (void)arg;
    /* A second arena: allocations from another thread. */
    for (int i = 0; i < 32; i++) {
        keep[i] = KEEP(malloc(200 + i * 64));
        memset(keep[i], 1, 200 + i * 64);
    }
    for (int i = 0; i < 32; i += 2) free(keep[i]);
    void *mid = KEEP(malloc(5000));
    void *guard = KEEP(malloc(100));
    free(mid); (void)guard;
    sem_post(&ready);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    int serve = argc > 1 && strcmp(argv[1], "--serve") == 0;
    sem_init(&ready, 0, 0);
    printf("capture_glibc pid %d\n", (int)getpid());
    /* Fast bins: glibc 2.36 keeps 7 chunks per size in tcache, the rest of
       the freed small chunks go to fastbins. */
    void *small[40];
    for (int i = 0; i < 40; i++) small[i] = KEEP(malloc(24));
    void *sep = KEEP(malloc(16));
    /* Unsorted / regular bins: free chunks larger than tcache's limit that
       do not border the top chunk. */
    void *a = KEEP(malloc(3000)), *b = KEEP(malloc(40)), *c = KEEP(malloc(9000)), *d = KEEP(malloc(40));
    void *e = KEEP(malloc(70000)), *f = KEEP(malloc(40));
    free(a); free(c);
    void *g = KEEP(malloc(100000));    /* sorts the unsorted chunks into bins */
    free(e);                      /* stays in the unsorted bin */
    /* mmapped chunks (above the 128 KiB threshold). */
    void *big1 = KEEP(malloc(1 << 20)), *big2 = KEEP(malloc(3 << 20));
    memset(big1, 2, 1 << 20);
    /* Last, so no later large request consolidates the fastbins. */
    for (int i = 0; i < 40; i++) free(small[i]);
    (void)sep; (void)b; (void)d; (void)f; (void)g; (void)big2;
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    sem_wait(&ready);
    fflush(stdout);

    struct mallinfo2 mi = mallinfo2();
    printf("=== BEGIN malloc_info\n");
    malloc_info(0, stdout);
    printf("=== END malloc_info\n");
    printf("TRUTH arena %zu\n", mi.arena);
    printf("TRUTH ordblks %zu\n", mi.ordblks);
    printf("TRUTH smblks %zu\n", mi.smblks);
    printf("TRUTH hblks %zu\n", mi.hblks);
    printf("TRUTH hblkhd %zu\n", mi.hblkhd);
    printf("TRUTH usmblks %zu\n", mi.usmblks);
    printf("TRUTH fsmblks %zu\n", mi.fsmblks);
    printf("TRUTH uordblks %zu\n", mi.uordblks);
    printf("TRUTH fordblks %zu\n", mi.fordblks);
    printf("TRUTH keepcost %zu\n", mi.keepcost);
    if (serve) {
        printf("READY glibc\n");
        fflush(stdout);
        for (;;) pause();
    }
    return 0;
}
