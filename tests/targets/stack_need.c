/* Stack high-water mark of each allocator entry point allocdiag calls in a
 * target (tests/test_stack_bounds.py; figures beside the gather code in
 * collectors/allocators/*.py).
 *
 * usage: stack_need   (run with the allocator preloaded, or none for glibc)
 * Each entry point is called twice on a thread with a 1 MiB stack whose
 * unused part below the caller's frame was filled with a byte pattern first;
 * the lowest byte no longer holding the pattern gives the bytes the call used
 * below the caller's frame.  Prints "NAME BYTES" per entry point found
 * (dlsym: the preloaded allocator's own symbol wins), the larger of the two
 * calls.  The calls are made as allocdiag makes them (same arguments).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPAN (512 * 1024)
#define GAP 512
#define PATTERN 0xA5

typedef void (*thunk)(void);
static char *frame;

static __attribute__((noinline)) void fill(char *lo, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ((volatile char *)lo)[i] = PATTERN;
}

static __attribute__((noinline)) size_t measure(thunk fn)
{
    char here;
    frame = &here;
    char *lo = frame - SPAN;
    fill(lo, SPAN - GAP);
    fn();
    size_t i = 0;
    while (i < SPAN - GAP && (unsigned char)lo[i] == PATTERN)
        i++;
    return frame - (lo + i);
}

static void *sym(const char *n) { return dlsym(RTLD_DEFAULT, n); }

/* ---- the calls ---- */
static char outbuf[256 * 1024];
static FILE *f;

static int buffered;   /* mimalloc's stream keeps stdio's own buffer (no setvbuf) */
static void c_fmemopen(void)
{
    f = fmemopen(outbuf, 48 * 1024, "w");
    if (!buffered)
        setvbuf(f, NULL, _IONBF, 0);
}
static void c_malloc_info(void) { malloc_info(0, f); }
static void c_fclose(void) { fclose(f); }
static void c_mallinfo2(void) { volatile struct mallinfo2 m = mallinfo2(); (void)m; }
static void c_malloc_trim(void) { malloc_trim(0); }

static void c_je_print(void)
{
    void (*p)(void (*)(void *, const char *), void *, const char *) = sym("malloc_stats_print");
    memset(outbuf, 0, 64 * 1024);
    p((void (*)(void *, const char *))strcat, outbuf, "Jdablxeh");
}
static void c_je_print_nogeneral(void)
{
    void (*p)(void (*)(void *, const char *), void *, const char *) = sym("malloc_stats_print");
    memset(outbuf, 0, 64 * 1024);
    p((void (*)(void *, const char *))strcat, outbuf, "Jgdablxeh");
}
static void c_je_print_table(void)
{
    void (*p)(void (*)(void *, const char *), void *, const char *) = sym("malloc_stats_print");
    memset(outbuf, 0, 64 * 1024);
    p((void (*)(void *, const char *))strcat, outbuf, "dablxeh");
}
static void c_je_mallctl(void)
{
    int (*m)(const char *, void *, size_t *, void *, size_t) = sym("mallctl");
    uint64_t e = 1, v;
    size_t sz = 8;
    m("epoch", &e, &sz, &e, 8);
    m("stats.allocated", &v, &sz, NULL, 0);
}
static void c_je_purge(void)
{
    int (*m)(const char *, void *, size_t *, void *, size_t) = sym("mallctl");
    m("arena.4096.purge", NULL, NULL, NULL, 0);
}

static void c_tc_getstats(void)
{
    void (*g)(char *, int) = sym("MallocExtension_GetStats");
    g(outbuf, 48 * 1024);
}
static void c_tc_property(void)
{
    int (*g)(const char *, size_t *) = sym("MallocExtension_GetNumericProperty");
    size_t v;
    g("generic.current_allocated_bytes", &v);
}
static void c_tc_release(void) { ((void (*)(void))sym("MallocExtension_ReleaseFreeMemory"))(); }

static void c_mi_print(void)
{
    void (*p)(void (*)(const char *, void *), void *) = sym("mi_stats_print_out");
    p((void (*)(const char *, void *))fputs, f);
}
static void c_mi_info(void)
{
    void (*p)(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *)
        = sym("mi_process_info");
    size_t v[8];
    p(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
}
static void c_mi_option(void) { ((long (*)(int))sym("mi_option_get"))(0); }
static void c_mi_collect(void) { ((void (*)(int))sym("mi_collect"))(1); }

/* buffered: the stream as mimalloc's gather opens it; before: run (not
   measured) after the stream is opened, e.g. the print whose text a
   buffered fclose writes out */
struct entry { const char *name, *needs; thunk fn; int buffered; thunk before; };
static const struct entry entries[] = {
    {"glibc.fmemopen", NULL, c_fmemopen},
    {"glibc.malloc_info", NULL, c_malloc_info},
    {"glibc.fclose", NULL, c_fclose},
    {"glibc.mallinfo2", NULL, c_mallinfo2},
    {"glibc.malloc_trim", NULL, c_malloc_trim},
    {"jemalloc.malloc_stats_print", "mallctl", c_je_print},
    {"jemalloc.malloc_stats_print_no_general", "mallctl", c_je_print_nogeneral},
    {"jemalloc.malloc_stats_print_table", "mallctl", c_je_print_table},
    {"jemalloc.mallctl", "mallctl", c_je_mallctl},
    {"jemalloc.purge", "mallctl", c_je_purge},
    {"tcmalloc.GetStats", "MallocExtension_GetStats", c_tc_getstats},
    {"tcmalloc.GetNumericProperty", "MallocExtension_GetNumericProperty", c_tc_property},
    {"tcmalloc.ReleaseFreeMemory", "MallocExtension_ReleaseFreeMemory", c_tc_release},
    {"mimalloc.mi_process_info", "mi_process_info", c_mi_info},
    {"mimalloc.mi_option_get", "mi_option_get", c_mi_option},
    {"mimalloc.mi_stats_print_out", "mi_stats_print_out", c_mi_print, 1},
    {"mimalloc.fclose", "mi_stats_print_out", c_fclose, 1, c_mi_print},
    {"mimalloc.mi_collect", "mi_collect", c_mi_collect},
};

static void *run(void *arg)
{
    (void)arg;
    void *keep[64];
    for (int i = 0; i < 64; i++)      /* some heap to report on */
        keep[i] = malloc(16 << (i % 12));
    for (size_t e = 0; e < sizeof entries / sizeof *entries; e++) {
        const struct entry *x = &entries[e];
        if (x->needs && !sym(x->needs))
            continue;
        /* calls that write to a stream get a fresh one, opened and closed
           outside the measurement; fmemopen and fclose are measured alone */
        int opens = x->fn != c_fmemopen, closes = x->fn != c_fclose;
        int stream = x->fn == c_malloc_info || x->fn == c_mi_print || x->fn == c_fclose
                     || x->fn == c_fmemopen;
        size_t best = 0;
        buffered = x->buffered;
        for (int k = 0; k < 2; k++) {
            if (stream && opens)
                c_fmemopen();
            if (x->before)
                x->before();
            size_t used = measure(x->fn);
            if (stream && closes)
                c_fclose();
            if (used > best)
                best = used;
        }
        printf("%s %zu\n", x->name, best);
    }
    for (int i = 0; i < 64; i++)
        free(keep[i]);
    return NULL;
}

int main(void)
{
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, SPAN + 256 * 1024);
    if (pthread_create(&t, &a, run, NULL))
        return 2;
    pthread_join(t, NULL);
    return 0;
}
