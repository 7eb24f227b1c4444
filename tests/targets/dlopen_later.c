/* Maps a library when told to, after start (tests/test_session.py: a
 * snapshot session sees the new mapping).  Allocates through glibc's malloc.
 * Prints READY, then for each line "open LIB" on stdin dlopen()s LIB and
 * prints "OPENED" (or "FAILED reason"); EOF ends it. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    char line[4096];
    void *keep = malloc(4096);
    printf("READY %p\n", keep);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "open ", 5) != 0)
            continue;
        if (dlopen(line + 5, RTLD_NOW | RTLD_LOCAL))
            printf("OPENED\n");
        else
            printf("FAILED %s\n", dlerror());
        fflush(stdout);
    }
    free(keep);
    return 0;
}
