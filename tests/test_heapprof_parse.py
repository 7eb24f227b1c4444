"""Parser tests on real captured profiles (gperftools HEAPPROFILE dump and jemalloc
prof_final dump of python3), plus a bounded fuzz: truncation and byte flips must give
MalformedData or a valid result, never another exception."""
import random
from pathlib import Path

import pytest

from collectors.errors import MalformedData
from collectors.heapprofile import parse

FIX = Path(__file__).parent / "fixtures"
FILES = ["heap-jemalloc-python.heap", "heap-tcmalloc-python.heap"]


@pytest.mark.parametrize("name", FILES)
def test_real_profile_parses(name):
    p = parse((FIX / name).read_bytes())
    assert p.samples and p.mappings
    assert all(s.stack for s in p.samples)
    if p.format == "heapprofile":
        # unsampled: the sample rows sum exactly to the header
        assert sum(s.inuse_bytes for s in p.samples) == p.totals[1]
    else:
        assert all(0 in s.threads or s.threads for s in p.samples)


@pytest.mark.parametrize("name", FILES)
def test_fuzz(name):
    base = (FIX / name).read_bytes()
    rng = random.Random(10)
    for _ in range(300):
        data = bytearray(base)
        if rng.random() < 0.5:
            data = data[: rng.randrange(len(data))]
        for _ in range(rng.randrange(1, 8)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            p = parse(bytes(data))
        except MalformedData:
            continue
        assert isinstance(p.samples, list)
