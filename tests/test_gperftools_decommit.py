"""collectors.allocators.gperftools.decommit: finding PageHeap's
aggressive_decommit_ byte in the code of GetNumericProperty.  Synthetic code
for each rule of the pattern, Debian's libraries for the real thing (the
live check against the call is in tests/test_livestats.py), random bytes
that must give None or an address in writable data, never an exception;
and how a check's outcome is judged."""

import glob

import pytest
from hypothesis import given, settings, strategies as st

from codebytes import code_at, library, rel32
from collectors.allocators import checked
from collectors.allocators.gperftools import reader as gperftools
from collectors.allocators.gperftools import decommit

ENTRY, BRANCH, NAME_AT, DATA = 0x1000, 0x1800, 0x4000, 0x9000
DATA_END = 0xA000
NOP, RET = b"\x90", b"\xc3"
MOV_RBP_RDI = b"\x48\x89\xef"
TEST = b"\x85\xc0"
# what Debian's build does at the branch before the load: the lock
LOCK = (b"\x48\x8b\x2d\x00\x00\x00\x00"      # mov 0x0(%rip),%rbp
        b"\xba\x01\x00\x00\x00"              # mov $0x1,%edx
        b"\xf0\x0f\xb1\x55\x00"              # lock cmpxchg %edx,0x0(%rbp)
        b"\x85\xc0\x75\x4c")                 # test %eax,%eax; jne (slow path)


def lea_name(at, target=NAME_AT, rex=0x48, modrm=0x35):
    return bytes([rex, 0x8D, modrm]) + rel32(target, at + decommit.LEA_LEN)


def movzbl(at, target, rex=b""):
    head = rex + b"\x0f\xb6\x05"
    return head + rel32(target, at + len(head) + 4)


def compare(at, branch, jump="je32"):
    """lea NAME; mov %rbp,%rdi; call strcmp; test %eax,%eax; j(n)e."""
    code = lea_name(at) + MOV_RBP_RDI
    code += b"\xe8" + rel32(0x500, at + len(code) + 5) + TEST
    end = at + len(code)
    if jump == "je32":
        return code + b"\x0f\x84" + rel32(branch, end + 6)
    if jump == "je8":
        return code + bytes([0x74, branch - (end + 2)])
    return code + b"\x0f\x85" + rel32(0x1F00, end + 6)      # jne: the body follows


def image(func, branch_code=None, name=decommit.NAME):
    segs = {ENTRY: func, NAME_AT: name}
    if branch_code is not None:
        segs[BRANCH] = branch_code
    return code_at(segs)


def writable(v):
    return DATA <= v < DATA_END


def debians_shape(target=DATA + 0x7CC, jump="je32", rex=b""):
    func = NOP * 8 + compare(ENTRY + 8, BRANCH, jump) + RET
    branch = LOCK + movzbl(BRANCH + len(LOCK), target, rex) + RET
    return func, branch


def test_the_pattern_of_debians_build_is_found():
    func, branch = debians_shape()
    assert decommit.locate(image(func, branch), ENTRY, writable) == DATA + 0x7CC


def test_a_short_je_and_a_high_register_are_followed():
    func = NOP * 8 + compare(ENTRY + 8, ENTRY + 0x60, "je8") + RET
    func = func.ljust(0x60, NOP) + movzbl(ENTRY + 0x60, DATA, rex=b"\x44") + RET
    assert decommit.locate(image(func), ENTRY, writable) == DATA


def test_a_jne_over_the_body_takes_the_body_that_follows():
    at = ENTRY + 8
    cmp = compare(at, None, "jne")
    body = movzbl(at + len(cmp), DATA + 5)
    assert decommit.locate(image(NOP * 8 + cmp + body + RET), ENTRY, writable) == DATA + 5


def test_what_is_not_the_pattern_gives_none():
    func, branch = debians_shape()
    # another property's name
    assert decommit.locate(image(func, branch, name=b"tcmalloc.heap_limit_mb\0"),
                           ENTRY, writable) is None
    # the load is not into writable data
    func2, branch2 = debians_shape(target=0x100)
    assert decommit.locate(image(func2, branch2), ENTRY, writable) is None
    # no load at the branch
    assert decommit.locate(image(func, LOCK + RET), ENTRY, writable) is None
    # the lea without the call and test after it
    lone = NOP * 8 + lea_name(ENTRY + 8) + NOP * 32 + RET
    assert decommit.locate(image(lone, branch), ENTRY, writable) is None
    # not RIP-relative (lea 0x0(%rsi),%rsi: mod 01)
    bad = NOP * 8 + bytes([0x48, 0x8D, 0x76, 0x00]) + compare(ENTRY + 12, BRANCH)[7:] + RET
    assert decommit.locate(image(bad, branch), ENTRY, writable) is None
    # no code
    assert decommit.locate(lambda v, n: None, ENTRY, writable) is None
    assert decommit.locate(image(b""), ENTRY, writable) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.binary(max_size=80))
