"""The engine's decisions are reason codes (collectors.engine.safepoints.Reason),
not English: a thread parked in a known wait is refused with its specific
code, the users' words come from the one table keyed by the code, and no
module of the engine decides by looking at message text (ast)."""

import ast
import pathlib
import signal
import time

import pytest

from targets import wait_for
from test_safepoints import LIBC_NAMES, assert_released, parked, sp, thread_state  # noqa: F401

from collectors.engine import safepoints
from collectors.engine.remote import RemoteProcess, text_ranges
from collectors.engine.safepoints import REASON_TEXT, Reason, Refusal
from diag.model.errors import RemoteCallError

ENGINE = pathlib.Path(__file__).resolve().parent.parent / "collectors" / "engine"
NR_FUTEX = 202


def _candidates(rp, tid):
    return rp._chooser.candidates(tid)


def test_mutex_wait_is_refused_with_its_code(sp):  # noqa: F811
    """A thread blocked on a contended mutex (FUTEX_WAIT, value 2) is
    refused before any stop with WAIT_REFUSED, and the words are the ones
    users have always read."""
    t, a = sp("mutex")
    parked(t, a, NR_FUTEX)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    rnd = _candidates(rp, a["tid"])
    assert rnd.candidates == []
    why = rnd.refused[a["tid"]]
    assert isinstance(why, Refusal)
    assert why.code is Reason.WAIT_REFUSED
    assert why.text.startswith("futex lock wait (mutex contention)")
    assert not why.busy
    assert rp.stats["rejected_stops"] == 0
    assert_released(t.pid)


def test_condvar_wait_is_a_futex_candidate_and_judged_safe(sp):  # noqa: F811
    """A condition-variable wait is a FUTEX candidate; stopped and walked, the
    judge returns no refusal and fills in the typed verdict."""
    t, a = sp("condwait")
    parked(t, a, NR_FUTEX)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    rnd = _candidates(rp, a["tid"])
    assert [(c.tid, c.category) for c in rnd.candidates] == [(a["tid"], safepoints.FUTEX)]
    with rp.borrow(tid=a["tid"]) as c:
        assert c.category == safepoints.FUTEX and c.kind == "idle"
    assert rp.last["category"] == "futex"
    assert_released(t.pid)


def test_stopped_process_is_refused_by_group_stop_code(sp):  # noqa: F811
    """A thread found in a group-stop: the judge says GROUP_STOP (a code),
    and the borrow gives the stopped-process message."""
    t, a = sp("condwait")
    parked(t, a, NR_FUTEX)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES),
                       deadline_s=0.5)
    import os
    os.kill(t.pid, signal.SIGSTOP)
    try:
        for tid in os.listdir(f"/proc/{t.pid}/task"):
            wait_for(lambda: thread_state(t.pid, tid) == "T",
                     what=f"thread {tid} in the group stop")
        with pytest.raises(RemoteCallError, match="SIGSTOP / job control"):
            with rp.borrow(tid=a["tid"]):
                pass
    finally:
        os.kill(t.pid, signal.SIGCONT)


NR_READ = 0


def test_seccomp_strict_thread_is_never_borrowed(sp):  # noqa: F811
    """A thread in seccomp strict mode dies (SIGKILL, no ptrace stop to undo)
    at the first syscall but read/write/exit/sigreturn a call would make:
    refused before any stop with SECCOMP_STRICT, and the process's other
    thread serves the call instead."""
    t, a = sp("strict_read")
    parked(t, a, NR_READ)
    with open(f"/proc/{t.pid}/task/{a['tid']}/status") as f:
        assert "\nSeccomp:\t1\n" in f.read()
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES),
                       deadline_s=10.0)
    t0 = time.monotonic()
    with pytest.raises(RemoteCallError) as err:
        with rp.borrow(tid=a["tid"]):
            pass
    # no wait changes it: refused at once, not after the 10-s deadline
    assert time.monotonic() - t0 < 5.0
    assert "can never be borrowed" in str(err.value), err.value
    assert "seccomp strict mode" in str(err.value), err.value
    assert rp.stats["rejected_stops"] == 0
    with rp.borrow() as c:
        assert c.tid == a["main"] and c.call(a["getpid"]) == t.pid
    assert_released(t.pid)
    assert t.proc.poll() is None
    with open(f"/proc/{t.pid}/task/{a['tid']}/status") as f:
        assert "\nSeccomp:\t1\n" in f.read()      # the strict thread lives on


@pytest.mark.parametrize("mode, words", [
    # malloc_stats() holds the arena lock while its cookie stream's writer
    # reads: a call to malloc_info there would wait on that lock for ever
    ("cookie_read", "read inside glibc malloc_stats()"),
    # a handler may have interrupted the allocator holding its lock
    ("handler_read", "read inside a signal handler"),
])
def test_wait_with_the_allocator_or_a_handler_below_is_refused_before_the_stop(
        sp, mode, words):  # noqa: F811
    """A read(2) wait is judged by its syscall in the stop; the walk before
    the stop finds what lies below it, and the thread is never stopped."""
    t, a = sp(mode)
    parked(t, a, NR_READ)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES),
                       deadline_s=0.5)
    with pytest.raises(RemoteCallError) as err:
        with rp.borrow(tid=a["tid"]):
            pass
    assert words in str(err.value), err.value
    assert rp.stats["rejected_stops"] == 0 and rp.stats["borrows"] == 0
    # the main thread, in its own read with nothing below, serves the call
    with rp.borrow() as c:
        assert c.tid == a["main"] and c.call(a["getpid"]) == t.pid
    assert_released(t.pid)


