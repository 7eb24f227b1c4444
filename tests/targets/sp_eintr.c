/* Counts every EINTR its waits return.  Wait threads:
 *   0 epoll_wait infinite   1 epoll_wait 50 ms   2 epoll_pwait infinite
 *   3 epoll_pwait 30 ms     4 sigtimedwait infinite   5 sigtimedwait 40 ms
 * A SIGUSR1 handler (no SA_RESTART) counts deliveries per thread, and from
 * the interrupted context says where each one landed: w = right after a
 * syscall instruction with rax == -EINTR (it interrupted a wait, which
 * returns EINTR: exactly one EINTR is owed), r = at a syscall instruction
 * about to be restarted (never expected here: no SA_RESTART), else outside a
 * wait (between two timed waits: no EINTR is owed, with or without allocdiag).
 * stdin commands: "counts" -> "COUNTS e0..e5 h0..h5 w0..w5 r0..r5";
 * "kill I" -> tgkill thread I with SIGUSR1, then "SENT I".  Prints
 * "READY tids=..." first. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define N 6
static volatile long eintr[N], handled[N], in_wait[N], restarted[N], loops[N];
static volatile pid_t tids[N];
static __thread int me = -1;

static const unsigned char SYSCALL_INSN[2] = {0x0f, 0x05};

static void on_usr1(int sig, siginfo_t *si, void *uc_) {
    (void)sig; (void)si;
    if (me < 0)
        return;
    const ucontext_t *uc = uc_;
    const unsigned char *pc = (const unsigned char *)uc->uc_mcontext.gregs[REG_RIP];
    long rax = (long)uc->uc_mcontext.gregs[REG_RAX];
    __atomic_add_fetch(&handled[me], 1, __ATOMIC_SEQ_CST);
    if (rax == -EINTR && !memcmp(pc - 2, SYSCALL_INSN, 2))
        __atomic_add_fetch(&in_wait[me], 1, __ATOMIC_SEQ_CST);
    else if (!memcmp(pc, SYSCALL_INSN, 2) && rax >= 0)
        __atomic_add_fetch(&restarted[me], 1, __ATOMIC_SEQ_CST);
}

static void *waiter(void *arg) {
    me = (int)(long)arg;
    tids[me] = (pid_t)syscall(SYS_gettid);
    int ep = epoll_create1(0);
    sigset_t rt; sigemptyset(&rt); sigaddset(&rt, SIGRTMIN);
    sigset_t empty; sigemptyset(&empty);
    for (;;) {
        int r; struct epoll_event ev;
        struct timespec ts = {0, 40 * 1000000};
        switch (me) {
        case 0: r = epoll_wait(ep, &ev, 1, -1); break;
        case 1: r = epoll_wait(ep, &ev, 1, 50); break;
        case 2: r = epoll_pwait(ep, &ev, 1, -1, &empty); break;
        case 3: r = epoll_pwait(ep, &ev, 1, 30, &empty); break;
        case 4: r = sigtimedwait(&rt, NULL, NULL); break;
        default: r = sigtimedwait(&rt, NULL, &ts); break;
        }
        if (r < 0 && errno == EINTR) __atomic_add_fetch(&eintr[me], 1, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&loops[me], 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

int main(void) {
    struct sigaction sa; memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_usr1;            /* no SA_RESTART */
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGUSR1, &sa, NULL);
    sigset_t block; sigemptyset(&block); sigaddset(&block, SIGRTMIN);
    pthread_sigmask(SIG_BLOCK, &block, NULL);   /* for sigtimedwait, inherited */
    pthread_t t;
    for (long i = 0; i < N; i++) pthread_create(&t, NULL, waiter, (void *)i);
    for (int i = 0; i < N; i++) while (!tids[i]) usleep(1000);
    sigset_t usr1; sigemptyset(&usr1); sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL);    /* main never takes SIGUSR1 */
    printf("READY tids=");
    for (int i = 0; i < N; i++) printf("%s%d", i ? "," : "", tids[i]);
    printf("\n"); fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        int i;
        if (sscanf(line, "kill %d", &i) == 1 && i >= 0 && i < N) {
            syscall(SYS_tgkill, getpid(), tids[i], SIGUSR1);
            printf("SENT %d\n", i);
        } else if (!strncmp(line, "counts", 6)) {
            printf("COUNTS");
            for (int j = 0; j < N; j++) printf(" %ld", eintr[j]);
            for (int j = 0; j < N; j++) printf(" %ld", handled[j]);
            for (int j = 0; j < N; j++) printf(" %ld", in_wait[j]);
            for (int j = 0; j < N; j++) printf(" %ld", restarted[j]);
            printf("\n");
        }
        fflush(stdout);
    }
    return 0;
}
