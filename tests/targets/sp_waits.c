/* Target for tests/test_safepoints.py: one worker thread parked in the wait
 * named by MODE, in a loop, counting what each wait returns.
 *
 * usage: sp_waits MODE          (env SP_WAIT_MS: timeout of the wait, -1 = none;
 *                                SP_MAIN=condwait: main waits on a condvar
 *                                instead of reading stdin)
 *
 * Every wait's return is classified: a return with EINTR counts in `eintr`
 * (the number the tests care about: a ptrace stop must never produce one,
 * a real signal with a handler produces exactly one, as without a tracer),
 * anything unexpected in `bad`.  SIGUSR1 has a handler without SA_RESTART
 * that only counts; only the worker thread takes it.
 *
 * READY line: tid=<worker> main=<main tid> stats=<addr> port=<tcp port>
 * udp=<udp port> fake_lo=<addr> (fake_allocator_wait, a condvar wait the
 * tests declare "allocator code") fake_hi=<addr> getpid=<addr>.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct stats {
    volatile long iters;        /*  0 waits that returned */
    volatile long eintr;        /*  8 of those, with EINTR */
    volatile long bad;          /* 16 unexpected results */
    volatile long last_ret;     /* 24 */
    volatile long last_errno;   /* 32 */
    volatile long usr1;         /* 40 SIGUSR1 handler runs */
    volatile long done;         /* 48 worker set up */
    volatile long timeouts;     /* 56 waits that ended by their timeout */
} stats;

static const char *mode;
static pid_t worker_tid;
static long wait_ms = -1;
static int efd, lsock, usock;
static pid_t child;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static sem_t sem;
static int udp_port, tcp_port;

static void on_usr1(int sig) { (void)sig; stats.usr1++; }

/* ret < 0 with errno: EINTR counted, timeouts (EAGAIN/ETIMEDOUT) allowed */
static void note(long ret, int err, int ok_value)
{
    stats.last_ret = ret;
    stats.last_errno = err;
    if (ret == -1 && err == EINTR)
        stats.eintr++;
    else if (ret == -1 && (err == EAGAIN || err == ETIMEDOUT))
        stats.timeouts++;
    else if (ret == 0 && ok_value == 0)
        stats.timeouts++;           /* epoll: 0 = timeout */
    else if (!ok_value)
        stats.bad++;
    stats.iters++;
}

static struct timespec *rel_ts(struct timespec *ts)
{
    if (wait_ms < 0)
        return NULL;
    ts->tv_sec = wait_ms / 1000;
    ts->tv_nsec = (wait_ms % 1000) * 1000000L;
    return ts;
}

static struct timespec *abs_ts(struct timespec *ts, clockid_t clk)
{
    if (wait_ms < 0)
        return NULL;
    clock_gettime(clk, ts);
    ts->tv_sec += wait_ms / 1000;
    ts->tv_nsec += (wait_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
    return ts;
}

/* A condvar wait the tests declare to be allocator code (by address range):
 * stands for jemalloc's background thread, which waits on a condvar inside
 * libjemalloc. */
__attribute__((noinline)) int fake_allocator_wait(void)
{
    pthread_mutex_lock(&mu);
    int r = pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    __asm__ volatile("");
    return r;
}
__attribute__((noinline)) void fake_allocator_end(void) { __asm__ volatile(""); }

static void *sleeper(void *arg) { (void)arg; for (;;) pause(); }

/* "strict_read": the worker enters seccomp strict mode and blocks in read(2)
 * of a pipe nobody writes; any other syscall kills it (SIGKILL). */
static int strict_fd = -1;
static void strict_read(void)
{
    char c;
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT);
    for (;;)
        read(strict_fd, &c, 1);
}

/* "handler_read": the worker blocks in read(2) of that pipe inside a
 * SIGUSR2 handler (a signal frame below the wait). */
static void block_in_read(int sig)
{
    (void)sig;
    char c;
    for (;;)
        read(strict_fd, &c, 1);
}

/* "cookie_read": the worker's stderr is a cookie stream whose write function
 * blocks in read(2) of that pipe when malloc_stats() prints an arena's "in
 * use bytes", which glibc does holding that arena's lock: a wait made from
 * inside the allocator. */
