/* Heap-profile dump from inside the target, for the symbolizer tests:
 * jemalloc (MALLOC_CONF=prof:true) through mallctl("prof.dump"), gperftools
 * (LD_PRELOAD=libtcmalloc.so.4) through HeapProfilerStart/GetHeapProfile.
 * Both found with dlsym, so one binary runs under either allocator. */
#ifndef SYM_DUMP_H
#define SYM_DUMP_H
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);

/* Start gperftools' heap profiler when it is there (PREFIX: its file prefix). */
static void sym_profile_start(const char *prefix) {
    int (*running)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "IsHeapProfilerRunning");
    void (*start)(const char *) = (void (*)(const char *))dlsym(RTLD_DEFAULT, "HeapProfilerStart");
    if (running && start && !running())
        start(prefix);
}

/* Write the current heap profile to PATH; 0 on success. */
static int sym_profile_dump(const char *path) {
    mallctl_fn mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
    if (mallctl) {
        const char *p = path;
        return mallctl("prof.dump", NULL, NULL, (void *)&p, sizeof(p));
    }
    char *(*get)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "GetHeapProfile");
    if (!get)
        return -1;
    char *text = get();
    FILE *f = fopen(path, "w");
    if (!text || !f) {
        free(text);
        if (f)
            fclose(f);
        return -1;
    }
    fputs(text, f);
    free(text);
    return fclose(f);
}
#endif
