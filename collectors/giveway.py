"""Giving the CPU away between the steps of a snapshot.

On a saturated host an observer delays the requests of the CPU it lands on
for as long as it runs at a time, more than for how much it runs in all:
redis-benchmark's GET p99.9 on a 2-core KVM guest moved as much under a
Python loop that burnt 3 ms once a second as under `record --interval 1`
(1.20-1.48 ms against 0.87-1.07 without); the same 3 ms cut into ten pieces
with a yield between moved it to 1.12-1.16; SCHED_IDLE did not help (1.27).
So allocdiag yields between its steps (the build check, the choice of a
thread, the live stats, the kernel's view, the fit), never inside a stop.
With nothing else runnable a yield returns at once (~1 us).
"""

import os


def give_way() -> None:
    """Let the other runnable tasks of this CPU run first (sched_yield(2))."""
    os.sched_yield()
