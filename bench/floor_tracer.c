/* The floor of a borrowed-thread stop on this box: the requests allocdiag's
 * engine makes for one snapshot's call, made from C with nothing between
 * them (bench/pause.py --snapshots prints it beside allocdiag's own stop).
 *
 *   floor_tracer PID REPS GAP_MS BUF_BYTES READ_BYTES STRING FUNC ARG... [-- FUNC ARG...]...
 *
 * Each of REPS stops, GAP_MS apart: PTRACE_SEIZE + PTRACE_INTERRUPT, wait,
 * PTRACE_GETREGS, the XSAVE area (PTRACE_GETREGSET NT_X86_XSTATE), the
 * signal mask; STRING, a NUL at the buffer's start and the return address 0
 * written below the red zone in one process_vm_writev; the calls' signal
 * mask (all blocked but SIGSEGV); then each call in turn: its return address
 * written again (the engine writes each call's frame), FUNC(ARG...) run with
 * PTRACE_CONT until the return-to-0 SIGSEGV, PTRACE_GETSIGINFO,
 * PTRACE_GETREGS; READ_BYTES of the buffer read back; registers, XSAVE area
 * and mask restored; detach.  An ARG is "B" (the buffer), "S" (the string),
 * "R1".."R9" (what call 1..9 of this stop returned) or a number (0x.. or
 * decimal).  The target must be an idle thread blocked in a restartable
 * syscall (bench/pause_target.c's main thread, in read(2)) with room on its
 * stack mapping for the string, the buffer and the callee.
 *
 * Prints one line: the stops' durations in microseconds (from the seize to
 * the detach's return), then "CALL" and the calls' CONT-to-trap times (summed
 * per stop).  x86-64 only, as the engine.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RED_ZONE 128
#define MAX_ARGS 6
#define MAX_CALLS 9
#define XSTATE_MAX 65536
#define SIGSET_BYTES 8

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void die(const char *what)
{
    fprintf(stderr, "floor_tracer: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void req(long r, const char *what)
{
    if (r == -1)
        die(what);
}

static int wait_stop(pid_t tid)
{
    int status;
    if (waitpid(tid, &status, __WALL) != tid)
        die("waitpid");
    if (!WIFSTOPPED(status)) {
        fprintf(stderr, "floor_tracer: thread %d did not stop (status %#x)\n", tid, status);
        exit(2);
    }
    return status;
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: floor_tracer PID REPS GAP_MS BUF_BYTES READ_BYTES STRING FUNC ARG...\n");
        return 2;
    }
    pid_t tid = (pid_t)atoi(argv[1]);
    int reps = atoi(argv[2]), gap_ms = atoi(argv[3]);
    unsigned long buf_bytes = strtoul(argv[4], NULL, 0), read_bytes = strtoul(argv[5], NULL, 0);
    const char *string = argv[6];
    struct { unsigned long func; int nargs; char **args; } calls[MAX_CALLS];
    int ncalls = 0;
    for (int i = 7; i < argc; ) {
        if (ncalls == MAX_CALLS) {
            fprintf(stderr, "floor_tracer: at most %d calls\n", MAX_CALLS);
            return 2;
        }
        calls[ncalls].func = strtoul(argv[i], NULL, 0);
        calls[ncalls].args = &argv[i + 1];
        int j = i + 1;
        while (j < argc && strcmp(argv[j], "--"))
            j++;
        calls[ncalls].nargs = j - i - 1;
        if (calls[ncalls].nargs > MAX_ARGS) {
            fprintf(stderr, "floor_tracer: at most %d arguments a call\n", MAX_ARGS);
            return 2;
        }
        ncalls++;
        i = j + 1;
    }
    if (reps < 1 || ncalls < 1) {
        fprintf(stderr, "floor_tracer: at least one rep and one call\n");
        return 2;
    }
    static char xstate[XSTATE_MAX];
    char *out = malloc(read_bytes);
    double *stop_us = calloc(reps, sizeof(double)), *call_us = calloc(reps, sizeof(double));
    if (!out || !stop_us || !call_us)
        die("malloc");
    size_t slen = strlen(string) + 1;
    for (int i = 0; i < reps; i++) {
        if (gap_ms)
            usleep(gap_ms * 1000);
        double t0 = now_us();
        req(ptrace(PTRACE_SEIZE, tid, 0, 0), "PTRACE_SEIZE");
        req(ptrace(PTRACE_INTERRUPT, tid, 0, 0), "PTRACE_INTERRUPT");
        wait_stop(tid);
        struct user_regs_struct saved, call, back;
        req(ptrace(PTRACE_GETREGS, tid, 0, &saved), "PTRACE_GETREGS");
        struct iovec xio = {xstate, sizeof xstate};
        req(ptrace(PTRACE_GETREGSET, tid, (void *)NT_X86_XSTATE, &xio), "PTRACE_GETREGSET");
        uint64_t mask, call_mask = ~(1ULL << (SIGSEGV - 1));
        req(ptrace(PTRACE_GETSIGMASK, tid, (void *)SIGSET_BYTES, &mask), "PTRACE_GETSIGMASK");

        unsigned long top = saved.rsp - RED_ZONE;
        unsigned long str_at = (top - slen) & ~15UL;
        unsigned long buf_at = (str_at - buf_bytes) & ~15UL;
        unsigned long sp = ((buf_at - 64) & ~15UL) - 8;     /* as after a call: rsp+8 aligned */
        uint64_t ret0 = 0;
        char nul = 0;
        struct iovec local[3] = {{(void *)string, slen}, {&nul, 1}, {&ret0, 8}};
        struct iovec remote[3] = {{(void *)str_at, slen}, {(void *)buf_at, 1}, {(void *)sp, 8}};
        if (process_vm_writev(tid, local, 3, remote, 3, 0) != (ssize_t)(slen + 9))
            die("process_vm_writev (no room on the thread's stack mapping?)");
        req(ptrace(PTRACE_SETSIGMASK, tid, (void *)SIGSET_BYTES, &call_mask), "PTRACE_SETSIGMASK");

        unsigned long long returned[MAX_CALLS] = {0};
        double in_calls = 0;
        for (int k = 0; k < ncalls; k++) {
            if (k) {
                struct iovec l1 = {&ret0, 8}, r1 = {(void *)sp, 8};
                if (process_vm_writev(tid, &l1, 1, &r1, 1, 0) != 8)
                    die("process_vm_writev");
            }
            unsigned long long args[MAX_ARGS] = {0};
            for (int a = 0; a < calls[k].nargs; a++) {
                const char *s = calls[k].args[a];
                if (!strcmp(s, "B"))
                    args[a] = buf_at;
                else if (!strcmp(s, "S"))
                    args[a] = str_at;
                else if (s[0] == 'R' && s[1] >= '1' && s[1] <= '0' + k && !s[2])
                    args[a] = returned[s[1] - '1'];
                else
                    args[a] = strtoull(s, NULL, 0);
            }
            call = saved;
            call.rip = calls[k].func;
            call.rsp = sp;
            call.rdi = args[0]; call.rsi = args[1]; call.rdx = args[2];
            call.rcx = args[3]; call.r8 = args[4]; call.r9 = args[5];
            call.rax = 0;
            call.orig_rax = -1;     /* no syscall restart on the way into the call */
            req(ptrace(PTRACE_SETREGS, tid, 0, &call), "PTRACE_SETREGS");
            double c0 = now_us();
            req(ptrace(PTRACE_CONT, tid, 0, 0), "PTRACE_CONT");
            int status = wait_stop(tid);
            in_calls += now_us() - c0;
            siginfo_t si;
            req(ptrace(PTRACE_GETSIGINFO, tid, 0, &si), "PTRACE_GETSIGINFO");
            req(ptrace(PTRACE_GETREGS, tid, 0, &back), "PTRACE_GETREGS");
            if (WSTOPSIG(status) != SIGSEGV || back.rip != 0) {
                fprintf(stderr, "floor_tracer: call %d stopped with signal %d at %#llx, not "
                        "the return-to-0 trap\n", k + 1, WSTOPSIG(status), back.rip);
                return 2;
            }
            returned[k] = back.rax;
        }
        struct iovec lo = {out, read_bytes}, ro = {(void *)buf_at, read_bytes};
        if (process_vm_readv(tid, &lo, 1, &ro, 1, 0) != (ssize_t)read_bytes)
            die("process_vm_readv");
        req(ptrace(PTRACE_SETREGS, tid, 0, &saved), "PTRACE_SETREGS");
        req(ptrace(PTRACE_SETREGSET, tid, (void *)NT_X86_XSTATE, &xio), "PTRACE_SETREGSET");
        req(ptrace(PTRACE_SETSIGMASK, tid, (void *)SIGSET_BYTES, &mask), "PTRACE_SETSIGMASK");
        req(ptrace(PTRACE_DETACH, tid, 0, 0), "PTRACE_DETACH");
        stop_us[i] = now_us() - t0;
        call_us[i] = in_calls;
    }
    for (int i = 0; i < reps; i++)
        printf("%.0f ", stop_us[i]);
    printf("CALL");
    for (int i = 0; i < reps; i++)
        printf(" %.0f", call_us[i]);
    printf("\n");
    return 0;
}
