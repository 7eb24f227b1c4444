"""Soak (issue 9 item 9): snapshots spread over the real servers under
loopback load, the 8-thread churn target under each of the four allocators,
and the EINTR-counting target with real signals sent in between.  Checks:
no crash (every target alive), no hang (bounded time per leg), no lost
signal and no visible EINTR (every signal handled; one EINTR per wait a signal
interrupted, as the handler reads from its context, and none otherwise),
no client error, every task untraced, and nothing of allocdiag's left in
the address space (no new mapping of livestats' buffer size, no new
executable anonymous mapping).

``test_soak_10000`` (marked soak, deselected by default) runs 10,000
snapshots; ``test_soak_bounded`` runs ~300 in CI (< 60 s).
"""

import time

import pytest

from collectors import livestats
from collectors.detect import detect
from collectors.binary.image import ProcessImage
from servers import traced_tasks, untraced
from targets import build_c, start
from test_real_servers import ALL, INFINITE, Load, ask, counts, server
from test_safety import THREADS, large_text_mappings, ops

CHURN = ["glibc", "jemalloc", "tcmalloc", "mimalloc"]


def anon_exec(pid):
    out = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 5 and "x" in parts[1]:
                out.add(parts[0])
    return out


def snap_loop(pid, count, budget_s, between=None, jit=False):
    image = ProcessImage(pid)
    det = detect(image)
    before = (large_text_mappings(pid), anon_exec(pid))
    t0 = time.monotonic()
    for i in range(count):
        ls = livestats.collect(image, det)
        assert ls.stats["resident"].value is not None or ls.stats["mapped"].value is not None
        if between:
            between(i)
        assert time.monotonic() - t0 < budget_s, f"hang? only {i} of {count} in {budget_s}s"
    assert not large_text_mappings(pid) - before[0], "livestats buffer left mapped"
    if not jit:   # node's V8 maps executable code space itself
        assert not anon_exec(pid) - before[1], "new executable anonymous mapping left"
    return time.monotonic() - t0


def server_leg(name, count, budget_s):
    with server(name) as s:
        with Load(name, s, seconds=budget_s) as load:
            took = snap_loop(s.pid, count, budget_s, jit=(name == "node"))
        assert s.alive() and untraced(s.pid), traced_tasks(s.pid)
        assert load.errors == 0, (name, load.errors, load.err_samples[:3])
    return took


def churn_leg(allocator, count, budget_s):
    exe = build_c("remote_churn.c", "-pthread", "-ldl")
    with start([exe, str(THREADS), "1"], allocator=allocator) as t:
        addr = int(t.ready.split("ops=")[1].split()[0], 16)
        first = ops(t.pid, addr)
        took = snap_loop(t.pid, count, budget_s)
        assert t.alive(), allocator
        time.sleep(0.1)
        assert ops(t.pid, addr) > first
        assert untraced(t.pid), traced_tasks(t.pid)
    return took


def eintr_leg(count, budget_s):
    exe = build_c("sp_eintr.c", "-pthread")
    with start([exe]) as t:
        sent = [0] * 6

        def signal_some(i):
            if i % 10 == 0:
                k = (i // 10) % 6
                ask(t, f"kill {k}")
                sent[k] += 1
        took = snap_loop(t.pid, count, budget_s, between=signal_some)
        time.sleep(0.2)
        eintr, handled, in_wait, restarted = counts(t)
        assert handled == sent, f"lost signals: sent {sent}, handled {handled}"
        assert eintr == in_wait, f"visible EINTRs: {eintr} for waits interrupted {in_wait}"
        assert restarted == [0] * 6, restarted
        assert [in_wait[i] for i in INFINITE] == [sent[i] for i in INFINITE], (in_wait, sent)
        assert t.alive() and untraced(t.pid)
    return took


def run(total, per_leg_budget):
    legs = [("server", n) for n in ALL] + [("churn", a) for a in CHURN] + [("eintr", "")]
    each = -(-total // len(legs))   # at least TOTAL in all
    report = {}
    for kind, name in legs:
        if kind == "server":
            took = server_leg(name, each, per_leg_budget)
        elif kind == "churn":
            took = churn_leg(name, each, per_leg_budget)
        else:
            took = eintr_leg(each, per_leg_budget)
        report[f"{kind}:{name}"] = round(took, 1)
    print(f"{each} snapshots per leg, {each * len(legs)} total; seconds per leg: {report}")
    return each * len(legs)


def test_soak_bounded():
    t0 = time.monotonic()
    assert run(300, 40) >= 300
    assert time.monotonic() - t0 < 90


@pytest.mark.soak
def test_soak_10000():
    assert run(10000, 900) >= 10000
