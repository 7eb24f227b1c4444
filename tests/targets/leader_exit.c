/* leader_exit: the main thread leaves with pthread_exit() while a second
 * thread, after some allocations, prints READY and reads stdin.  The
 * process lives on; its leader is a zombie whose maps are empty. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *work(void *arg) {
    static void *p[1000];
    for (int i = 0; i < 1000; i++) { p[i] = malloc(1000); memset(p[i], 1, 1000); }
    printf("READY\n");
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    return arg;
}

int main(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, work, NULL)) return 1;
    pthread_exit(NULL);
}