def test_look_ahead_that_cannot_walk_judges_as_before(sp, monkeypatch):  # noqa: F811
    """A walk before the stop that fails in an unexpected way (a table that
    does not parse) proves nothing: the wait is judged by its syscall, as
    before the look-ahead existed."""
    t, a = sp("handler_read")
    parked(t, a, NR_READ)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES),
                       deadline_s=0.5)
    judge = rp._chooser.stack_judge()

    def broken(*args, **kw):
        raise ValueError("no such CFA rule")

    monkeypatch.setattr(judge.unwinder, "walk", broken)
    with open(f"/proc/{t.pid}/task/{a['tid']}/syscall") as f:     # parked: pc and sp shown
        sc = f.read().split()
    assert judge.look_ahead(int(sc[-1], 16), int(sc[-2], 16), "read") is None


def test_look_ahead_walks_again_only_when_a_word_it_read_reads_differently(
        sp, monkeypatch):  # noqa: F811
    """A thread parked in one wait is looked at before every snapshot's
    stop: the walk is kept with the stack words it read (saved registers,
    return addresses) and the text it looked at, and not made again while
    they read the same; one of them read differently walks again."""
    t, a = sp("handler_read")
    parked(t, a, NR_READ)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES),
                       deadline_s=0.5)
    judge = rp._chooser.stack_judge()
    with open(f"/proc/{t.pid}/task/{a['tid']}/syscall") as f:     # parked: pc and sp shown
        sc = f.read().split()
    pc, sp_ = int(sc[-1], 16), int(sc[-2], 16)
    assert judge.look_ahead(pc, sp_, "read").code is Reason.SIGNAL_HANDLER
    walks = []
    real_walk = judge.unwinder.walk

    def counted(*args, **kw):
        walks.append(args)
        return real_walk(*args, **kw)

    monkeypatch.setattr(judge.unwinder, "walk", counted)
    assert judge.look_ahead(pc, sp_, "read").code is Reason.SIGNAL_HANDLER
    assert walks == []
    kept = judge._ahead[(pc, sp_)][0]
    assert len(kept) >= 2          # the frames' saved words and the trampoline's text
    for victim in kept:
        assert _walks_when_flipped(judge, monkeypatch, victim, walks,
                                   lambda: judge.look_ahead(pc, sp_, "read")), hex(victim)
        judge.look_ahead(pc, sp_, "read")           # as it was: walked and kept again
    assert judge.look_ahead(pc, sp_, "read").code is Reason.SIGNAL_HANDLER


def _walks_when_flipped(judge, monkeypatch, victim, walks, ask):
    """True when ASK() walks again with the byte at VICTIM read flipped
    through JUDGE's reader (WALKS: the walks counted); the reader is the
    real one again after."""
    real_read = judge.read

    def changed(at, n):
        data = real_read(at, n)
        if data is not None and at <= victim < at + n:
            i = victim - at
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        return data

    monkeypatch.setattr(judge, "read", changed)
    before = len(walks)
    try:
        ask()
    finally:
        monkeypatch.setattr(judge, "read", real_read)
    return len(walks) == before + 1


def test_every_reason_has_words():
    assert set(REASON_TEXT) == set(Reason)
    r = Refusal(Reason.NO_ROOM, {"room": "12 KiB", "need": "20 KiB"}, "read")
    assert r.text == ("read: has 12 KiB of its stack free below the stack pointer; "
                      "the call needs 20 KiB")
    assert r.about("running").busy and not r.busy


# ---- no decision on message text ----------------------------------------------

MESSAGE_NAMES = {"why", "reason", "r", "msg", "message", "words", "text", "what"}


def message_text_decisions(source, filename="<src>"):
    """(line, snippet) of every place SOURCE decides by message text:
    ``str(exc)`` of a caught exception compared or searched, ``.startswith``
    / ``.endswith`` on a caught exception's text, on ``.msg``/``.args``, or
    on a variable named like a message, and a phrase (a string with a
    space) tested with ``in``."""
    tree = ast.parse(source, filename)
    caught = {h.name for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name}
    out = []

    def is_exc_text(node):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "str" and node.args:
            arg = node.args[0]
            return isinstance(arg, ast.Name) and arg.id in caught
        if isinstance(node, ast.Attribute) and node.attr in ("msg", "args", "message"):
            return True
        return isinstance(node, ast.Name) and (node.id in caught or node.id in MESSAGE_NAMES)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "endswith") and is_exc_text(node.func.value):
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Compare):
            sides = [node.left] + node.comparators
            if any(is_exc_text(s) and not isinstance(s, ast.Name) for s in sides):
                out.append((node.lineno, ast.unparse(node)))
            elif any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and \
                    isinstance(node.left, ast.Constant) and isinstance(node.left.value, str) \
                    and " " in node.left.value:
                out.append((node.lineno, ast.unparse(node)))
    return out


