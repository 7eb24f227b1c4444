/* Capture jemalloc malloc_stats_print(..., "J") plus the mallctl values
 * allocdiag reads, from the same stats snapshot.
 *
 * Build: gcc capture_jemalloc.c -ljemalloc -lpthread; the tests also run it
 * with LD_PRELOAD of the same libjemalloc.so.2 (one copy in the process).
 *
 * malloc_stats_print writes "epoch" itself and allocates its output buffer
 * before doing so; the write callback therefore reads the mallctls WITHOUT
 * writing epoch, i.e. from exactly the snapshot the JSON was printed from.
 * The callback copies into a static buffer (no allocation).
 *
 * --table: also print, after a discarded print that settles where the
 * print's own output buffer comes from, "Jdablxeh" and then "dablxeh" (the
 * same options as a table, allocdiag's first-snapshot print) of the same
 * quiet moment.
 *
 * Usage: capture_jemalloc [--serve] [--one-arena] [--table]
 */
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *volatile sink[512];
static int nsink;
#define KEEP(p) (sink[nsink++ % 512] = (p))

static char out[4 << 20];
static size_t used;
static int have_truth;
static size_t t_allocated, t_active, t_metadata, t_resident, t_mapped, t_retained,
    t_pdirty, t_pmuzzy, t_pactive, t_page;
static unsigned t_narenas;

static void get_size(const char *name, size_t *v) {
    size_t sz = sizeof(*v);
    if (mallctl(name, v, &sz, NULL, 0) != 0) *v = (size_t)-1;
}

static void write_cb(void *opaque, const char *s) {
    (void)opaque;
    if (!have_truth) {
        have_truth = 1;
        get_size("stats.allocated", &t_allocated);
        get_size("stats.active", &t_active);
        get_size("stats.metadata", &t_metadata);
        get_size("stats.resident", &t_resident);
        get_size("stats.mapped", &t_mapped);
        get_size("stats.retained", &t_retained);
        get_size("stats.arenas.4096.pdirty", &t_pdirty);
        get_size("stats.arenas.4096.pmuzzy", &t_pmuzzy);
        get_size("stats.arenas.4096.pactive", &t_pactive);
        get_size("arenas.page", &t_page);
        size_t sz = sizeof(t_narenas);
        mallctl("arenas.narenas", &t_narenas, &sz, NULL, 0);
    }
    size_t n = strlen(s);
    if (used + n < sizeof(out)) { memcpy(out + used, s, n); used += n; }
}

static sem_t ready;

static void *worker(void *arg) {
    (void)arg;
    for (int i = 0; i < 100; i++) KEEP(malloc(64 + i * 8));
    void *mb[4];
    for (int i = 0; i < 4; i++) { mb[i] = malloc(512 << 10); memset(mb[i], 3, 512 << 10); KEEP(mb[i]); }
    free(mb[0]); free(mb[2]);     /* dirty pages in this thread's arena */
    sem_post(&ready);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    int serve = 0, one_arena = 0, table = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--table") == 0) table = 1;
        if (strcmp(argv[i], "--serve") == 0) serve = 1;
        if (strcmp(argv[i], "--one-arena") == 0) one_arena = 1;
    }
    sem_init(&ready, 0, 0);
    for (int i = 0; i < 200; i++) KEEP(malloc(16 + (i % 20) * 16));
    void *large = malloc(5 << 20);
    memset(large, 1, 5 << 20);
    KEEP(large);
    /* Dirty pages: free every other 1 MiB extent (no coalescing) and a
       burst of small regions; they stay dirty for dirty_decay_ms (10 s). */
    void *mb[8];
    for (int i = 0; i < 8; i++) { mb[i] = malloc(1 << 20); memset(mb[i], 1, 1 << 20); KEEP(mb[i]); }
    for (int i = 0; i < 8; i += 2) free(mb[i]);
    void *q[2000];
    for (int i = 0; i < 2000; i++) q[i] = KEEP(malloc(100));
    for (int i = 0; i < 2000; i++) free(q[i]);
    if (!one_arena) {
        pthread_t t;
        pthread_create(&t, NULL, worker, NULL);
        sem_wait(&ready);
    }
    /* CAPTURE_SLEEP_MS: let a background thread decay dirty pages to muzzy
       (run with MALLOC_CONF=background_thread:true,dirty_decay_ms:100,...). */
    const char *nap = getenv("CAPTURE_SLEEP_MS");
    if (nap) usleep((useconds_t)atoi(nap) * 1000);
    malloc_stats_print(write_cb, NULL, "J");
    printf("=== BEGIN jemalloc_stats_json\n");
    fwrite(out, 1, used, stdout);
    if (used && out[used - 1] != '\n') putchar('\n');
    printf("=== END jemalloc_stats_json\n");
    printf("TRUTH stats.allocated %zu\n", t_allocated);
    printf("TRUTH stats.active %zu\n", t_active);
    printf("TRUTH stats.metadata %zu\n", t_metadata);
    printf("TRUTH stats.resident %zu\n", t_resident);
    printf("TRUTH stats.mapped %zu\n", t_mapped);
    printf("TRUTH stats.retained %zu\n", t_retained);
    printf("TRUTH stats.arenas.4096.pdirty %zu\n", t_pdirty);
    printf("TRUTH stats.arenas.4096.pmuzzy %zu\n", t_pmuzzy);
    printf("TRUTH stats.arenas.4096.pactive %zu\n", t_pactive);
    printf("TRUTH arenas.page %zu\n", t_page);
    printf("TRUTH arenas.narenas %u\n", t_narenas);
    if (table) {
        static const char *forms[][2] = {{"Jdablxeh", "jemalloc_stats_json_dablxeh"},
                                         {"dablxeh", "jemalloc_stats_table_dablxeh"}};
        used = 0;
        malloc_stats_print(write_cb, NULL, "Jdablxeh");
        for (int f = 0; f < 2; f++) {
            used = 0;
            malloc_stats_print(write_cb, NULL, forms[f][0]);
            printf("=== BEGIN %s\n", forms[f][1]);
            fwrite(out, 1, used, stdout);
            if (used && out[used - 1] != '\n') putchar('\n');
            printf("=== END %s\n", forms[f][1]);
        }
    }
    if (serve) {
        /* Same-moment truth for live readers: refresh the epoch and read
           the mallctls again here, after every allocation above (including
           malloc_stats_print's own), printing into the stdout buffer that
           already exists, so nothing allocates between this and READY. */
        uint64_t epoch = 1; size_t esz = sizeof epoch;
        mallctl("epoch", &epoch, &esz, &epoch, esz);
        have_truth = 0;
        write_cb(NULL, "");
        printf("LIVE stats.allocated %zu\n", t_allocated);
        printf("LIVE stats.active %zu\n", t_active);
        printf("LIVE stats.metadata %zu\n", t_metadata);
        printf("LIVE stats.resident %zu\n", t_resident);
        printf("LIVE stats.mapped %zu\n", t_mapped);
        printf("LIVE stats.retained %zu\n", t_retained);
        printf("LIVE stats.arenas.4096.pdirty %zu\n", t_pdirty);
        printf("LIVE stats.arenas.4096.pmuzzy %zu\n", t_pmuzzy);
        printf("LIVE stats.arenas.4096.pactive %zu\n", t_pactive);
        printf("LIVE arenas.page %zu\n", t_page);
        printf("LIVE arenas.narenas %u\n", t_narenas);
        printf("READY jemalloc\n");
        fflush(stdout);
        for (;;) pause();
    }
    return 0;
}
