/* Target for tests/test_remote_engine.py.
 *
 * usage: remote_waits MODE
 * A worker thread sits in the wait named by MODE in a loop and checks every
 * return value (a spurious EINTR or wrong result counts as "bad").  The
 * counters live in `stats`, whose address is printed so the test can read it
 * with process_vm_readv without stopping anything.  The main thread reads
 * one-letter commands from stdin (except in mode "read", where the worker
 * owns stdin and main sleeps in pause()).
 *
 * READY line: tid=<worker> main=<main tid> stats=<addr> and function addresses.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ipc.h>
#include <sys/select.h>
#include <sys/sem.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>

struct stats {
    volatile long iters;        /*  0 */
    volatile long bad;          /*  8 */
    volatile long last_ret;     /* 16 */
    volatile long last_errno;   /* 24 */
    volatile long bytes;        /* 32 */
    volatile long sum;          /* 40 */
    volatile long usr1;         /* 48 SIGUSR1 deliveries */
    volatile long rt;           /* 56 SIGRTMIN deliveries */
    volatile long sig_sum;      /* 64 sum of si_value of both */
    volatile long bad_info;     /* 72 siginfo not SI_QUEUE from the sender */
    volatile long segv_handler_ok; /* 80 */
    volatile long segv_blocked_ok; /* 88 */
    volatile long usr2;         /* 96 SIGUSR2 deliveries (pause mode) */
    volatile long sender;       /* 104 pid expected in si_pid (set by the test) */
    volatile long sig_wrong_thread; /* 112 */
    volatile long done;         /* 120 */
} stats;

static const char *mode;
static pid_t worker_tid;
static int pfd[2];
static char bigbuf[1 << 20];
static unsigned char pattern[16][32] __attribute__((aligned(32)));
static unsigned char seen[16][32] __attribute__((aligned(32)));

/* ---- functions the tests call remotely ---- */
long add6(long a, long b, long c, long d, long e, long f)
{
    return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f;
}

long slow_fn(long ms)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= ms)
            return ms;
    }
}

long hang_fn(void)
{
    for (;;)
        pause();
}

long crash_fn(void)
{
    return *(volatile long *)16;
}

/* returns rsp % 16 at function entry: the ABI says 8 (just after a call) */
long check_align(void);
__asm__(".globl check_align\n.type check_align,@function\ncheck_align:\n"
        "\tmov %rsp, %rax\n\tand $15, %rax\n\tret\n.size check_align,.-check_align\n");

long clobber_vectors(void)
{
    /* glibc's AVX2/EVEX string functions clobber ymm/zmm and run vzeroupper */
    memset(bigbuf, 'a', sizeof bigbuf - 1);
    bigbuf[sizeof bigbuf - 1] = 0;
    long n = strlen(bigbuf);
    memset(bigbuf, 0, sizeof bigbuf);
    __asm__ volatile("vpxor %%ymm0, %%ymm0, %%ymm0\n\tvpcmpeqb %%ymm7, %%ymm7, %%ymm7\n\t"
                     "vpxor %%ymm15, %%ymm15, %%ymm15" ::: "xmm0", "xmm7", "xmm15");
    return n;
}

/* ---- signal handlers ---- */
static void on_sig(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    if (syscall(SYS_gettid) != worker_tid)
        stats.sig_wrong_thread++;
    if (sig == SIGUSR1)
        stats.usr1++;
    else
        stats.rt++;
    stats.sig_sum += si->si_value.sival_int;
    if (si->si_code != SI_QUEUE || (stats.sender && si->si_pid != stats.sender))
        stats.bad_info++;
}

static void on_usr2(int sig) { (void)sig; stats.usr2++; }
static void on_segv(int sig) { (void)sig; _exit(99); }

static void note(long ret, int ok)
{
    stats.last_ret = ret;
    stats.last_errno = errno;
    if (!ok)
        stats.bad++;
    stats.iters++;
}

/* ---- "running" mode: deep app frames, state kept in registers ---- */
static long __attribute__((noinline)) spin_deep(int depth)
{
    volatile char pad[400];
    for (int i = 0; i < 400; i++)   /* no stale libc pointers in our frames */
        pad[i] = (char)depth;
    if (depth > 0)
        return spin_deep(depth - 1) + pad[0];
    long a = 1, b = 3;
    for (;;) {
        for (int i = 0; i < 100000; i++) {
            a += 1;
            b += 3;
            __asm__ volatile("" : "+r"(a), "+r"(b));
        }
        if (b != 3 * a)
            stats.bad++;
        stats.iters++;
    }
}

