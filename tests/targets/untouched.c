/* untouched MIB CHUNK_KIB TOUCH_PCT [READ]: malloc MIB MiB in CHUNK_KIB KiB
 * chunks and write only the first TOUCH_PCT percent of each chunk's pages (at
 * least its first byte); with READ 1, read a byte of every other page of each
 * chunk without writing it (a fresh mmapped chunk's page then maps the
 * kernel's shared zero page: present in pagemap, not resident).  Keep them
 * all, print READY, then idle in read() on stdin.
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
    int read_rest = argc > 4 && atoi(argv[4]) == 1;
    long n = mib * 1024 / kib, size = kib * 1024;
    long page = sysconf(_SC_PAGESIZE), sum = 0;
    char **p = calloc(n, sizeof *p);
    for (long i = 0; i < n; i++) {
        p[i] = malloc(size);
        long touch = size * pct / 100;
        if (touch < 1)
            touch = 1;
        memset(p[i], 1, touch);
        if (read_rest)
            for (long off = (touch + page - 1) / page * page; off < size; off += page)
                sum += ((volatile char *)p[i])[off];
    }
    printf("READY chunks=%ld read=%ld\n", n, sum);
    fflush(stdout);
    char b[16];
    while (read(0, b, sizeof b) > 0) {}
    return p[0][0] == 2;
}
