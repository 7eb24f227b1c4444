/* Truth target for the mimalloc segment walk (run with LD_PRELOAD of
 * libmimalloc.so.2).  Builds a known live population and prints its total
 * usable size, then READY, then blocks on stdin:
 *   - the main thread keeps blocks of several sizes and one huge block;
 *   - thread A allocates, hands its blocks to main and exits: its segment is
 *     abandoned with live blocks, and main frees half of them (cross-thread);
 *   - thread B allocates pages full of blocks and parks on a pipe; main frees
 *     a part of them, so those frees stay pending on B's xthread_free lists
 *     (and its heap's thread_delayed_free for pages that were full).
 * argv: scale (default 4000: about 40 MiB of small blocks plus the 40 MiB one).
 * Output: "LIVE <bytes>" (sum of malloc_usable_size over live blocks).
 */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int scale = 4000;
static void **a_blocks, **b_blocks;
static int a_n, b_n;
static int b_park[2];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int b_ready;

static void *thread_a(void *arg) {
    (void)arg;
    static const size_t sizes[] = {48, 512, 4096};
    a_n = 3 * scale;
    a_blocks = malloc(sizeof(void *) * a_n);
    for (int i = 0; i < a_n; i++) {
        a_blocks[i] = malloc(sizes[i % 3]);
        memset(a_blocks[i], 1, sizes[i % 3]);
    }
    return NULL;          /* exits: its segments are abandoned */
}

static void *thread_b(void *arg) {
    (void)arg;
    static const size_t sizes[] = {32, 256, 1024};
    b_n = 3 * scale;
    b_blocks = malloc(sizeof(void *) * b_n);
    for (int i = 0; i < b_n; i++) {
        b_blocks[i] = malloc(sizes[i % 3]);
        memset(b_blocks[i], 2, sizes[i % 3]);
    }
    pthread_mutex_lock(&mu);
    b_ready = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    char c;
    while (read(b_park[0], &c, 1) < 0) {}   /* parked: never collects its frees */
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) scale = atoi(argv[1]);
    static const size_t sizes[] = {16, 64, 128, 1024, 8192, 16384};
    int m_n = 6 * scale / 4;
    void **m_blocks = malloc(sizeof(void *) * m_n);
    for (int i = 0; i < m_n; i++) {
        m_blocks[i] = malloc(sizes[i % 6]);
        memset(m_blocks[i], 3, sizes[i % 6]);
    }
    void *huge = malloc(40u << 20);          /* a huge segment of its own */
    memset(huge, 4, 40u << 20);

    printf("START\n");                      /* stdio's buffer now, not after A exits */
    pthread_t ta, tb;
    if (pipe(b_park) != 0) return 1;
    pthread_create(&tb, NULL, thread_b, NULL);
    pthread_mutex_lock(&mu);
    while (!b_ready) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    /* A last: nothing allocates after it exits, so nobody reclaims its segment */
    pthread_create(&ta, NULL, thread_a, NULL);
    pthread_join(ta, NULL);

    for (int i = 0; i < a_n; i += 2) { free(a_blocks[i]); a_blocks[i] = NULL; }
    for (int i = 0; i < b_n; i += 3) { free(b_blocks[i]); b_blocks[i] = NULL; }
    for (int i = 0; i < m_n; i += 5) { free(m_blocks[i]); m_blocks[i] = NULL; }

    size_t live = malloc_usable_size(huge);
    for (int i = 0; i < m_n; i++) if (m_blocks[i]) live += malloc_usable_size(m_blocks[i]);
    for (int i = 0; i < a_n; i++) if (a_blocks[i]) live += malloc_usable_size(a_blocks[i]);
    for (int i = 0; i < b_n; i++) if (b_blocks[i]) live += malloc_usable_size(b_blocks[i]);
    live += malloc_usable_size(m_blocks) + malloc_usable_size(a_blocks) + malloc_usable_size(b_blocks);
    printf("LIVE %zu\n", live);
    printf("READY\n");
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {}
    return 0;
}
