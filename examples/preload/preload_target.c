/*
 * preload_target.c -- the tiny C program behind preload_mistakes.py.
 *
 * It allocates a little, reports who actually serves its malloc, prints
 *
 *   READY scenario=S malloc_from=PATH jemalloc_mapped=0|1 preload=VALUE [...]
 *
 * and idles in nanosleep() until SIGTERM/SIGINT (exit 0).
 *   malloc_from     the object that defines the `malloc` this program's
 *                   calls bind to (dladdr of dlsym(RTLD_DEFAULT, "malloc"));
 *                   "exe" when it is the executable itself (static jemalloc)
 *   jemalloc_mapped 1 when any mapping in /proc/self/maps names jemalloc
 *   preload         LD_PRELOAD as the program sees it ("-" when unset)
 *
 * Build variants (preload_mistakes.py picks them):
 *   plain                    typo, setuid; `--dlopen LIB` dlopen()s LIB after
 *                            start (RTLD_NOW|RTLD_LOCAL, like a plugin or an
 *                            extension module linked to jemalloc) and makes one
 *                            allocation through the library's own malloc
 *                            (dlsym), while the program's malloc stays glibc.
 *   -DUSE_RJEM               linked with the _rjem_-renamed libjemalloc_pic.a:
 *                            "Rust" allocations go through _rjem_malloc, the C
 *                            code keeps glibc malloc; adds rjem_allocated=B
 *                            (from _rjem_mallctl "stats.allocated").
 *   -DUSE_JE_STATIC          linked with libjemalloc_pic.a as is: malloc and
 *                            mallctl live in the executable; adds
 *                            je_allocated=B je_version=V.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef USE_RJEM
void *_rjem_malloc(size_t size);
void _rjem_free(void *ptr);
int _rjem_mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp,
                  size_t newlen);
#endif
#ifdef USE_JE_STATIC
int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp,
            size_t newlen);
#endif

static void on_term(int sig)
{
    (void)sig;
    _exit(0);
}

static int jemalloc_mapped(void)
{
    char line[512];
    int found = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, "jemalloc") != NULL;
    fclose(f);
    return found;
}

static const char *malloc_from(void)
{
    static char exe[4096];
    Dl_info info;
    void *sym = dlsym(RTLD_DEFAULT, "malloc");
    if (!sym || !dladdr(sym, &info) || !info.dli_fname)
        return "unknown";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        if (!strcmp(exe, info.dli_fname))
            return "exe";
    }
    return info.dli_fname[0] ? info.dli_fname : "exe";
}

int main(int argc, char **argv)
{
    const char *scenario = "plain", *dl = NULL;
    void *keep[64];

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--scenario") && i + 1 < argc)
            scenario = argv[++i];
        else if (!strcmp(argv[i], "--dlopen") && i + 1 < argc)
            dl = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--scenario S] [--dlopen LIB]\n", argv[0]);
            return 2;
        }
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);

    for (int i = 0; i < 64; i++) {          /* the program's own C allocations */
        keep[i] = malloc(1024 * (size_t)(i + 1));
        memset(keep[i], i, 1024 * (size_t)(i + 1));
    }

    char extra[256] = "";
    if (dl) {
        void *h = dlopen(dl, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlopen(%s): %s\n", dl, dlerror());
            return 1;
        }
        /* The library's own malloc is reachable only through its handle. */
        void *(*lib_malloc)(size_t) = (void *(*)(size_t))dlsym(h, "malloc");
        void *p = lib_malloc ? lib_malloc(4096) : NULL;
        if (p)
            memset(p, 1, 4096);              /* kept: one block in jemalloc */
        for (int i = 0; i < 64; i++)         /* still glibc: binding was done */
            keep[i] = realloc(keep[i], 2048 * (size_t)(i + 1));
        snprintf(extra, sizeof extra, " dlopened=%s lib_malloc_used=%d", dl, p != NULL);
    }

#ifdef USE_RJEM
    void *rust[256];
    for (int i = 0; i < 256; i++) {          /* the "Rust" side: Box/Vec/String */
        rust[i] = _rjem_malloc(16384);
        memset(rust[i], 2, 16384);
    }
    uint64_t epoch = 1;
    size_t allocated = 0, len = sizeof epoch;
    _rjem_mallctl("epoch", &epoch, &len, &epoch, sizeof epoch);
    len = sizeof allocated;
    _rjem_mallctl("stats.allocated", &allocated, &len, NULL, 0);
    snprintf(extra, sizeof extra, " rjem_allocated=%zu rust_blocks=%d", allocated,
             rust[255] != NULL ? 256 : 0);
#endif
#ifdef USE_JE_STATIC
    uint64_t epoch = 1;
    size_t allocated = 0, len = sizeof epoch;
    const char *version = "?";
    mallctl("epoch", &epoch, &len, &epoch, sizeof epoch);
    len = sizeof allocated;
    mallctl("stats.allocated", &allocated, &len, NULL, 0);
    len = sizeof version;
    mallctl("version", &version, &len, NULL, 0);
    snprintf(extra, sizeof extra, " je_allocated=%zu je_version=%s", allocated, version);
#endif

    const char *pre = getenv("LD_PRELOAD");
    printf("READY scenario=%s malloc_from=%s jemalloc_mapped=%d preload=%s%s\n",
           scenario, malloc_from(), jemalloc_mapped(), pre && *pre ? pre : "-", extra);
    fflush(stdout);

    for (;;) {
        struct timespec ts = { 1, 0 };
        nanosleep(&ts, NULL);
    }
}
