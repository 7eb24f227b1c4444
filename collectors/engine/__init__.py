"""The remote-call engine: run a function inside a live process on one
borrowed thread (``collectors.engine.remote`` is the facade the rest of the
code uses).

Safety rules
------------
- Safe points (policy in ``collectors.engine.safepoints``), tried in this order:
  restartable waits (read, poll, select, pause, nanosleep, accept/accept4,
  recvfrom/recvmsg, wait4/waitid, rt_sigsuspend, ...; issued from outside
  allocator text), epoll-family waits (epoll_wait/epoll_pwait/epoll_pwait2/
  rt_sigtimedwait: they hold -EINTR at the stop and are given back with
  rax = -ERESTARTNOHAND, orig_rax and rip unchanged, after checking `0f 05`
  at rip-2 and cs 0x33), FUTEX_WAIT_BITSET waits that a ``.eh_frame`` walk
  (``collectors.binary.unwind``; CFI parsed before the stop) proves outside the
  allocator and inside pthread_cond_*wait/sem_*wait/pthread_join, the Go
  runtime's own parks in a cgo binary (``go_runtime``: a
  ``safepoints.GoRuntime``; PC in its runtime.futex/runtime.usleep stub, on a
  glibc thread stack only), and last running threads interrupted outside
  every forbidden range.  A stop that
  lands after the wait returned (rax >= 0) is restored exactly.  Futex lock
  waits, PI/requeue ops, futex_waitv, semop, mmap & co and allocator
  background threads (``jemalloc_bg_thd``) are never borrowed.  Any stopped
  wait that holds -EINTR because of the stop is given back with
  -ERESTARTNOHAND, borrowed or not.
- The return-to-0 trap is a forced SIGSEGV: SIGSEGV (and the other synchronous
  signals) are unblocked in the thread for the call so the kernel never resets
  the program's SIGSEGV handler; a process that ignores SIGSEGV is refused.
- Signals: with ``block_signals`` (default) the thread's mask blocks every
  asynchronous signal during the window, so they stay queued in the kernel
  (original siginfo untouched, standard-signal semantics unchanged) and are
  delivered when the mask is restored.  Any signal-delivery-stop that still
  happens (a signal dequeued in the microseconds between SEIZE and the stop,
  or any signal with ``block_signals=False``) is collected with
  PTRACE_GETSIGINFO, suppressed, and after the registers are restored
  re-delivered with its original siginfo: one by injection at the final
  signal-delivery-stop (SETSIGINFO + DETACH with the signal), others requeued
  by injecting them while blocked (the kernel queues them with their siginfo).
  Nothing is ever re-sent with kill().
- restart_syscall (a sleep, poll or timed futex wait resumed after any
  earlier interruption) is judged like any other wait
  (``safepoints.classify_restart``): a futex by its wait channel and
  argument registers, a sleep or poll by an ``.eh_frame`` walk with no
  allocator frame; restored exactly, it continues to its original deadline.
  An epoll-family wait restored with -ERESTARTNOHAND gets what is left of
  its timeout (``_keep_deadline``), not the whole timeout again.
- Stack bounds (``collectors.engine.stackbounds``): every byte written on the
  borrowed stack -- red zone kept, scratch, call frame, alignment -- and the
  callee's own measured stack need (``stack_need``) lie inside the thread's
  own stack mapping above its lowest page and a margin; a thread without
  that room is not a candidate (candidates are ranked by room, and the next
  one is tried).  ``Call.write`` writes only into scratch or buffers the
  borrow made.  Inventory of every write: docs/target-writes.md.
- Small scratch is stack below the red zone (nothing to free); big output
  buffers are anonymous mappings, unmapped before the thread is released.
- No PTRACE_O_EXITKILL: if allocdiag dies the target continues.
"""
