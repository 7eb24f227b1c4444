/* Target for tests/test_resumed_waits.py: one thread, one kind of wait, in a
 * loop, timed by its own clock.
 *
 * usage: one_wait MODE MS
 * MODE: sleep (sleep(3), MS a multiple of 1000), clock_nanosleep, poll,
 * select, epoll (epoll_wait on an empty set), pause, sigtimedwait, read (on
 * an empty pipe), condwait (pthread_cond_timedwait).  Waits with a timeout
 * wait MS; pause and read have none: a CLOCK_MONOTONIC timer raises SIGALRM
 * (handler, no SA_RESTART) after MS, and the wait returns EINTR then.
 * After each wait one line: "WAIT <elapsed us> <ok>" where ok is 1 when
 * the wait returned as it should at its deadline (timeout result, or EINTR
 * from our own timer's signal), 0 for any other return (an early return,
 * a spurious EINTR).  READY after the first malloc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t alarms;

static void on_alarm(int s) { (void)s; alarms++; }

static long now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000L + t.tv_nsec / 1000;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    const char *mode = argv[1];
    long ms = atol(argv[2]);
    struct timespec rel = {ms / 1000, (ms % 1000) * 1000000L};
    int pfd[2], ep = epoll_create1(0);
    if (pipe(pfd) || ep < 0)
        return 2;
    sigset_t usr2;
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    sigprocmask(SIG_BLOCK, &usr2, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;             /* no SA_RESTART: the wait returns EINTR */
    sigaction(SIGALRM, &sa, NULL);
    timer_t timer;
    struct sigevent sev = {.sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGALRM};
    if (timer_create(CLOCK_MONOTONIC, &sev, &timer))
        return 2;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    free(malloc(1000));
    printf("READY %s %ld\n", mode, ms);
    fflush(stdout);
    for (;;) {
        int timed = strcmp(mode, "pause") && strcmp(mode, "read");
        long a0 = alarms, t0 = now_us();
        int r = 0, ok = 0, e = 0;
        if (!timed) {
            struct itimerspec its = {.it_value = rel};
            timer_settime(timer, 0, &its, NULL);
        }
        if (!strcmp(mode, "sleep")) {
            r = sleep((unsigned)(ms / 1000));
            ok = r == 0;
        } else if (!strcmp(mode, "clock_nanosleep")) {
            r = clock_nanosleep(CLOCK_MONOTONIC, 0, &rel, NULL);
            ok = r == 0;
        } else if (!strcmp(mode, "poll")) {
            r = poll(NULL, 0, (int)ms);
            ok = r == 0;
        } else if (!strcmp(mode, "select")) {
            struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
            r = select(0, NULL, NULL, NULL, &tv);
            ok = r == 0;
        } else if (!strcmp(mode, "epoll")) {
            struct epoll_event ev;
            r = epoll_wait(ep, &ev, 1, (int)ms);
            ok = r == 0;
        } else if (!strcmp(mode, "sigtimedwait")) {
            r = sigtimedwait(&usr2, NULL, &rel);
            e = errno;
            ok = r == -1 && e == EAGAIN;
        } else if (!strcmp(mode, "pause")) {
            r = pause();
            e = errno;
            ok = r == -1 && e == EINTR && alarms == a0 + 1;
        } else if (!strcmp(mode, "read")) {
            char c;
            r = (int)read(pfd[0], &c, 1);
            e = errno;
            ok = r == -1 && e == EINTR && alarms == a0 + 1;
        } else if (!strcmp(mode, "condwait")) {
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_sec += rel.tv_sec;
            dl.tv_nsec += rel.tv_nsec;
            if (dl.tv_nsec >= 1000000000L) {
                dl.tv_sec++;
                dl.tv_nsec -= 1000000000L;
            }
            pthread_mutex_lock(&mu);
            r = pthread_cond_timedwait(&cv, &mu, &dl);
            pthread_mutex_unlock(&mu);
            ok = r == ETIMEDOUT;
        } else {
            return 2;
        }
        printf("WAIT %ld %d\n", now_us() - t0, ok);
        fflush(stdout);
    }
}
