/* untouched MIB CHUNK_KIB TOUCH_PCT: malloc MIB MiB in CHUNK_KIB KiB chunks
 * and write only the first TOUCH_PCT percent of each chunk's pages (at least
 * its first byte), keep them all, print READY, then idle in read() on stdin.
 * Memory an allocator has handed out (committed, active) but the program
 * never touched is not resident: the case where an allocator's own
 * "resident" or "committed" figure is above the kernel's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long mib = argc > 1 ? atol(argv[1]) : 64, kib = argc > 2 ? atol(argv[2]) : 1024;
    long pct = argc > 3 ? atol(argv[3]) : 0;
    long n = mib * 1024 / kib, size = kib * 1024;
    char **p = calloc(n, sizeof *p);
    for (long i = 0; i < n; i++) {
        p[i] = malloc(size);
        long touch = size * pct / 100;
        memset(p[i], 1, touch > 0 ? touch : 1);
    }
    printf("READY chunks=%ld\n", n);
    fflush(stdout);
    char b[16];
    while (read(0, b, sizeof b) > 0) {}
    return p[0][0] == 2;
}