def test_no_engine_module_decides_by_message_text():
    found = {}
    for path in sorted(ENGINE.glob("*.py")):
        hits = message_text_decisions(path.read_text(), str(path))
        if hits:
            found[path.name] = hits
    assert found == {}


@pytest.mark.parametrize("snippet", [
    'try:\n    f()\nexcept E as e:\n    if "expression" in str(e):\n        pass\n',
    'def f(why):\n    return why.startswith("inside")\n',
    'def f(why):\n    return any("the call needs" in r for r in why.values())\n',
    'def f(e):\n    return e.msg.startswith("x")\n',
])
def test_the_check_finds_what_the_old_engine_did(snippet):
    """The patterns remote.py used before the reason codes are found."""
    assert message_text_decisions(snippet)


def test_engine_modules_import_no_circle():
    """No import circle inside the engine (memory <-> tracee was one)."""
    graph = {}
    for path in ENGINE.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "collectors.engine":
                    deps |= {a.name for a in node.names}
                elif node.module.startswith("collectors.engine."):
                    deps.add(node.module.rsplit(".", 1)[1])
            elif isinstance(node, ast.Import):
                deps |= {a.name.rsplit(".", 1)[1] for a in node.names
                         if a.name.startswith("collectors.engine.")}
        graph[path.stem] = deps & {p.stem for p in ENGINE.glob("*.py")}

    def visit(mod, trail):
        assert mod not in trail, " -> ".join(trail + [mod])
        for dep in graph.get(mod, ()):
            visit(dep, trail + [mod])

    for mod in graph:
        visit(mod, [])
    assert "tracee" not in graph["memory"]


def test_debug_lines_name_the_decisions(sp, caplog):  # noqa: F811
    """The "collectors.engine" logger says, per tid: the refusal (with its
    code) of a thread it will not stop, the seize, the chosen thread with its
    category, each call and its µs, the release's pause and the detach."""
    import logging
    t, a = sp("mutex")
    parked(t, a, NR_FUTEX)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    getpid = None
    from collectors.binary.image import ProcessImage
    from collectors.livestats import Resolver
    getpid = Resolver(ProcessImage(t.pid)).libc("getpid")
    with caplog.at_level(logging.DEBUG, logger="collectors.engine"):
        with rp.borrow() as c:
            assert c.call(getpid) == t.pid
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "collectors.engine")
    main = a["main"]
    assert f"tid {a['tid']} refused before any stop: wait-refused" in text
    assert f"tid {main} seized" in text
    assert f"tid {main} chosen: restartable read" in text
    assert f"tid {main} call {getpid:#x}" in text and "returned" in text
    assert f"tid {main} (restartable read) borrowed: stopped " in text
    assert f"tid {main} detached" in text
    assert_released(t.pid)


def test_futex_wait_walks_again_only_when_a_word_it_read_reads_differently(
        sp, monkeypatch):  # noqa: F811
    """A thread parked in one condition wait is walked before each stop
    (prepare) and in it (judge).  Each walk is kept with the stack words it
    read, under (pc, sp) before the stop and under every register in it,
    and not made again while they read the same; any one of them read
    differently walks again, and a borrow with nothing changed walks
    neither time."""
    t, a = sp("condwait")
    parked(t, a, NR_FUTEX)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    judge = rp._chooser.stack_judge()
    walks, judged = [], []
    real_walk, real_judge = judge.unwinder.walk, judge.judge

    def counted(*args, **kw):
        walks.append(args)
        return real_walk(*args, **kw)

    def seen(regs):
        judged.append(regs)
        return real_judge(regs)

    with open(f"/proc/{t.pid}/task/{a['tid']}/syscall") as f:     # parked: pc and sp shown
        sc = f.read().split()
    pc, sp_ = int(sc[-1], 16), int(sc[-2], 16)
    with rp.borrow(tid=a["tid"]) as c:             # walked before the stop, and in it
        assert c.category == safepoints.FUTEX
    monkeypatch.setattr(judge.unwinder, "walk", counted)
    monkeypatch.setattr(judge, "judge", seen)
    with rp.borrow(tid=a["tid"]) as c:
        assert c.category == safepoints.FUTEX
        assert walks == [] and len(judged) == 1
        # the kept walks, each flipped word in turn (the thread stays stopped)
        for kept, ask in ((judge._prepared[(pc, sp_)][0], lambda: judge.prepare(pc, sp_)),
                          (judge._judged[tuple(sorted(judged[0].items()))][0],
                           lambda: real_judge(judged[0]))):
            assert len(kept) >= 2          # saved registers and return addresses
            for victim in kept:
                assert _walks_when_flipped(judge, monkeypatch, victim, walks, ask), hex(victim)
                assert ask() is None                # as it was: walked, safe, kept again
    assert_released(t.pid)
