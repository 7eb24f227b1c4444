/* dlopen()s an allocator library after start (argv[1], default
 * libjemalloc.so.2) and keeps allocating through glibc's malloc: the library
 * is mapped but does not interpose.  Prints READY, blocks on stdin. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    void *p = malloc(4096);
    void *h = dlopen(argc > 1 ? argv[1] : "libjemalloc.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    void *q = malloc(4096);
    printf("READY %p %p\n", p, q);
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    free(p); free(q);
    return 0;
}