/* ---- vector mode: ymm0..15 hold a pattern across a raw nanosleep ---- */
static void vector_round(void)
{
    struct timespec ts = {0, 20 * 1000 * 1000};
    long ret;
    __asm__ volatile(
        "vmovdqa 0(%[p]), %%ymm0\n\t"   "vmovdqa 32(%[p]), %%ymm1\n\t"
        "vmovdqa 64(%[p]), %%ymm2\n\t"  "vmovdqa 96(%[p]), %%ymm3\n\t"
        "vmovdqa 128(%[p]), %%ymm4\n\t" "vmovdqa 160(%[p]), %%ymm5\n\t"
        "vmovdqa 192(%[p]), %%ymm6\n\t" "vmovdqa 224(%[p]), %%ymm7\n\t"
        "vmovdqa 256(%[p]), %%ymm8\n\t" "vmovdqa 288(%[p]), %%ymm9\n\t"
        "vmovdqa 320(%[p]), %%ymm10\n\t" "vmovdqa 352(%[p]), %%ymm11\n\t"
        "vmovdqa 384(%[p]), %%ymm12\n\t" "vmovdqa 416(%[p]), %%ymm13\n\t"
        "vmovdqa 448(%[p]), %%ymm14\n\t" "vmovdqa 480(%[p]), %%ymm15\n\t"
        "mov $35, %%eax\n\t"
        "mov %[ts], %%rdi\n\t"
        "xor %%esi, %%esi\n\t"
        "syscall\n\t"
        "vmovdqa %%ymm0, 0(%[s])\n\t"   "vmovdqa %%ymm1, 32(%[s])\n\t"
        "vmovdqa %%ymm2, 64(%[s])\n\t"  "vmovdqa %%ymm3, 96(%[s])\n\t"
        "vmovdqa %%ymm4, 128(%[s])\n\t" "vmovdqa %%ymm5, 160(%[s])\n\t"
        "vmovdqa %%ymm6, 192(%[s])\n\t" "vmovdqa %%ymm7, 224(%[s])\n\t"
        "vmovdqa %%ymm8, 256(%[s])\n\t" "vmovdqa %%ymm9, 288(%[s])\n\t"
        "vmovdqa %%ymm10, 320(%[s])\n\t" "vmovdqa %%ymm11, 352(%[s])\n\t"
        "vmovdqa %%ymm12, 384(%[s])\n\t" "vmovdqa %%ymm13, 416(%[s])\n\t"
        "vmovdqa %%ymm14, 448(%[s])\n\t" "vmovdqa %%ymm15, 480(%[s])\n\t"
        "vzeroupper\n\t"
        : "=&a"(ret)
        : [p] "r"(pattern), [s] "r"(seen), [ts] "r"(&ts)
        : "rdi", "rsi", "rcx", "r11", "memory", "xmm0", "xmm1", "xmm2", "xmm3",
          "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15");
    note(ret, ret == 0 && memcmp(pattern, seen, sizeof pattern) == 0);
}

