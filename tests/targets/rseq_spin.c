/* rseq_spin: a thread that spends nearly all its time inside a restartable
 * sequence (an rseq critical section in this program's own code, on the
 * struct rseq glibc 2.35+ registers for every thread).
 *
 * Each pass sets rseq->rseq_cs, spins ~400M iterations inside the section,
 * and as its last instruction before the commit checks that rseq_cs is still
 * set.  The kernel aborts a section whose thread was preempted or stopped
 * (the pass then counts an abort); a commit that finds rseq_cs cleared is a
 * section whose abort someone cancelled (a violation).  The spin runs below
 * a 64 KiB frame, so no return address into libc is near the stack top.
 *
 * Prints "READY TID" (the spinning thread), then, for each byte read on
 * stdin, "aborts A commits C violations V".  Exits 3 when glibc registered
 * no rseq area. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/rseq.h>
#include <sys/syscall.h>

static volatile uint64_t aborts, commits, violations;
static volatile long spinner_tid;

__attribute__((noinline)) static void spin(void) {
    struct rseq *rs = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
    for (;;) {
        __asm__ __volatile__(
            "leaq 3f(%%rip), %%rax\n\t"
            "movq %%rax, %[cs]\n\t"
            "1:\n\t"                            /* start_ip */
            "movq $400000000, %%rcx\n\t"
            "0: decq %%rcx\n\t"
            "jnz 0b\n\t"
            "cmpq $0, %[cs]\n\t"
            "je 6f\n\t"
            "2:\n\t"                            /* post-commit ip */
            "incq %[commits]\n\t"
            "jmp 5f\n\t"
            ".pushsection __rseq_cs, \"aw\"\n\t"
            ".balign 32\n\t"
            "3: .long 0, 0\n\t"                 /* struct rseq_cs: version, flags */
            ".quad 1b, 2b-1b, 4f\n\t"           /* start_ip, post_commit_offset, abort_ip */
            ".popsection\n\t"
            ".pushsection __rseq_failure, \"ax\"\n\t"
            ".byte 0x0f, 0xb9, 0x3d\n\t"        /* ud1 ..., %edi: RSEQ_SIG before the handler */
            ".long 0x53053053\n\t"
            "4: incq %[aborts]\n\t"
            "jmp 5f\n\t"
            "6: incq %[violations]\n\t"
            "jmp 5f\n\t"
            ".popsection\n\t"
            "5:\n\t"
            : [cs] "+m" (rs->rseq_cs), [aborts] "+m" (aborts), [commits] "+m" (commits),
              [violations] "+m" (violations)
            : : "rax", "rcx", "memory", "cc");
    }
}

static void *worker(void *arg) {
    volatile char pad[65536];
    pad[0] = 1;
    spinner_tid = syscall(SYS_gettid);
    spin();
    return (void *)((long)pad[0] + (long)arg);
}

int main(void) {
    if (__rseq_size == 0) {
        fprintf(stderr, "glibc registered no rseq area\n");
        return 3;
    }
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    while (!spinner_tid)
        usleep(1000);
    printf("READY %ld\n", spinner_tid);
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
        printf("aborts %lu commits %lu violations %lu\n", aborts, commits, violations);
        fflush(stdout);
    }
    return 0;
}
