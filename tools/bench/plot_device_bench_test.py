"""plot_device_bench.py on a small hand-made device_bench JSON: valid PNGs,
and exit status 2 with a message naming the file and field for a file that
is not device_bench JSON."""

import json
import os
import struct
import subprocess
import sys
import tempfile

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot_device_bench.py")


def _tmp():
    return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def _bench(d, modes=("staging", "staging_writer", "lru")):
    def turns(scale):
        return [{"turn": t, "read_bytes": 1 << 20, "read_gbps": scale * t,
                 "hit_ratio": 0.1 * t, "append_seconds": 0.01} for t in range(1, 5)]
    doc = {"config": {"conversations": 2, "block_bytes": 1048576, "engine": "io_uring"},
           "raw_gbps": 3.5, "raw_writer_gbps": 2.5,
           "modes": {m: {"read_gbps": 1.0, "hit_ratio": 0.5, "turns": turns(0.5 + i)}
                     for i, m in enumerate(modes)}}
    path = os.path.join(d, "bench.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def _run(*args):
    return subprocess.run(["/usr/bin/python3", SCRIPT] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_writes_valid_pngs():
    d = _tmp()
    out = os.path.join(d, "plots")
    r = _run("--out=" + out, _bench(d))
    assert r.returncode == 0, r.stderr
    for name in ("device_bench_load_gbps.png", "device_bench_hit_ratio.png"):
        with open(os.path.join(out, name), "rb") as f:
            head = f.read(24)
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
        assert struct.unpack(">II", head[16:24]) == (512, 320)


def test_reads_the_fields_device_bench_writes():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import plot_device_bench as p
    b = p.load_bench(_bench(_tmp()))
    assert b["raw_gbps"] == 3.5 and b["raw_writer_gbps"] == 2.5
    assert sorted(b["modes"]) == ["lru", "staging", "staging_writer"]
    assert b["modes"]["lru"][0] == (1.0, 2.5, 0.1)
    assert p._style("staging_writer")[2] == "--"


@pytest.mark.parametrize("content,message", [
    ("", "not JSON"),
    ('{"groups": []}', 'no "modes" object'),
    ('{"modes": {"lru": {"read_gbps": 1}}}', 'modes.lru: no "turns" list'),
    ('{"modes": {"lru": {"turns": [{"turn": 1, "read_gbps": 1}]}}}',
     'modes.lru.turns[0]: no "hit_ratio"'),
    ('{"raw_gbps": "fast", "modes": {}}', "raw_gbps: want a finite number"),
    ('{"modes": {}}', "neither per-turn modes nor raw_gbps"),
])
def test_malformed_exits_2_with_a_clear_message(content, message):
    d = _tmp()
    bad = os.path.join(d, "bad.json")
    with open(bad, "w") as f:
        f.write(content)
    r = _run("--out=" + os.path.join(d, "plots"), bad)
    assert r.returncode == 2
    assert bad in r.stderr and message in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(d, "plots"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"] + sys.argv[1:]))
