/* Symbolizer/heap-view target.  Allocates from uniquely named functions on
 * command (stdin lines), dumps its own heap profile on command:
 *   grow N SIZE   N blocks of SIZE bytes from allocdiag_sym_grow_site
 *   churn N SIZE  N blocks from allocdiag_sym_churn_site (kept)
 *   drop          free the churn blocks
 *   dump PATH     write the heap profile (sym_dump.h)
 *   addr          print the address of allocdiag_sym_grow_site
 * Each command answers one line ("OK ..." or "ERR ...").  argv[1]: the
 * gperftools profile prefix. */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "sym_dump.h"

#define MAX_BLOCKS 100000

static void *grown[MAX_BLOCKS];
static int ngrown;
static void *churned[MAX_BLOCKS];
static int nchurned;

__attribute__((noinline)) void allocdiag_sym_grow_site(int n, size_t size) {
    for (int i = 0; i < n && ngrown < MAX_BLOCKS; i++) {
        grown[ngrown] = malloc(size);
        memset(grown[ngrown], 1, size);
        ngrown++;
    }
}

__attribute__((noinline)) void allocdiag_sym_churn_site(int n, size_t size) {
    for (int i = 0; i < n && nchurned < MAX_BLOCKS; i++) {
        churned[nchurned] = malloc(size);
        memset(churned[nchurned], 2, size);
        nchurned++;
    }
}

int main(int argc, char **argv) {
    char line[4096], arg[4000];
    int n;
    size_t size;
    sym_profile_start(argc > 1 ? argv[1] : "/tmp/sym_alloc");
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("READY %d\n", (int)getpid());
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "grow %d %zu", &n, &size) == 2) {
            allocdiag_sym_grow_site(n, size);
            printf("OK grow %d\n", ngrown);
        } else if (sscanf(line, "churn %d %zu", &n, &size) == 2) {
            allocdiag_sym_churn_site(n, size);
            printf("OK churn %d\n", nchurned);
        } else if (strncmp(line, "drop", 4) == 0) {
            while (nchurned > 0)
                free(churned[--nchurned]);
            printf("OK drop\n");
        } else if (sscanf(line, "dump %3999s", arg) == 1) {
            int rc = sym_profile_dump(arg);
            printf(rc == 0 ? "OK dump\n" : "ERR dump %d\n", rc);
        } else if (strncmp(line, "addr", 4) == 0) {
            printf("OK %#lx\n", (unsigned long)(uintptr_t)&allocdiag_sym_grow_site);
        } else {
            printf("ERR %s", line);
        }
    }
    return 0;
}
