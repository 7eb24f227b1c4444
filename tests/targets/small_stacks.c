/* Target for tests/test_stack_bounds.py: a thread pool with small stacks.
 *
 * usage: small_stacks THREADS READERS STACK_KIB [READER_STACK_KIB]
 * THREADS threads created with pthread_attr_setstacksize(STACK_KIB KiB)
 * (readers and the controller with READER_STACK_KIB when given); the first READERS of them
 * block in read() on a pipe, the rest in pthread_cond_wait.  The main
 * thread blocks in pthread_mutex_lock on a mutex the controller thread
 * holds (a futex lock wait: never borrowed), so only pool threads can be
 * borrowed.  The controller (also a small-stack thread) reads stdin:
 *   'q'  release the pool: every thread mallocs, touches and frees 64 KiB
 *        in 16 pieces, returns; main joins them all and exits 0 (1 when a
 *        thread saw a failed read or a corrupted malloc result).
 *   EOF  same as 'q'.
 *
 * READY line: main=<tid> guard=<bytes>, then "tid:stack_lo:stack_hi:kind"
 * per pool thread (kind r reader, c condition waiter, k the controller, in
 * read() on stdin with the pool's stack size; lo/hi from pthread_getattr_np:
 * the stack block, guard excluded) and ":rseq_area" (address of the rseq
 * area the kernel updates; __rseq_offset from the thread pointer).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t hold = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t ready_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready_cv = PTHREAD_COND_INITIALIZER;
static int released, nready, pipefd[2];
static volatile int bad;

struct info { pid_t tid; uintptr_t lo, hi, rseq; int reader; };
static struct info *infos;

static void work(void)
{
    void *p[16];
    for (int i = 0; i < 16; i++) {
        p[i] = malloc(4096);
        if (!p[i]) { bad = 1; return; }
        memset(p[i], i, 4096);
    }
    for (int i = 0; i < 16; i++) {
        if (((unsigned char *)p[i])[4095] != i)
            bad = 1;
        free(p[i]);
    }
}

static void whoami(struct info *me)
{
    pthread_attr_t a;
    void *lo;
    size_t sz;
    me->tid = syscall(SYS_gettid);
    pthread_getattr_np(pthread_self(), &a);
    pthread_attr_getstack(&a, &lo, &sz);
    pthread_attr_destroy(&a);
    me->lo = (uintptr_t)lo;
    me->hi = (uintptr_t)lo + sz;
    /* the thread's rseq area (in its struct pthread): the kernel rewrites
       cpu_id and mm_cid in it whenever the thread runs on another CPU */
    me->rseq = (uintptr_t)__builtin_thread_pointer() + __rseq_offset;
}

static void *pool(void *arg)
{
    struct info *me = arg;
    whoami(me);
    free(malloc(100));        /* every thread has used the allocator once */
    pthread_mutex_lock(&ready_mu);
    nready++;
    pthread_cond_signal(&ready_cv);
    pthread_mutex_unlock(&ready_mu);
    if (me->reader) {
        char c;
        if (read(pipefd[0], &c, 1) != 1 || c != 'x')
            bad = 1;
    } else {
        pthread_mutex_lock(&mu);
        while (!released)
            pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
    }
    work();
    return NULL;
}

static int nthreads, nreaders;

static void *controller(void *arg)
{
    char c = 0;
    whoami(arg);
    pthread_mutex_lock(&hold);
    pthread_mutex_lock(&ready_mu);
    nready++;
    pthread_cond_signal(&ready_cv);
    pthread_mutex_unlock(&ready_mu);
    while (read(0, &c, 1) == 1 && c != 'q')
        ;
    pthread_mutex_lock(&mu);
    released = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < nreaders; i++)
        if (write(pipefd[1], "x", 1) != 1)
            bad = 1;
    work();
    pthread_mutex_unlock(&hold);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: small_stacks THREADS READERS STACK_KIB [READER_STACK_KIB]\n");
        return 2;
    }
    nthreads = atoi(argv[1]);
    nreaders = atoi(argv[2]);
    size_t stack = (size_t)atoi(argv[3]) * 1024;
    size_t rstack = argc > 4 ? (size_t)atoi(argv[4]) * 1024 : stack;
    if (pipe(pipefd))
        return 2;
    infos = calloc(nthreads + 1, sizeof *infos);
    pthread_t *th = calloc(nthreads + 1, sizeof *th);
    pthread_attr_t a;
    size_t guard;
    pthread_attr_init(&a);
    pthread_attr_getguardsize(&a, &guard);
    for (int i = 0; i < nthreads; i++) {
        infos[i].reader = i < nreaders;
        if (pthread_attr_setstacksize(&a, infos[i].reader ? rstack : stack) ||
            pthread_create(&th[i], &a, pool, &infos[i])) {
            fprintf(stderr, "pthread_create %d failed\n", i);
            return 2;
        }
    }
    pthread_attr_setstacksize(&a, rstack);      /* the controller waits in read() too */
    infos[nthreads].reader = 2;
    pthread_create(&th[nthreads], &a, controller, &infos[nthreads]);
    pthread_mutex_lock(&ready_mu);
    while (nready < nthreads + 1)
        pthread_cond_wait(&ready_cv, &ready_mu);
    pthread_mutex_unlock(&ready_mu);
    printf("READY main=%ld guard=%zu", (long)syscall(SYS_gettid), guard);
    for (int i = 0; i <= nthreads; i++)
        printf(" %d:%#lx:%#lx:%c:%#lx", infos[i].tid, (unsigned long)infos[i].lo,
               (unsigned long)infos[i].hi, "rck"[infos[i].reader == 2 ? 2 : !infos[i].reader],
               (unsigned long)infos[i].rseq);
    printf("\n");
    fflush(stdout);
    usleep(20000);            /* let the controller block in read() first */
    pthread_mutex_lock(&hold);        /* a futex lock wait until 'q' */
    pthread_mutex_unlock(&hold);
    for (int i = 0; i <= nthreads; i++)
        pthread_join(th[i], NULL);
    work();
    return bad;
}
