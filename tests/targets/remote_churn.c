/* Malloc/free churn for tests/test_remote_engine.py.
 *
 * usage: remote_churn NTHREADS IDLE
 * NTHREADS threads malloc/free 16 B .. 256 KiB continuously (a pool of 64
 * live blocks each, touched on allocation).  IDLE=1: the main thread then sits
 * in read(stdin) (the one safe thread).  IDLE=0: the main thread churns too,
 * so no thread is ever idle.  `ops` (address printed) counts operations.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile long ops[64];
static void *pools[64][64];   /* not on the stack: churn()'s frame stays small */

static void *churn(void *arg)
{
    long id = (long)arg;
    void **pool = pools[id];
    unsigned s = 12345u + (unsigned)id * 7919u;
    for (;;) {
        s = s * 1103515245u + 12345u;
        int i = (s >> 8) % 64;
        free(pool[i]);
        size_t sz = 16u << ((s >> 16) % 15); /* 16 B .. 256 KiB */
        sz += (s >> 4) % 16;
        pool[i] = malloc(sz);
        if (pool[i])
            ((char *)pool[i])[0] = (char)id;
        ops[id]++;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 8;
    int idle = argc > 2 ? atoi(argv[2]) : 1;
    pthread_t th;
    for (long i = 1; i <= n; i++)
        pthread_create(&th, NULL, churn, (void *)i);
    printf("READY ops=%p mallinfo2=%p mallctl=%p tc_numeric=%p mi_stats=%p main=%d\n",
           (void *)ops, (void *)mallinfo2, dlsym(RTLD_DEFAULT, "mallctl"),
           dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty"),
           dlsym(RTLD_DEFAULT, "mi_stats_merge"), (int)getpid());
    fflush(stdout);
    if (!idle)
        churn((void *)0);
    char c;
    while (read(0, &c, 1) > 0)
        ;
    for (;;)
        pause();
}
