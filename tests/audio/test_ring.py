"""PcmRing: wrap-around, partial writes and reads, discard, one producer thread against one consumer."""

from __future__ import annotations

import sys
import threading

import numpy as np

from edged.audio.ring import PcmRing


def test_wraps_and_reports_partial():
    ring = PcmRing(8)
    data = np.arange(1, 13, dtype=np.float32)
    assert ring.write(data) == 8
    assert ring.write(data) == 0
    out = np.zeros(5, dtype=np.float32)
    assert ring.read_into(out) == 5
    assert out.tolist() == [1, 2, 3, 4, 5]
    assert ring.write(data[8:]) == 4  # wraps: slots 0..3
    assert ring.discard(1) == 1  # drops 6
    out = np.zeros(10, dtype=np.float32)
    assert ring.read_into(out) == 6
    assert out[:6].tolist() == [7, 8, 9, 10, 11, 12]
    assert ring.available() == 0 and ring.free() == 8
    assert ring.read == ring.written == 12


def test_one_producer_one_consumer_threads():
    """Every sample arrives once, in order, with both sides racing on a small ring."""
    ring = PcmRing(257)
    total = 40_000
    source = (np.arange(total) % 65_521).astype(np.float32)
    got = np.zeros(total, dtype=np.float32)

    def produce():
        i = 0
        while i < total:
            i += ring.write(source[i:i + 100])

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the two sides finely
    try:
        producer = threading.Thread(target=produce)
        producer.start()
        out = np.zeros(64, dtype=np.float32)
        j = 0
        while j < total:
            n = ring.read_into(out)
            got[j:j + n] = out[:n]
            j += n
        producer.join()
    finally:
        sys.setswitchinterval(switch)
    assert np.array_equal(got, source)