def test_random_code_gives_none_or_writable_data(func, branch):
    found = decommit.locate(image(func, branch), ENTRY, writable)
    assert found is None or writable(found)


LIBS = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libtcmalloc*.so.4"))


@pytest.mark.parametrize("path", LIBS)
def test_debians_libraries_hold_it_in_their_writable_segment(path):
    obj, code, opener = library(path)
    entry = obj.lookup(decommit.ENTRY, opener)
    assert entry is not None
    found = decommit.locate(code, entry.st_value, checked.in_load(obj, checked.PF_W))
    assert found is not None and checked.in_load(obj, checked.PF_W)(found)
    if obj.build_id == "560cd227169ae8f93cb59e3215f4ea11c299fa69":   # Debian 12's 2.10
        assert found == 0x1D47CC


def test_debian_ships_the_libraries_the_test_reads():
    assert "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4" in LIBS
    assert "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4" in LIBS


def test_a_disagreement_counts_against_the_address_only_when_the_byte_held_still(monkeypatch):
    # parse() of a checking stop: the call's answer, the byte read right
    # after it, and the byte read before the stop.  A byte that moved (a
    # SetNumericProperty meanwhile) leaves the address unjudged.
    key = ("lib", 1, 2)
    monkeypatch.setattr(gperftools.DECOMMIT_AT, "facts", {key: dict(
        checked.new_facts(0x1D47CC, "test"), disk=(None, None))})
    facts = gperftools.DECOMMIT_AT.facts[key]

    def check(byte, before, called):
        raw = {"properties": {gperftools.DECOMMIT: called},
               "decommit_check": ((0x7F00001D47CC, key), byte, before)}
        return gperftools.parse(raw, None)["gathered_by"]

    assert "moved meanwhile" in check(1, 0, 0)
    assert facts["disagreed"] == 0 and not facts["checked"]
    assert "different (not used)" in check(7, 7, 0)
    assert facts["disagreed"] == 1 and not facts["checked"]
    assert "the same value" in check(1, 1, 1)
    assert facts["checked"]


def test_a_byte_that_is_no_bool_is_not_used_but_checked_again():
    # a checked address whose byte now holds something a C++ bool cannot
    # (another variable there: a layout the check did not catch) is not
    # shown; the stop calls for the property and compares again
    assert gperftools.prefetched_decommit(True, 1) == {"decommit": 1}
    assert gperftools.prefetched_decommit(True, 0) == {"decommit": 0}
    assert gperftools.prefetched_decommit(True, 0x2A) == {"decommit_before": 0x2A}
    assert gperftools.prefetched_decommit(False, 1) == {"decommit_before": 1}


class RecordingCall:
    """The part of collectors.engine.callframe.Call a gather uses, answering
    every GetNumericProperty with true and 0, and recording the reads."""

    def __init__(self):
        self.reads, self.calls, self._next = [], 0, 0x7000

    def scratch(self, n):
        self._next += n
        return self._next - n

    def write(self, addr, data):
        pass

    def call(self, func, *args):
        self.calls += 1
        return 1

    def read(self, addr, n):
        self.reads.append(addr)
        return b"\0" * n


def plan_with(**more):
    return dict({"props": gperftools.EVERY_SNAPSHOT, "get": 0x500, "stats": None,
                 "limit_at": None, "process_key": None, "decommit_at": (0x9000, "lib")}, **more)


def test_the_check_reads_inside_the_stop_only_what_was_read_before_it():
    # the byte could not be read before the stop: the property is called for
    # and not checked (no read of the address inside the stop that could fail)
    c = RecordingCall()
    raw = gperftools.gather(c, plan_with(), {})
    assert c.calls == 2 and 0x9000 not in c.reads and "decommit_check" not in raw
    # read before it: the stop calls and reads the byte right after
    c = RecordingCall()
    raw = gperftools.gather(c, plan_with(decommit_before=0), {})
    assert raw["decommit_check"] == ((0x9000, "lib"), 0, 0) and c.reads[-1] == 0x9000
    # checked and read before the stop: no call for it, no read inside
    c = RecordingCall()
    raw = gperftools.gather(c, plan_with(decommit=1), {})
    assert c.calls == 1 and 0x9000 not in c.reads
    assert raw["properties"][gperftools.DECOMMIT] == 1 and raw["decommit_read"] == (0x9000, "lib")
