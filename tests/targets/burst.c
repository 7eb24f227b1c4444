/* burst MIB CHUNK_KIB KEEP_EVERY: allocate MIB MiB in CHUNK_KIB KiB chunks
 * (touched), free all but every KEEP_EVERY-th (0 = free all), print READY
 * with the numbers, then idle in read() on stdin: an idle process after a
 * burst, the case where allocators that only purge on activity keep the
 * freed pages resident.  A fourth argument "sleep" idles in sleep() instead,
 * for runners that give no stdin (allocdiag compare). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long mib = argc > 1 ? atol(argv[1]) : 256, kib = argc > 2 ? atol(argv[2]) : 64;
    long keep = argc > 3 ? atol(argv[3]) : 0;
    long n = mib * 1024 / kib;
    char **p = calloc(n, sizeof *p);
    for (long i = 0; i < n; i++) { p[i] = malloc(kib * 1024); memset(p[i], 1, kib * 1024); }
    long kept = 0;
    for (long i = 0; i < n; i++) {
        if (keep && i % keep == 0) { kept++; continue; }
        free(p[i]);
    }
    printf("READY chunks=%ld kept=%ld\n", n, kept);
    fflush(stdout);
    if (argc > 4 && strcmp(argv[4], "sleep") == 0)
        for (;;) sleep(3600);
    char b[16];
    while (read(0, b, sizeof b) > 0) {}
    return 0;
}