static void *worker(void *arg)
{
    (void)arg;
    worker_tid = syscall(SYS_gettid);
    struct timespec ts = {0, 30 * 1000 * 1000};
    if (getenv("WAITS_SLEEP_MS")) {     /* a long sleep: re-borrowing a restarted one */
        long ms = atol(getenv("WAITS_SLEEP_MS"));
        ts.tv_sec = ms / 1000;
        ts.tv_nsec = (ms % 1000) * 1000000L;
    }
    int efd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(efd, EPOLL_CTL_ADD, pfd[0], &ev);
    int semid = semget(IPC_PRIVATE, 1, 0600);
    static int futexword = 0;

    if (!strcmp(mode, "segv")) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGSEGV);
        pthread_sigmask(SIG_BLOCK, &s, NULL);
    }
    if (!strcmp(mode, "signals")) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGUSR1);
        sigaddset(&s, SIGRTMIN);
        pthread_sigmask(SIG_UNBLOCK, &s, NULL);
    }
    __atomic_store_n(&stats.done, 1, __ATOMIC_SEQ_CST);
    if (!strcmp(mode, "running"))
        spin_deep(6);
    for (;;) {
        long r;
        errno = 0;
        if (!strcmp(mode, "nanosleep")) {
            r = syscall(SYS_nanosleep, &ts, NULL);
            note(r, r == 0);
        } else if (!strcmp(mode, "signals")) {
            r = syscall(SYS_nanosleep, &ts, NULL);
            note(r, r == 0 || errno == EINTR);
        } else if (!strcmp(mode, "nanosleep_short")) {
            struct timespec s = {0, 1000};
            r = syscall(SYS_nanosleep, &s, NULL);
            note(r, r == 0);
        } else if (!strcmp(mode, "clock_nanosleep")) {
            r = syscall(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, &ts, NULL);
            note(r, r == 0);
        } else if (!strcmp(mode, "poll")) {
            struct pollfd p = {.fd = pfd[0], .events = POLLIN};
            r = syscall(SYS_poll, &p, 1, 30);
            note(r, r == 0);
        } else if (!strcmp(mode, "ppoll")) {
            struct pollfd p = {.fd = pfd[0], .events = POLLIN};
            struct timespec t = ts;
            r = syscall(SYS_ppoll, &p, 1, &t, NULL, 8);
            note(r, r == 0);
        } else if (!strcmp(mode, "select")) {
            fd_set rd;
            FD_ZERO(&rd);
            FD_SET(pfd[0], &rd);
            struct timeval tv = {0, 30000};
            r = syscall(SYS_select, pfd[0] + 1, &rd, NULL, NULL, &tv);
            note(r, r == 0);
        } else if (!strcmp(mode, "pselect6")) {
            fd_set rd;
            FD_ZERO(&rd);
            FD_SET(pfd[0], &rd);
            struct timespec t = ts;
            r = syscall(SYS_pselect6, pfd[0] + 1, &rd, NULL, NULL, &t, NULL);
            note(r, r == 0);
        } else if (!strcmp(mode, "read")) {
            char buf[256];
            r = syscall(SYS_read, 0, buf, sizeof buf);
            if (r == 0)
                break;
            note(r, r > 0);
            if (r > 0) {
                stats.bytes += r;
                for (int i = 0; i < r; i++)
                    stats.sum += (unsigned char)buf[i];
            }
        } else if (!strcmp(mode, "pause")) {
            r = syscall(SYS_pause);
            note(r, r == -1 && errno == EINTR);
        } else if (!strcmp(mode, "epoll_wait")) {
            struct epoll_event out;
            r = syscall(SYS_epoll_wait, efd, &out, 1, 30);
            note(r, r == 0);
        } else if (!strcmp(mode, "sigtimedwait")) {
            sigset_t s;
            sigemptyset(&s);
            sigaddset(&s, SIGUSR2);
            pthread_sigmask(SIG_BLOCK, &s, NULL);
            r = syscall(SYS_rt_sigtimedwait, &s, NULL, &ts, 8);
            note(r, r == -1 && errno == EAGAIN);
        } else if (!strcmp(mode, "semop")) {
            struct sembuf op = {0, -1, 0};
            r = syscall(SYS_semtimedop, semid, &op, 1, &ts);
            note(r, r == -1 && errno == EAGAIN);
        } else if (!strcmp(mode, "futex")) {
            r = syscall(SYS_futex, &futexword, FUTEX_WAIT_PRIVATE, 0, &ts, NULL, 0);
            note(r, r == -1 && errno == ETIMEDOUT);
        } else if (!strcmp(mode, "vector")) {
            vector_round();
        } else if (!strcmp(mode, "segv")) {
            struct sigaction sa;
            sigset_t cur;
            r = syscall(SYS_nanosleep, &ts, NULL);
            sigaction(SIGSEGV, NULL, &sa);
            pthread_sigmask(SIG_BLOCK, NULL, &cur);
            stats.segv_handler_ok = sa.sa_handler == on_segv;
            stats.segv_blocked_ok = sigismember(&cur, SIGSEGV);
            note(r, r == 0 && stats.segv_handler_ok && stats.segv_blocked_ok);
        } else {
            fprintf(stderr, "unknown mode %s\n", mode);
            exit(2);
        }
    }
    semctl(semid, 0, IPC_RMID);
    return NULL;
}

int main(int argc, char **argv)
{
    mode = argc > 1 ? argv[1] : "nanosleep";
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 32; j++)
            pattern[i][j] = (unsigned char)(i * 37 + j * 11 + 1);
    if (pipe(pfd))
        return 1;

    struct sigaction sa = {0};
    sa.sa_sigaction = on_sig;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGRTMIN, &sa, NULL);
    signal(SIGUSR2, on_usr2);
    if (!strcmp(mode, "segv"))
        signal(SIGSEGV, on_segv);
    if (!strcmp(mode, "ignsegv"))
        signal(SIGSEGV, SIG_IGN);

    /* Only the worker may take SIGUSR1/SIGRTMIN (signals mode). */
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    sigaddset(&s, SIGRTMIN);
    pthread_sigmask(SIG_BLOCK, &s, NULL);

    pthread_t th;
    const char *wmode = !strcmp(mode, "ignsegv") ? "nanosleep" : mode;
    mode = wmode;
    pthread_create(&th, NULL, worker, NULL);
    while (!__atomic_load_n(&stats.done, __ATOMIC_SEQ_CST))
        usleep(1000);
    printf("READY tid=%d main=%d stats=%p add6=%p slow_fn=%p hang_fn=%p crash_fn=%p "
           "check_align=%p clobber_vectors=%p strlen=%p memset=%p mallinfo2=%p "
           "getpid=%p bigbuf=%p snprintf=%p\n",
           (int)worker_tid, (int)getpid(), (void *)&stats, (void *)add6, (void *)slow_fn,
           (void *)hang_fn, (void *)crash_fn, (void *)check_align,
           (void *)clobber_vectors, (void *)strlen, (void *)memset, (void *)mallinfo2,
           (void *)getpid, (void *)bigbuf, (void *)snprintf);
    fflush(stdout);

    if (!strcmp(mode, "read")) {
        for (;;)
            pause();
    }
    char c;
    while (read(0, &c, 1) == 1) {
        if (c == 'x')
            exit(0);
        if (c == 'e')
            execl("/bin/sleep", "sleep", "30", (char *)NULL);
    }
    for (;;)
        pause();
}