static volatile int go;         /* main printed READY (it mallocs its stdout buffer) */
static int in_arena;
static ssize_t cookie_write(void *cookie, const char *buf, size_t n)
{
    (void)cookie;
    char c;
    if (!strncmp(buf, "Arena", 5))
        in_arena = 1;
    if (in_arena && !strncmp(buf, "in use bytes", 12))
        for (;;)
            read(strict_fd, &c, 1);
    return (ssize_t)n;
}
static void cookie_read(void)
{
    cookie_io_functions_t io = {.write = cookie_write};
    FILE *f = fopencookie(NULL, "w", io);
    setvbuf(f, NULL, _IONBF, 0);
    while (!go)
        usleep(1000);
    stderr = f;
    malloc_stats();
}

/* "fakespin": application code spinning deep below a function the tests
 * declare allocator code; the frames in between (400-byte pads, no libc
 * pointers) push that return address beyond a 2 KiB stack-top scan. */
static long __attribute__((noinline)) spin_deep(int depth)
{
    volatile char pad[400];
    for (int i = 0; i < 400; i++)
        pad[i] = (char)depth;
    if (depth > 0)
        return spin_deep(depth - 1) + pad[0];
    for (;;) {
        stats.iters++;
        __asm__ volatile("" ::: "memory");
    }
}

/* "shallowspin": application code spinning right above start_thread, its
 * frame holding what an earlier libc call left there: a 2 KiB stack-top scan
 * sees start_thread's live return address into libc and stale ones. */
static void __attribute__((noinline)) shallow_spin(void)
{
    volatile char buf[256];
    snprintf((char *)buf, sizeof buf, "%s %d", "spin", 1);
    for (;;) {
        stats.iters++;
        __asm__ volatile("" ::: "memory");
    }
}

__attribute__((noinline)) long fake_allocator_spin(void)
{
    long r = spin_deep(6);
    __asm__ volatile("");
    return r + 1;
}

static void one_wait(void)
{
    struct timespec ts;
    struct epoll_event out;
    long r;
    int e;
    char buf[64];
    errno = 0;
    if (!strcmp(mode, "epoll_wait")) {
        r = syscall(SYS_epoll_wait, efd, &out, 1, (int)wait_ms);
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "epoll_pwait")) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGUSR2);
        r = syscall(SYS_epoll_pwait, efd, &out, 1, (int)wait_ms, &s, 8);
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "epoll_pwait2")) {
        r = syscall(SYS_epoll_pwait2, efd, &out, 1, rel_ts(&ts), NULL, 8);
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "sigtimedwait")) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGUSR2);
        r = syscall(SYS_rt_sigtimedwait, &s, NULL, rel_ts(&ts), 8);
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "accept4")) {
        r = accept4(lsock, NULL, NULL, 0);
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "accept")) {
        r = syscall(SYS_accept, lsock, NULL, NULL);
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "recvfrom")) {
        r = recvfrom(usock, buf, sizeof buf, 0, NULL, NULL);
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "recvmsg")) {
        struct iovec iov = {buf, sizeof buf};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        r = recvmsg(usock, &m, 0);
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "wait4")) {
        int status;
        r = wait4(child, &status, 0, NULL);
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "waitid")) {
        siginfo_t si;
        r = waitid(P_PID, child, &si, WEXITED);
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "sigsuspend")) {
        sigset_t s;
        sigemptyset(&s);
        r = sigsuspend(&s);         /* returns only after a handler: EINTR */
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "condwait") || !strcmp(mode, "condtimedwait")) {
        pthread_mutex_lock(&mu);
        if (!strcmp(mode, "condwait"))
            r = pthread_cond_wait(&cv, &mu);
        else
            r = pthread_cond_timedwait(&cv, &mu, abs_ts(&ts, CLOCK_REALTIME));
        pthread_mutex_unlock(&mu);
        note(r ? -1 : 0, r, r == 0);
    } else if (!strcmp(mode, "semwait")) {
        r = wait_ms < 0 ? sem_wait(&sem) : sem_clockwait(&sem, CLOCK_MONOTONIC,
                                                          abs_ts(&ts, CLOCK_MONOTONIC));
        e = errno;
        note(r, e, 0);
    } else if (!strcmp(mode, "join")) {
        pthread_t th;
        pthread_create(&th, NULL, sleeper, NULL);
        r = pthread_join(th, NULL);
        note(r ? -1 : 0, r, 0);
    } else if (!strcmp(mode, "mutex")) {
        r = pthread_mutex_lock(&held);          /* main holds it: FUTEX_WAIT val 2 */
        note(r ? -1 : 0, r, 0);
    } else if (!strcmp(mode, "fakespin")) {
        fake_allocator_spin();
    } else if (!strcmp(mode, "shallowspin")) {
        shallow_spin();
    } else if (!strcmp(mode, "fakealloc")) {
        r = fake_allocator_wait();
        note(r ? -1 : 0, r, 0);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        exit(2);
    }
}

