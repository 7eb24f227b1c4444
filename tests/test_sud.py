"""A call into a thread under Syscall User Dispatch (Wine, emulators) whose
selector blocks syscalls: the kernel turns the call's syscall into a SIGSYS
(si_code SYS_USER_DISPATCH).  The engine takes it for a crash of the call:
the thread is restored, the SIGSYS is never delivered to the program's
handler, the process is quarantined for the run, and the message says what
happened (tests/targets/sud_spin.c)."""

import pytest

from targets import build_c, start
from test_remote_engine import LIBC_NAMES, assert_released, text_ranges

from collectors import livestats
from collectors.binary.image import ProcessImage
from collectors.engine.remote import RemoteProcess
from diag.model.errors import RemoteCallError


def dispatched(t):
    t.proc.stdin.write(b"x")
    t.proc.stdin.flush()
    return int(t.proc.stdout.readline().split()[1])


def test_a_call_whose_syscall_is_dispatched_is_undone_and_named():
    with start([build_c("sud_spin.c", "-lpthread")]) as t:
        tid = int(t.ready)
        getpid = livestats.Resolver(ProcessImage(t.pid)).libc("getpid")
        rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
        with pytest.raises(RemoteCallError) as err:
            with rp.borrow(tid=tid) as c:
                c.call(getpid)
        assert_released(t.pid)
        assert dispatched(t) == 0          # the program's handler never saw it
        assert t.alive()
    msg = str(err.value)
    assert "crashed with SIGSYS (SYS_USER_DISPATCH" in msg, msg
    assert "syscall user dispatch (PR_SET_SYSCALL_USER_DISPATCH" in msg, msg
    assert "the thread was restored" in msg
