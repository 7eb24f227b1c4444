/* Idle target for detection tests.
 *   idle [alloc-before-ready]
 * With an argument, calls malloc/free before printing READY (so the
 * executable's malloc GOT slot is bound); without, calls them only after
 * READY is printed and stdin is closed, so a lazily-bound slot is still
 * unresolved while the test inspects it.  Then blocks in read() on stdin.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *keep;   /* global, so the compiler cannot drop the touched buffer */

int main(int argc, char **argv) {
    char *p = NULL;
    if (argc > 1) {
        p = keep = malloc(1 << 20);
        memset(p, 1, 1 << 20);
    }
    printf("READY %d %d\n", (int)getpid(), p ? p[12345] : 0);
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    if (!p) p = malloc(64);
    free(p);
    return 0;
}