static void *worker(void *arg)
{
    (void)arg;
    worker_tid = syscall(SYS_gettid);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
    if (!strcmp(mode, "sigtimedwait")) {
        sigemptyset(&s);
        sigaddset(&s, SIGUSR2);
        pthread_sigmask(SIG_BLOCK, &s, NULL);
    }
    __atomic_store_n(&stats.done, 1, __ATOMIC_SEQ_CST);
    if (!strcmp(mode, "strict_read"))
        strict_read();
    if (!strcmp(mode, "handler_read")) {
        struct sigaction sa = {0};
        sa.sa_handler = block_in_read;
        sigaction(SIGUSR2, &sa, NULL);
        raise(SIGUSR2);
    }
    if (!strcmp(mode, "cookie_read"))
        cookie_read();
    for (;;)
        one_wait();
    return NULL;
}

int main(int argc, char **argv)
{
    mode = argc > 1 ? argv[1] : "epoll_wait";
    if (getenv("SP_WAIT_MS"))
        wait_ms = atol(getenv("SP_WAIT_MS"));

    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;        /* no SA_RESTART: a signal interrupts waits */
    sigaction(SIGUSR1, &sa, NULL);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &s, NULL);     /* only the worker takes SIGUSR1 */

    int pfd[2];
    if (pipe(pfd))
        return 1;
    strict_fd = pfd[0];
    efd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(efd, EPOLL_CTL_ADD, pfd[0], &ev);

    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    lsock = socket(AF_INET, SOCK_STREAM, 0);
    bind(lsock, (struct sockaddr *)&a, sizeof a);
    listen(lsock, 16);
    getsockname(lsock, (struct sockaddr *)&a, &al);
    tcp_port = ntohs(a.sin_port);
    a.sin_port = 0;
    usock = socket(AF_INET, SOCK_DGRAM, 0);
    bind(usock, (struct sockaddr *)&a, sizeof a);
    al = sizeof a;
    getsockname(usock, (struct sockaddr *)&a, &al);
    udp_port = ntohs(a.sin_port);
    sem_init(&sem, 0, 0);

    if (!strcmp(mode, "wait4") || !strcmp(mode, "waitid")) {
        child = fork();
        if (child == 0) {
            for (;;)
                pause();
        }
    }
    if (!strcmp(mode, "mutex"))
        pthread_mutex_lock(&held);

    pthread_t th;
    pthread_create(&th, NULL, worker, NULL);
    while (!__atomic_load_n(&stats.done, __ATOMIC_SEQ_CST))
        usleep(1000);
    printf("READY tid=%d main=%d stats=%p port=%d udp=%d fake_lo=%p fake_hi=%p "
           "getpid=%p\n",
           (int)worker_tid, (int)getpid(), (void *)&stats, tcp_port, udp_port,
           (void *)fake_allocator_wait, (void *)fake_allocator_end, (void *)getpid);
    fflush(stdout);
    go = 1;
    if (getenv("SP_MAIN") && !strcmp(getenv("SP_MAIN"), "condwait")) {
        pthread_mutex_lock(&mu);        /* main parks in a condvar wait instead */
        for (;;)
            pthread_cond_wait(&cv, &mu);
    }
    char c;
    while (read(0, &c, 1) == 1) {
        if (c == 'c') {             /* wake condvar / semaphore waiters once */
            pthread_mutex_lock(&mu);
            pthread_cond_broadcast(&cv);
            pthread_mutex_unlock(&mu);
            sem_post(&sem);
        }
    }
    for (;;)
        pause();
}
