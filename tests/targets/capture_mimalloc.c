/* Capture mimalloc's mi_stats_print_out text and mi_process_info values.
 *
 * Debian's mimalloc 2.0.9 has no mi_stats_get / mi_stats_get_json; the text
 * printer and mi_process_info are all there is.  The text is collected into a
 * static buffer (no allocation), then mi_process_info is read.
 * Build: gcc capture_mimalloc.c -lmimalloc ; Usage: capture_mimalloc [--serve]
 */
#include <mimalloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *volatile sink[1024];
static int nsink;
#define KEEP(p) (sink[nsink++ % 1024] = (p))

static char text[1 << 16];
static size_t used;
static sem_t ready;

static void out(const char *msg, void *arg) {
    (void)arg;
    size_t n = strlen(msg);
    if (used + n < sizeof(text)) { memcpy(text + used, msg, n); used += n; }
}

static void *worker(void *arg) {
    (void)arg;
    for (int i = 0; i < 300; i++) KEEP(malloc(48 + (i % 40) * 24));
    sem_post(&ready);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    int serve = argc > 1 && strcmp(argv[1], "--serve") == 0;
    sem_init(&ready, 0, 0);
    for (int i = 0; i < 1000; i++) KEEP(malloc(16 + (i % 64) * 16));
    void *mb[6];
    for (int i = 0; i < 6; i++) { mb[i] = malloc(3 << 20); memset(mb[i], 1, 3 << 20); KEEP(mb[i]); }
    free(mb[1]); free(mb[3]);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    sem_wait(&ready);
    printf("capture_mimalloc version %d\n", mi_version());
    fflush(stdout);

    mi_stats_print_out(out, NULL);
    size_t elapsed, utime, stime, current_rss, peak_rss, current_commit, peak_commit, faults;
    mi_process_info(&elapsed, &utime, &stime, &current_rss, &peak_rss, &current_commit,
                    &peak_commit, &faults);

    printf("=== BEGIN mimalloc_stats\n");
    fwrite(text, 1, used, stdout);
    printf("=== END mimalloc_stats\n");
    printf("TRUTH mi_version %d\n", mi_version());
    printf("TRUTH current_rss %zu\n", current_rss);
    printf("TRUTH peak_rss %zu\n", peak_rss);
    printf("TRUTH current_commit %zu\n", current_commit);
    printf("TRUTH peak_commit %zu\n", peak_commit);
    printf("TRUTH page_faults %zu\n", faults);
    if (serve) {
        printf("READY mimalloc\n");
        fflush(stdout);
        for (;;) pause();
    }
    return 0;
}
