/* sud_spin: a thread under Syscall User Dispatch (PR_SET_SYSCALL_USER_DISPATCH,
 * as Wine and emulators use it): its selector says BLOCK, so every syscall it
 * makes from outside its allowed region (none here) is turned by the kernel
 * into a SIGSYS, which its handler "emulates" (counts it, answers -ENOSYS).
 * The thread spins in user code below a 64 KiB frame (no libc return address
 * near the stack top) and never makes a syscall itself.
 *
 * Prints "READY TID", then, for each byte read on stdin, "dispatched N" (the
 * SIGSYS its handler saw).  Exits 3 when the kernel refuses the prctl. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#ifndef PR_SET_SYSCALL_USER_DISPATCH
#define PR_SET_SYSCALL_USER_DISPATCH 59
#define PR_SYS_DISPATCH_ON 1
#define SYSCALL_DISPATCH_FILTER_BLOCK 1
#endif

static volatile long dispatched, spinner_tid;
static __thread volatile char selector;

static void on_sigsys(int sig, siginfo_t *si, void *uc_) {
    ucontext_t *uc = uc_;
    (void)sig; (void)si;
    dispatched++;
    uc->uc_mcontext.gregs[REG_RAX] = -38;      /* -ENOSYS: "emulated" */
}

__attribute__((noinline)) static void spin(void) {
    for (volatile unsigned long i = 0;; i++) {}
}

static void *worker(void *arg) {
    volatile char pad[65536];
    pad[0] = 1;
    long tid = syscall(SYS_gettid);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSYS, &sa, NULL);
    selector = SYSCALL_DISPATCH_FILTER_BLOCK;
    if (prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_ON, 0, 0, &selector)) {
        spinner_tid = -1;
        return arg;
    }
    spinner_tid = tid;      /* no syscall from here on */
    spin();
    return (void *)((long)pad[0] + (long)arg);
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    while (!spinner_tid)
        usleep(1000);
    if (spinner_tid < 0) {
        fprintf(stderr, "PR_SET_SYSCALL_USER_DISPATCH failed\n");
        return 3;
    }
    printf("READY %ld\n", spinner_tid);
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
        printf("dispatched %ld\n", dispatched);
        fflush(stdout);
    }
    return 0;
}
