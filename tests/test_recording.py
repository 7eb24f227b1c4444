"""diag.recording: JSON Lines record/replay of Snapshot documents."""

import gzip
import json
import os

import pytest

from diag.model import Allocator, Preload
from diag.model.errors import MalformedData, NoSuchProcess
from diag.model.records import replace
from diag.recording import Recorder, read_recording, record, snapshot_from_json
from fakes import FIXTURES, SNAPSHOTS, jemalloc_snapshot, staircase


def _line(snap):
    return json.dumps(snap.to_json(), separators=(",", ":"))


@pytest.mark.parametrize("kind", sorted(SNAPSHOTS))
def test_round_trip_is_exact(kind, tmp_path):
    # GIVEN a snapshot of each allocator (findings, knobs, native dicts, unknowns)
    snap = SNAPSHOTS[kind]()
    path = tmp_path / "r.jsonl"
    with Recorder(path) as rec:
        rec.write(snap)
    # WHEN read back
    (back,) = read_recording(path)
    # THEN its document is byte-for-byte the recorded line
    text = path.read_text()
    assert _line(back) + "\n" == text
    # and the model is equal where JSON can say it (taken_at at µs resolution)
    assert back.stats == snap.stats and back.process == snap.process
    assert back.findings == snap.findings and back.allocator == snap.allocator
    assert back.preload == snap.preload and back.collectors == snap.collectors
    assert back.taken_at == snap.taken_at


def test_snapshot_equality_when_native_is_json_shaped():
    snap = jemalloc_snapshot()          # native: str keys, lists only
    assert snapshot_from_json(json.loads(_line(snap))) == snap


def test_a_line_reuses_the_text_of_the_records_its_snapshot_shares_with_the_last(
        tmp_path, monkeypatch):
    # GIVEN a real recording's snapshots sharing one Allocator and one
    # Preload (as a Session's do while the mappings stay the same), then one
    # with a Preload of its own (a new build)
    snaps = read_recording(os.path.join(FIXTURES, "recording-jemalloc-burst-release.jsonl.gz"))
    allocator, preload = snaps[0].allocator, snaps[0].preload
    shared = [replace(s, allocator=allocator, preload=preload) for s in snaps[:6]]
    rebuilt = replace(preload, verdict=preload.verdict + " (a new build)")
    shared.append(replace(shared[-1], preload=rebuilt))
    converted = []
    for cls in (Allocator, Preload):
        real = cls.to_json
        monkeypatch.setattr(cls, "to_json", lambda self, real=real: converted.append(
            type(self).__name__) or real(self))
    path = tmp_path / "r.jsonl"
    # WHEN recorded
    with Recorder(path) as rec:
        for s in shared:
            rec.write(s)
    written = converted.copy()
    # THEN every line is its snapshot's document, byte for byte
    assert path.read_text().splitlines() == [_line(s) for s in shared]
    # and each shared record was converted once, the new Preload once more
    assert sorted(written) == ["Allocator", "Preload", "Preload"]


def test_gzip(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    snaps = staircase(5)
    with Recorder(path) as rec:
        for s in snaps:
            rec.write(s)
    assert rec.count == 5
    with gzip.open(path, "rt") as f:
        assert len(f.readlines()) == 5
    assert [s.process.rss for s in read_recording(path)] == [s.process.rss for s in snaps]


def test_malformed_and_truncated(tmp_path):
    good = _line(jemalloc_snapshot())
    cases = {
        "truncated.jsonl": good + "\n" + good[: len(good) // 2],
        "garbage.jsonl": "hello\n",
        "notasnapshot.jsonl": json.dumps({"schema_version": 1, "pid": "x"}) + "\n",
        "wrongversion.jsonl": good.replace('"schema_version":1', '"schema_version":99') + "\n",
        "badnumber.jsonl": good.replace(f'"rss":{40 << 20}', '"rss":"40 MiB"') + "\n",
        "empty.jsonl": "",
        "list.jsonl": "[1,2]\n",
    }
    for name, text in cases.items():
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(MalformedData) as info:
            read_recording(p)
        assert name in str(info.value)
    with pytest.raises(MalformedData, match="line 2: truncated"):
        read_recording(tmp_path / "truncated.jsonl")
    with pytest.raises(MalformedData, match="garbage.jsonl: not a recording .*line 1 is not JSON"):
        read_recording(tmp_path / "garbage.jsonl")
    with pytest.raises(MalformedData, match="rss is not an integer"):
        read_recording(tmp_path / "badnumber.jsonl")
    # a gzip file cut off mid-stream
    gz = tmp_path / "cut.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        for s in staircase(20):
            f.write(_line(s) + "\n")
    data = gz.read_bytes()
    gz.write_bytes(data[: len(data) // 2])
    with pytest.raises(MalformedData, match="not a readable recording"):
        read_recording(gz)
    # not gzip at all, but named .gz
    bad = tmp_path / "plain.jsonl.gz"
    bad.write_text(good + "\n")
    with pytest.raises(MalformedData):
        read_recording(bad)


def test_record_this_process(tmp_path):
    # real sampling (diag.snapshot.take) of the test process itself
    path = tmp_path / "self.jsonl.gz"
    seen = []
    n = record(os.getpid(), path, interval=0.05, duration=0.15, no_attach=True,
               progress_cb=lambda count, snap: seen.append(count))
    assert n == len(seen) and n >= 2      # at least the first and one more
    snaps = read_recording(path)
    assert len(snaps) == n and all(s.pid == os.getpid() and s.process.rss for s in snaps)


def test_record_stops_when_the_process_exits(tmp_path):
    snaps = staircase(3)
    calls = iter(snaps)

    def sampler(pid):
        try:
            return next(calls)
        except StopIteration:
            raise NoSuchProcess(pid) from None

    assert record(4242, tmp_path / "r.jsonl", interval=0, sampler=sampler) == 3
    with pytest.raises(NoSuchProcess):
        record(4242, tmp_path / "r2.jsonl", interval=0,
               sampler=lambda pid: (_ for _ in ()).throw(NoSuchProcess(pid)))
