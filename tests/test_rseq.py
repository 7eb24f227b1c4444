"""A running thread stopped inside a restartable sequence is not borrowed
(collectors.engine.rseq): a call there would clear rseq->rseq_cs on its way
in, and the release would put the thread back inside a section the kernel
can no longer abort.  Measured before the check: five calls into the
spinning thread of tests/targets/rseq_spin.c gave five commits with rseq_cs
cleared."""

import time

import pytest

from targets import build_c, start
from test_remote_engine import LIBC_NAMES, assert_released, text_ranges

from collectors import livestats
from collectors.binary.image import ProcessImage
from collectors.engine import rseq
from collectors.engine.remote import RemoteProcess
from diag.model.errors import RemoteCallError


def counts(t):
    t.proc.stdin.write(b"x")
    t.proc.stdin.flush()
    words = t.proc.stdout.readline().decode().split()
    return dict(zip(words[::2], map(int, words[1::2])))


def test_a_thread_inside_an_rseq_section_is_never_called_in():
    with start([build_c("rseq_spin.c", "-lpthread")]) as t:
        tid = int(t.ready)
        labs = livestats.Resolver(ProcessImage(t.pid)).libc("labs")
        rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES),
                           deadline_s=1.0)
        # Each stop inside the section is refused and released, and the
        # kernel aborts the section; a later stop may find the thread in
        # its abort path, outside, and call there (safe).  Borrows go on
        # until one ran out of time with the thread inside every time.
        refusals, calls = [], 0
        for _ in range(10):
            try:
                with rp.borrow(tid=tid) as c:
                    assert c.call(labs, -7) == 7
                    calls += 1
            except RemoteCallError as e:
                refusals.append(str(e))
                break
        assert_released(t.pid)
        # a pass put back inside its section runs on to its commit check
        # (~400M iterations, a fraction of a second) before it counts
        time.sleep(1.5)
        after = counts(t)
        assert t.alive()
    assert after["violations"] == 0, after
    assert refusals and "running inside a restartable sequence" in refusals[0], \
        (refusals, calls)
    assert after["aborts"] > 0, after     # the stops themselves: the kernel aborted them


@pytest.mark.parametrize("pc, inside", [(0x1000, True), (0x1000 + 47, True),
                                        (0x1000 + 48, False), (0xfff, False)])
def test_the_section_holds_pcs_as_the_kernel_counts_them(pc, inside):
    # kernel/rseq.c in_rseq_cs: ip - start_ip < post_commit_offset, unsigned
    assert rseq.CriticalSection(0x1000, 48, 0x2000).holds(pc) is inside
