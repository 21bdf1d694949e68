"""Benchmark: peak memory of the plain-text and CoNLL loaders in memory and spilled to disk, and
the Stack Exchange parser's time on one huge attribute (linear: doubling it doubles the time).
Not part of the test suite; run it by hand:

    .venv/bin/python benchmarks/loader_memory.py            # 30 MB files, attributes of 8 and 16 MB
    .venv/bin/python benchmarks/loader_memory.py --mb 100

Files are built in a temporary folder by repeating bundled data (WNUT-17 for CoNLL, Shakespeare
for text). Each load runs in a fresh process, so its peak resident memory (``ru_maxrss``) is its
own; a bare process that imports the loader is measured too, and the ratios printed are of the
file size and of each other, measured in this one run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, resource, sys, time
kind, path, spill = sys.argv[1], sys.argv[2], (sys.argv[3] or None)
t = time.process_time()
if kind == "none":
    import fedpriv.data.conll, fedpriv.data.text, fedpriv.data.stackexchange  # the imports alone
    n = 0
elif kind == "text":
    from fedpriv.data.text import load_text
    n = load_text(path, spill_to=spill).num_examples
elif kind == "conll":
    from fedpriv.data.conll import load_conll
    n = load_conll(path, spill_to=spill).num_examples
else:
    from fedpriv.data.stackexchange import load_stackexchange
    n = load_stackexchange(path).num_examples
print(json.dumps({"examples": n, "cpu_s": time.process_time() - t, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def grow(src: Path, dest: Path, mb: float) -> Path:
    """``dest``: ``src`` repeated (blank line between copies) up to ``mb`` megabytes."""
    chunk = src.read_bytes().rstrip(b"\n") + b"\n\n"
    with open(dest, "wb") as f:
        for _ in range(max(1, int(mb * 2**20 / len(chunk)))):
            f.write(chunk)
    return dest


def huge_attribute(dest: Path, mb: float) -> Path:
    body = "word " * int(mb * 2**20 / 5)
    dest.write_text(f'<?xml version="1.0" encoding="utf-8"?>\n<posts>\n  <row Id="1" PostTypeId="1" OwnerUserId="7" Title="A long post" Body="{body}" />\n</posts>\n')
    return dest


def run(kind: str, path: Path | str, spill: Path | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(path), str(spill or "")], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=30.0, help="size of the text and CoNLL files (MB)")
    ap.add_argument("--attribute-mb", type=float, default=8.0, help="the smaller of the two huge attributes (MB)")
    args = ap.parse_args()
    base = run("none", "")
    print(f"a process that imports the loaders: {base['peak_mb']:.0f} MB")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        files = {
            "text": grow(ROOT / "fedpriv" / "_bundled" / "tinyshakespeare.txt", d / "big.txt", args.mb),
            "conll": grow(ROOT / "tests" / "data" / "wnut17" / "wnut17train.conll", d / "big.conll", args.mb),
        }
        for kind, path in files.items():
            size = path.stat().st_size / 2**20
            mem = run(kind, path)
            disk = run(kind, path, d / f"{kind}.sqlite")
            assert mem["examples"] == disk["examples"]
            print(
                f"{kind}: {size:.0f} MB file, {mem['examples']:,} examples; in memory {mem['peak_mb']:.0f} MB peak "
                f"({(mem['peak_mb'] - base['peak_mb']) / size:.1f}x the file above the bare process), {mem['cpu_s']:.1f} s CPU; "
                f"spill_to {disk['peak_mb']:.0f} MB peak ({(disk['peak_mb'] - base['peak_mb']) / size:.1f}x), {disk['cpu_s']:.1f} s; "
                f"spilled/in-memory peak {disk['peak_mb'] / mem['peak_mb']:.2f}"
            )
        small = run("xml", huge_attribute(d / "a.xml", args.attribute_mb))
        large = run("xml", huge_attribute(d / "b.xml", 2 * args.attribute_mb))
        print(
            f"Stack Exchange, one Body attribute of {args.attribute_mb:g} and {2 * args.attribute_mb:g} MB: {small['cpu_s']:.2f} and "
            f"{large['cpu_s']:.2f} s CPU, ratio {large['cpu_s'] / small['cpu_s']:.2f} (2 is linear, 4 quadratic)"
        )


if __name__ == "__main__":
    main()
