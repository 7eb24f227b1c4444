/* Heap-profile control target (tests/test_heap_live.py).  Prints READY and
 * then waits on stdin (a restartable read: a safe point) so the test can
 * start a profile first and only then ask for allocations:
 *   grow N SIZE   N blocks of SIZE bytes from allocdiag_heapctl_grow_site (kept)
 *   free          free them
 * Each command answers one line, "OK ..." after the work is done. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_BLOCKS 100000

static void *blocks[MAX_BLOCKS];
static int nblocks;

__attribute__((noinline)) void allocdiag_heapctl_grow_site(int n, size_t size) {
    for (int i = 0; i < n && nblocks < MAX_BLOCKS; i++) {
        blocks[nblocks] = malloc(size);
        memset(blocks[nblocks], 1, size);   /* resident, and not optimised away */
        nblocks++;
    }
}

int main(void) {
    char line[256];
    int n;
    size_t size;
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("READY %d\n", (int)getpid());
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "grow %d %zu", &n, &size) == 2) {
            allocdiag_heapctl_grow_site(n, size);
            printf("OK grow %d\n", nblocks);
        } else if (strncmp(line, "free", 4) == 0) {
            while (nblocks > 0)
                free(blocks[--nblocks]);
            printf("OK free\n");
        } else {
            printf("ERR %s", line);
        }
    }
    return 0;
}
