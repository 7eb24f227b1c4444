/* Stand-in for a binary statically linked with google/tcmalloc: the
 * executable defines malloc/free (backed here by glibc's __libc_malloc)
 * and google/tcmalloc's C-ABI entry points TCMalloc_Internal_GetStats and
 * MallocExtension_Internal_GetNumericProperty.  Detection must recognise it
 * by those symbols.  Prints READY, blocks on stdin. */
#include <stdio.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }

size_t TCMalloc_Internal_GetStats(char *buf, size_t len) {
    const char *s = "MALLOC: 0 (0.0 MiB) Bytes in use by application\n";
    if (len) { strncpy(buf, s, len - 1); buf[len - 1] = 0; }
    return strlen(s) + 1;
}
bool MallocExtension_Internal_GetNumericProperty(const char *n, size_t l, size_t *v) {
    (void)n; (void)l; *v = 0; return true;
}

int main(void) {
    void *p = malloc(100);
    printf("READY\n");
    fflush(stdout);
    char b[16];
    while (read(0, b, sizeof b) > 0) {}
    free(p);
    return 0;
}
