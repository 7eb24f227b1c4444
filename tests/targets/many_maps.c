/* Creates N (argv[1], default 20000) separate anonymous mappings -- every
 * other page PROT_READ vs PROT_READ|PROT_WRITE inside one reservation, so
 * the kernel cannot merge them -- touches each, prints READY, blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000, page = sysconf(_SC_PAGESIZE);
    char *base = mmap(NULL, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) { perror("mmap"); return 1; }
    for (long i = 0; i < n; i++) base[i * page] = 1;
    for (long i = 0; i < n; i += 2) mprotect(base + i * page, page, PROT_READ);
    printf("READY %ld\n", n);
    fflush(stdout);
    char b[16];
    while (read(0, b, sizeof b) > 0) {}
    return 0;
}
