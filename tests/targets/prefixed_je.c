/* Stands in for a Rust program using tikv-jemallocator's default (prefixed)
 * build: its own allocations call _rjem_malloc, while C code (here: main's
 * plain malloc, and libc) keeps using glibc's malloc.  Linked against a copy of
 * libjemalloc_pic.a whose public symbols were renamed with objcopy
 * --redefine-syms (see tests/targets.py: prefixed_jemalloc_archive). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *_rjem_malloc(size_t);
void _rjem_free(void *);
int _rjem_mallctl(const char *, void *, size_t *, void *, size_t);

int main(void) {
    char *rust_side = _rjem_malloc(1 << 20);
    memset(rust_side, 1, 1 << 20);
    char *c_side = malloc(1 << 16);
    memset(c_side, 2, 1 << 16);
    size_t allocated = 0, sz = sizeof allocated;
    unsigned long long epoch = 1; size_t esz = sizeof epoch;
    _rjem_mallctl("epoch", &epoch, &esz, &epoch, esz);
    _rjem_mallctl("stats.allocated", &allocated, &sz, NULL, 0);
    printf("READY rjem_allocated=%zu\n", allocated);
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    _rjem_free(rust_side);
    free(c_side);
    return 0;
}
