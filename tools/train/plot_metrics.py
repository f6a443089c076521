#!/usr/bin/python3
"""Plots a braid-train --metrics file as one PNG.

    /usr/bin/python3 tools/train/plot_metrics.py METRICS.jsonl [OUT.png]

Three panels against the step: training loss with the validation loss at the
evaluation steps, tokens/s, and the time blocked in communication per step
(comm_wait_ms; under --tp / --pp also the mesh's tp_comm_ms and pp_comm_ms).
OUT defaults to METRICS with .png in place of its suffix. Needs Debian's
python3-matplotlib. Exit status: 0 written, 2 a missing, empty or malformed
metrics file, 3 matplotlib missing.
"""
import json
import os
import sys


def fail(message, status=2):
    print(f"plot_metrics: error: {message}", file=sys.stderr)
    sys.exit(status)


def read_lines(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{path} line {number} is not JSON ({e.msg}); pass a braid-train --metrics file")
        if not isinstance(row, dict) or "step" not in row or "loss" not in row:
            fail(f"{path} line {number} has no step and loss; pass a braid-train --metrics file")
        rows.append(row)
    if not rows:
        fail(f"{path} holds no metrics lines")
    return rows


def series(rows, key, source=None):
    points = [(r["step"], (source(r) if source else r).get(key)) for r in rows]
    return [s for s, v in points if v is not None], [v for s, v in points if v is not None]


def plot(rows, title, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is missing: apt-get install python3-matplotlib", 3)
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    loss, tput, wait = axes
    loss.plot(*series(rows, "loss"), label="train loss")
    val_steps, val = series(rows, "val_loss")
    if val:
        loss.plot(val_steps, val, "o-", label="val loss")
    loss.set_ylabel("loss")
    loss.legend()
    tput.plot(*series(rows, "tokens_per_s"))
    tput.set_ylabel("tokens/s")
    wait.plot(*series(rows, "comm_wait_ms"), label="DP comm wait")
    for key, label in (("tp_comm_ms", "TP all-reduce wait"), ("pp_comm_ms", "PP send/recv wait")):
        steps, values = series(rows, key, lambda r: r.get("mesh", {}))
        if values:
            wait.plot(steps, values, label=label)
    wait.set_ylabel("ms per step")
    wait.set_xlabel("step")
    wait.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=100)


def main(argv):
    if len(argv) not in (2, 3) or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 0 if len(argv) == 2 and argv[1] in ("-h", "--help") else 2
    path = argv[1]
    out = argv[2] if len(argv) == 3 else os.path.splitext(path)[0] + ".png"
    rows = read_lines(path)
    plot(rows, f"{os.path.basename(path)}: steps {rows[0]['step']}..{rows[-1]['step']}", out)
    print(f"wrote {out} ({len(rows)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
