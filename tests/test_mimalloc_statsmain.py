"""collectors.allocators.mimalloc.statsmain: finding _mi_stats_main in the code
of mi_process_info.  Synthetic code for each rule of the pattern, Debian's
library for the real thing (the live check against mi_process_info is in
tests/test_livestats.py), and random bytes that must give None or an address
in writable data, never an exception."""


from hypothesis import given, settings, strategies as st

from codebytes import code_at, library, rel32
from collectors.allocators import checked
from collectors.allocators.mimalloc import statsmain

ENTRY, CALLEE, DATA = 0x1000, 0x2000, 0x9000
TEXT_END, DATA_END = 0x3000, 0xA000
NOP, RET = b"\x90", b"\xc3"


def call_at(at, target):
    return b"\xe8" + rel32(target, at + 5)


def lea(at, rex, modrm, target):
    return bytes([rex, 0x8D, modrm]) + rel32(target, at + statsmain.LEA_LEN)


def image(caller, callee):
    return code_at({ENTRY: caller, CALLEE: callee})


def executable(v):
    return ENTRY <= v < TEXT_END


def writable(v):
    return DATA <= v < DATA_END


def locate(callee, caller=None, target_ok=writable):
    caller = caller if caller is not None else NOP * 8 + call_at(ENTRY + 8, CALLEE) + RET
    return statsmain.locate(image(caller, callee), ENTRY, executable, target_ok)


def callee_with(rex=0x48, modrm=0x05, loads=(b"\x48\x8b\x50\x70", b"\x48\x8b\x40\x78"),
                target=DATA):
    at = CALLEE + 4
    return NOP * 4 + lea(at, rex, modrm, target) + b"".join(loads) + RET


def test_the_pattern_of_debians_build_is_found():
    # lea 0x..(%rip),%rax; mov 0x70(%rax),%rdx; mov 0x78(%rax),%rax
    assert locate(callee_with()) == DATA


def test_a_high_register_is_followed_through_rex():
    # lea 0x..(%rip),%r8 (REX.R); mov 0x70(%r8),%rdx; mov 0x78(%r8),%rax (REX.B)
    assert locate(callee_with(rex=0x4C, loads=(b"\x49\x8b\x50\x70", b"\x49\x8b\x40\x78"))) == DATA


def test_what_is_not_the_pattern_gives_none():
    # the loads from another register than the lea's
    assert locate(callee_with(loads=(b"\x48\x8b\x51\x70", b"\x48\x8b\x41\x78"))) is None
    # only the peak is loaded
    assert locate(callee_with(loads=(b"\x48\x8b\x50\x70",))) is None
    # other offsets (another layout)
    assert locate(callee_with(loads=(b"\x48\x8b\x50\x50", b"\x48\x8b\x40\x58"))) is None
    # the lea's target is not writable data
    assert locate(callee_with(target=TEXT_END - 0x10)) is None
    # not RIP-relative (lea 0x0(%rax),%rax: mod 01)
    assert locate(callee_with(modrm=0x40)) is None
    # the call goes outside the code
    assert locate(callee_with(), caller=NOP * 8 + call_at(ENTRY + 8, DATA) + RET) is None
    # no call at all, no code
    assert locate(callee_with(), caller=NOP * 16 + RET) is None
    assert statsmain.locate(lambda v, n: None, ENTRY, executable, writable) is None
    assert locate(b"") is None


def test_the_second_call_is_followed_when_the_first_leads_nowhere():
    other = 0x2800
    caller = call_at(ENTRY, other) + call_at(ENTRY + 5, CALLEE) + RET
    code = code_at({ENTRY: caller, CALLEE: callee_with(), other: NOP * 32 + RET})
    assert statsmain.locate(code, ENTRY, executable, writable) == DATA


def test_debians_libmimalloc_holds_it_in_its_writable_segment():
    obj, code, opener = library("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2.0")
    entry = obj.lookup("mi_process_info", opener)
    in_text, in_data = checked.in_load(obj, checked.PF_X), checked.in_load(obj, checked.PF_W)
    found = statsmain.locate(code, entry.st_value, in_text, in_data)
    assert found is not None and in_data(found) and not in_text(found)
    if obj.build_id == "d07f4e7dc9a039fcbe7747f416476bd65cb48e8b":   # Debian 12's 2.0.9
        assert found == 0x61C40


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=1100))
def test_random_code_gives_none_or_writable_data(caller, callee):
    found = statsmain.locate(image(caller, callee), ENTRY, executable, writable)
    assert found is None or writable(found)


def test_a_disagreement_counts_against_the_address_only_when_the_words_held_still(monkeypatch):
    # parse() of what gather() brings back from a checking stop: the eight
    # mi_process_info values and the two words read right after the call,
    # with the same words read before the stop.  Words that moved between
    # the two reads (another thread committed) leave the address unjudged.
    from collectors import allocators
    mi = allocators.module("mimalloc")
    key = ("lib", 1, 2)
    monkeypatch.setattr(mi.STATS_MAIN, "facts", {key: {
        "vaddr": 0x61C40, "found_by": "test", "checked": False, "disagreed": 0,
        "disk": (None, None)}})

    class Alloc:
        version = "2.0.9"

    def check(after, before):
        info = [1, 2, 3, 4096, 8192, 4096, 8192, 0]     # current_commit 4096, peak 8192
        raw = {"process_info": info, "stats_main_check": ((0x7F0000061C40, key), after, before),
               "stats_text": b""}
        return mi.parse(raw, Alloc())["gathered_by"]

    assert "moved meanwhile" in check((8192, 4160), (8192, 4100))
    assert mi.STATS_MAIN.facts[key]["disagreed"] == 0
    assert "different (not used)" in check((0, 77), (0, 77))
    assert mi.STATS_MAIN.facts[key]["disagreed"] == 1 and not mi.STATS_MAIN.facts[key]["checked"]
    assert "the same committed bytes" in check((8192, 4096), (8192, 4000))
    assert mi.STATS_MAIN.facts[key]["checked"]


def test_a_cache_entry_of_another_shape_is_not_used():
    from collectors.allocators import checked
    good = {"vaddr": 0x61C40, "found_by": "lea", "checked": True, "disagreed": 0}
    assert checked.stored_facts(good) and checked.stored_facts(dict(good, vaddr=None))
    for bad in (None, [], dict(good, vaddr="0x61c40"), dict(good, checked=1),
                dict(good, found_by=7), dict(good, extra=1),
                {k: v for k, v in good.items() if k != "disagreed"}):
        assert not checked.stored_facts(bad)
