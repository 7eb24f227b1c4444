/* seccomp_filter ACTION [SYSCALL]: a process under a seccomp filter, idle in
 * read(0).
 *
 * ACTION kill|trap|errno|log: after a burst of 4096 16,000-byte blocks, 15
 * of each 16 freed (holes a release call madvises away), one filter returns
 * SECCOMP_RET_KILL_PROCESS / TRAP / ERRNO(EPERM) / LOG for SYSCALL (madvise,
 * or mmap) and allows everything else.  ACTION none: the same burst, no
 * filter (a baseline).
 *
 * ACTION oracle: two filters whose verdict on madvise depends on its
 * arguments, written to use most of the instructions seccomp accepts (loads
 * of words, of the length, of memory; ALU; every jump; RET A); then madvise
 * is called with CASES and each result printed as "R advice len errno"
 * (0: it ran and succeeded), so a test can compare its own reading of the
 * filters with the kernel's.
 *
 * Prints READY (with the oracle mapping's address), then reads stdin. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#define DATA(field) offsetof(struct seccomp_data, field)
#define ARG_LO(i) (DATA(args) + 8 * (i))       /* little-endian: low word first */

static void install(struct sock_filter *f, unsigned short n) {
    struct sock_fprog prog = { n, f };
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) { perror("seccomp"); exit(1); }
}

static void burst(void) {
    static void *p[4096];
    for (int i = 0; i < 4096; i++) { p[i] = malloc(16000); memset(p[i], 1, 16000); }
    for (int i = 0; i < 4096; i++) if (i % 16) free(p[i]);
}

static void one(unsigned action, int nr) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, DATA(arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, DATA(nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, action),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    install(f, sizeof f / sizeof f[0]);
}

static void allowlist(void) {
    static const int allowed[] = {
        SYS_read, SYS_write, SYS_exit, SYS_exit_group, SYS_rt_sigreturn,
        SYS_rt_sigprocmask, SYS_brk, SYS_mmap, SYS_munmap, SYS_futex, SYS_fstat,
        SYS_newfstatat,      /* stdio's first printf */
    };
    enum { N = sizeof allowed / sizeof allowed[0] };
    struct sock_filter f[4 + 2 * N + 1];
    int i = 0;
    f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, DATA(arch));
    f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
    f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, DATA(nr));
    for (int k = 0; k < N; k++) {
        f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, allowed[k], 0, 1);
        f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    }
    f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    install(f, (unsigned short)i);
}

static void oracle(void) {
    /* older: DONTNEED -> ERRNO(11); more than 16 pages -> ERRNO(22) */
    struct sock_filter a[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, DATA(nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_madvise, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(2)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_DONTNEED, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 11),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(1)),
        BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 12),
        BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 16, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 22),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    /* newer: FREE (a bit test) -> ERRNO(33); WILLNEED -> ERRNO(55) computed
     * into A; a length that is not whole pages -> ERRNO(44) via X and M[] */
    struct sock_filter b[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_LEN, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, sizeof(struct seccomp_data), 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, DATA(nr)),
        BPF_STMT(BPF_LDX | BPF_IMM, SYS_madvise),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_X, 0, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(2)),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, MADV_FREE, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 33),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_WILLNEED, 0, 4),
        BPF_STMT(BPF_LD | BPF_IMM, SECCOMP_RET_ERRNO),
        BPF_STMT(BPF_ALU | BPF_OR | BPF_K, 50),
        BPF_STMT(BPF_ALU | BPF_ADD | BPF_K, 5),
        BPF_STMT(BPF_RET | BPF_A, 0),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(1)),
        BPF_STMT(BPF_ST, 3),
        BPF_STMT(BPF_LDX | BPF_MEM, 3),
        BPF_STMT(BPF_MISC | BPF_TXA, 0),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 4095),
        BPF_STMT(BPF_MISC | BPF_TAX, 0),
        BPF_STMT(BPF_LD | BPF_IMM, 0),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_X, 0, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JA, 1, 0, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 44),
    };
    install(a, sizeof a / sizeof a[0]);
    install(b, sizeof b / sizeof b[0]);
}

static const struct { int advice; long len; } CASES[] = {
    { MADV_DONTNEED, 4096 }, { MADV_FREE, 4096 }, { MADV_FREE, 2 << 20 },
    { MADV_NORMAL, 2 << 20 }, { MADV_NORMAL, 4096 }, { MADV_WILLNEED, 4096 },
    { MADV_NORMAL, 4097 }, { MADV_DONTNEED, 2 << 20 }, { MADV_RANDOM, 65536 },
};

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "kill";
    int nr = argc > 2 && !strcmp(argv[2], "mmap") ? SYS_mmap : SYS_madvise;
    char *m = mmap(NULL, 4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    burst();
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (!strcmp(what, "oracle")) {
        oracle();
        for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
            int r = madvise(m, CASES[i].len, CASES[i].advice);
            printf("R %d %ld %d\n", CASES[i].advice, CASES[i].len, r ? errno : 0);
        }
    } else if (!strcmp(what, "kill")) {
        one(SECCOMP_RET_KILL_PROCESS, nr);
    } else if (!strcmp(what, "allowlist")) {
        allowlist();
    } else if (!strcmp(what, "trap")) {
        one(SECCOMP_RET_TRAP, nr);
    } else if (!strcmp(what, "errno")) {
        one(SECCOMP_RET_ERRNO | EPERM, nr);
    } else if (!strcmp(what, "log")) {
        one(SECCOMP_RET_LOG, nr);
    } else if (strcmp(what, "none")) {
        fprintf(stderr, "unknown action %s\n", what);
        return 2;
    }
    printf("READY %p\n", (void *)m);
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    return 0;
}
