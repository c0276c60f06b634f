"""plot.py on small hand-made hymbench reports: valid PNGs for one and two
runs, exit status 2 and a message naming the file and field for reports
that are not hymbench JSON."""

import json
import os
import struct
import subprocess
import sys
import tempfile

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _tmp():
    return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def _report(d, name, prefetch, gbps, group_by="turn"):
    groups = [{"label": "turn %d" % t, "key": t, "prefix_hit_ratio": 0.2 * t,
               "ceiling_hit_ratio": 0.2 * t + 0.05, "load_gbps": g}
              for t, g in enumerate(gbps)]
    doc = {"config": {"prefetch": prefetch, "workload": "/x/trace.jsonl",
                      "block_bytes": "262144"},
           "group_by": group_by, "wall_seconds": 1.0, "groups": groups,
           "overall": groups[-1]}
    path = os.path.join(d, name)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def _run(*args):
    # Debian's interpreter, as hymbench runs it (the PATH python3 may lack
    # matplotlib).
    return subprocess.run(["/usr/bin/python3", SCRIPT] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_two_runs_write_valid_pngs():
    d = _tmp()
    on = _report(d, "on.json", "true", [1.0, 2.0, 3.0])
    off = _report(d, "off.json", "false", [0.5, 1.0, 1.5])
    out = os.path.join(d, "plots")
    r = _run("--out=" + out, on, off)
    assert r.returncode == 0, r.stderr
    for name in ("hymbench_hit_ratio.png", "hymbench_load_gbps.png"):
        w, h = _png_size(os.path.join(out, name))
        assert (w, h) == (512, 320)
        assert name in r.stderr


def test_labels_from_config():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import plot
    d = _tmp()
    on = plot.load_report(_report(d, "a.json", "true", [1.0]))
    off = plot.load_report(_report(d, "b.json", "false", [1.0]))
    assert plot.labels([on, off]) == ["prefetch on", "prefetch off"]
    # Same mode and workload twice: the file names tell them apart.
    again = plot.load_report(_report(d, "c.json", "true", [1.0]))
    assert plot.labels([on, again]) == ["prefetch on (a.json)", "prefetch on (c.json)"]


def test_window_reports_plot_too():
    d = _tmp()
    r = _run("--out=" + d, _report(d, "w.json", "true", [1.0, 2.0], group_by="window"))
    assert r.returncode == 0, r.stderr
    _png_size(os.path.join(d, "hymbench_load_gbps.png"))


@pytest.mark.parametrize("content,message", [
    ("{not json", "not JSON"),
    ("[1, 2]", "want a JSON object"),
    ('{"requests": 3, "hits": 1}', '"groups" missing'),
    ('{"groups": [{"key": 0, "prefix_hit_ratio": 0.5, "ceiling_hit_ratio": 0.5}]}',
     'groups[0]: no "load_gbps"'),
    ('{"groups": [{"key": 0, "prefix_hit_ratio": "x", "ceiling_hit_ratio": 0.5,'
     ' "load_gbps": 1}]}', "groups[0].prefix_hit_ratio: want a finite number"),
])
def test_malformed_report_exits_2_with_a_clear_message(content, message):
    d = _tmp()
    bad = os.path.join(d, "bad.json")
    with open(bad, "w") as f:
        f.write(content)
    out = os.path.join(d, "plots")
    r = _run("--out=" + out, bad)
    assert r.returncode == 2
    assert bad in r.stderr and message in r.stderr, r.stderr
    assert not os.path.exists(out)


def test_missing_file_and_bad_usage_exit_2():
    d = _tmp()
    r = _run("--out=" + d, os.path.join(d, "nope.json"))
    assert r.returncode == 2 and "cannot read" in r.stderr
    assert _run(os.path.join(d, "x.json")).returncode == 2  # no --out


def test_unwritable_out_dir_exits_1():
    d = _tmp()
    blocker = os.path.join(d, "file")
    open(blocker, "w").close()
    r = _run("--out=" + os.path.join(blocker, "sub"), _report(d, "a.json", "true", [1.0]))
    assert r.returncode == 1 and "cannot write plots" in r.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"] + sys.argv[1:]))
