/* Capture gperftools MallocExtension_GetStats text plus every numeric
 * property allocdiag reads, with nothing allocating in between (GetStats
 * prints into a static buffer; GetNumericProperty does not allocate).
 *
 * Build: gcc capture_tcmalloc.c -ltcmalloc   (or _minimal); also runs under
 * LD_PRELOAD of either library when linked with -ltcmalloc_minimal.
 * Usage: capture_tcmalloc [--serve]
 */
#include <gperftools/malloc_extension_c.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *volatile sink[1024];
static int nsink;
#define KEEP(p) (sink[nsink++ % 1024] = (p))

static char stats[1 << 20];
static const char *props[] = {
    "generic.current_allocated_bytes", "generic.heap_size", "generic.total_physical_bytes",
    "tcmalloc.pageheap_free_bytes", "tcmalloc.pageheap_unmapped_bytes",
    "tcmalloc.central_cache_free_bytes", "tcmalloc.transfer_cache_free_bytes",
    "tcmalloc.thread_cache_free_bytes", "tcmalloc.current_total_thread_cache_bytes",
    "tcmalloc.max_total_thread_cache_bytes", "tcmalloc.slack_bytes",
    "tcmalloc.aggressive_memory_decommit", "tcmalloc.heap_limit_mb",
    "tcmalloc.pageheap_committed_bytes", "tcmalloc.pageheap_scavenge_count",
    "tcmalloc.pageheap_commit_count", "tcmalloc.pageheap_total_commit_bytes",
    "tcmalloc.pageheap_decommit_count", "tcmalloc.pageheap_total_decommit_bytes",
    "tcmalloc.pageheap_reserve_count", "tcmalloc.pageheap_total_reserve_bytes",
    NULL};
static size_t values[64];
static int known[64];
static sem_t ready;

static void *worker(void *arg) {
    (void)arg;
    void *p[300];
    for (int i = 0; i < 300; i++) p[i] = KEEP(malloc(32 + (i % 30) * 32));
    for (int i = 0; i < 300; i += 3) free(p[i]);   /* thread-cache freelists */
    sem_post(&ready);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    int serve = argc > 1 && strcmp(argv[1], "--serve") == 0;
    sem_init(&ready, 0, 0);
    for (int i = 0; i < 500; i++) KEEP(malloc(8 + (i % 50) * 16));
    void *mb[10];
    for (int i = 0; i < 10; i++) { mb[i] = malloc(1 << 20); memset(mb[i], 1, 1 << 20); KEEP(mb[i]); }
    void *huge = malloc(40 << 20);
    memset(huge, 1, 40 << 20);
    free(huge);
    MallocExtension_ReleaseToSystem(16 << 20);    /* some unmapped bytes */
    for (int i = 0; i < 10; i += 2) free(mb[i]);   /* page heap free spans */
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    sem_wait(&ready);
    printf("capture_tcmalloc\n");
    fflush(stdout);

    MallocExtension_GetStats(stats, sizeof(stats));
    for (int i = 0; props[i]; i++) known[i] = MallocExtension_GetNumericProperty(props[i], &values[i]);

    printf("=== BEGIN tcmalloc_getstats\n%s", stats);
    if (stats[0] && stats[strlen(stats) - 1] != '\n') putchar('\n');
    printf("=== END tcmalloc_getstats\n");
    for (int i = 0; props[i]; i++)
        if (known[i]) printf("TRUTH %s %zu\n", props[i], values[i]);
    if (serve) {
        printf("READY tcmalloc\n");
        fflush(stdout);
        for (;;) pause();
    }
    return 0;
}
