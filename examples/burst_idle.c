/*
 * burst_idle.c -- "the burst is over and freed, why is RSS still up?"
 *
 * Field situation: a batch or a traffic burst allocates a large working set
 * in big blocks, frees almost all of it, then the process goes quiet.  What
 * happens to the freed pages is the allocator's policy, and two of them keep
 * them by design:
 *
 *   tcmalloc (gperftools)  blocks > 256 KiB come straight from the page heap
 *                          and go back to its free lists; they are returned
 *                          to the OS only gradually, driven by later frees,
 *                          at TCMALLOC_RELEASE_RATE (default 1.0; 0 = never).
 *                          launch.py sets TCMALLOC_RELEASE_RATE=0 by default
 *                          for this workload under tcmalloc/tcmalloc_minimal.
 *                          Measured: TCMALLOC_RELEASE_RATE=10 does not return
 *                          this burst (no later frees drive the release);
 *                          TCMALLOC_AGGRESSIVE_DECOMMIT=true does (RSS 14 MiB).
 *                          allocdiag: page heap free ("dirty") ~= freed,
 *                          unmapped ("retained") ~0; finding
 *                          tcmalloc-pageheap-free, knob
 *                          TCMALLOC_AGGRESSIVE_DECOMMIT.
 *   mimalloc 2.0           freed segments stay committed until decommit_delay
 *                          (25 ms by default) has passed AND the program calls
 *                          into mimalloc again; an idle process never does, so
 *                          committed stays near the burst while reserved
 *                          (address space) is larger still.  allocdiag:
 *                          committed ~= burst (resident: its touched pages), allocated ~= what
 *                          is kept (segment walk); finding
 *                          mimalloc-decommit-delay, knob decommit_delay=0
 *                          (MIMALLOC_DECOMMIT_DELAY / purge_delay in 2.1).
 *   glibc                  blocks >= 128 KiB (M_MMAP_THRESHOLD) are mmapped
 *                          and munmapped on free: RSS comes back at once.
 *   jemalloc 5.3           dirty pages decay over dirty_decay_ms (10 s) but
 *                          only with allocator activity (no background thread).
 *
 * Options: --mib N (128) --block-kib N (512) --keep-pct N (5)
 *
 * READY allocated=B freed=B rss=B rss_anon=B
 *   printed 0.5 s after the free; then the process sleeps in nanosleep (a
 *   wait the remote engine can borrow) until SIGTERM/SIGINT (exit 0).
 *
 * Measured here (kernel 6.18, Debian 12, defaults; MiB): see
 * examples/README.md ("Demo scenes").
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void on_term(int sig)
{
    (void)sig;
    _exit(0);
}

static long long status_field(const char *key)
{
    char line[256];
    long long kib = 0;
    size_t n = strlen(key);
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            kib = atoll(line + n + 1);
            break;
        }
    fclose(f);
    return kib * 1024;
}

int main(int argc, char **argv)
{
    long mib = 128, block_kib = 512, keep_pct = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = atol(argv[++i]);
        else if (!strcmp(argv[i], "--block-kib") && i + 1 < argc)
            block_kib = atol(argv[++i]);
        else if (!strcmp(argv[i], "--keep-pct") && i + 1 < argc)
            keep_pct = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--mib N] [--block-kib N] [--keep-pct N]\n", argv[0]);
            return 2;
        }
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);

    size_t block = (size_t)block_kib * 1024;
    long n = mib * 1024 / block_kib;
    char **blocks = calloc(n, sizeof *blocks);
    if (!blocks)
        return 1;
    for (long i = 0; i < n; i++) {
        blocks[i] = malloc(block);
        if (!blocks[i])
            return 1;
        memset(blocks[i], 0x5a, block);       /* resident */
    }
    /* Free all but every (100/keep_pct)-th block: the survivors are spread
     * over the whole burst, as in a real cache. */
    long stride = keep_pct > 0 ? 100 / keep_pct : n + 1;
    long long freed = 0, kept = 0;
    for (long i = 0; i < n; i++) {
        if (i % stride == 0) {
            kept += block;
            continue;
        }
        free(blocks[i]);
        blocks[i] = NULL;
        freed += block;
    }
    struct timespec half = {0, 500 * 1000 * 1000};
    nanosleep(&half, NULL);
    printf("READY allocated=%lld freed=%lld rss=%lld rss_anon=%lld\n", kept, freed,
           status_field("VmRSS"), status_field("RssAnon"));
    fflush(stdout);
    for (;;) {
        struct timespec t = {3600, 0};
        nanosleep(&t, NULL);
    }
}
