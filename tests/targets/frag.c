/* frag COUNT SIZE KEEP_EVERY: allocate COUNT blocks of SIZE bytes, free all
 * but every KEEP_EVERY-th, print READY, idle in read().  Small blocks left
 * scattered over their pages: the allocator's pages stay active while most
 * of their bytes are free (fragmentation). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000000, size = argc > 2 ? atol(argv[2]) : 128;
    long keep = argc > 3 ? atol(argv[3]) : 8;
    char **p = malloc(n * sizeof *p);
    for (long i = 0; i < n; i++) { p[i] = malloc(size); memset(p[i], 1, size); }
    for (long i = 0; i < n; i++) if (i % keep) free(p[i]);
    printf("READY blocks=%ld kept=%ld\n", n, n / keep);
    fflush(stdout);
    char b[16];
    while (read(0, b, sizeof b) > 0) {}
    return 0;
}
