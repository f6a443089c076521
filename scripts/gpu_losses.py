#!/usr/bin/env python3
"""Step losses of braid-train runs against a reference run (issue 19).

Usage: gpu_losses.py REFERENCE.jsonl RUN.jsonl...

Each file is a --metrics file (one JSON object per step, rank 0's). For each
run, one line: the steps both have, the largest |loss - reference| and its
relative size, whether every loss is the same float, and the median tokens/s
of the run's steps after the first (which loads and warms up). A missing or
empty file is named as such; the exit status is 0 unless no reference.
"""
import json
import statistics
import sys
from pathlib import Path


def steps(path):
    """{step: record} of a metrics file; empty when it is missing."""
    out = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "step" in record and "loss" in record:
            out[record["step"]] = record
    return out


def compare(reference, run):
    common = sorted(set(reference) & set(run))
    if not common:
        return "no steps in common with the reference"
    diffs = [abs(run[s]["loss"] - reference[s]["loss"]) for s in common]
    worst = max(range(len(common)), key=lambda i: diffs[i])
    relative = diffs[worst] / max(abs(reference[common[worst]]["loss"]), 1e-30)
    same = all(run[s]["loss"] == reference[s]["loss"] for s in common)
    later = [run[s]["tokens_per_s"] for s in sorted(run) if s > 1 and "tokens_per_s" in run[s]]
    speed = f", {statistics.median(later):.0f} tok/s (median of steps 2..)" if later else ""
    return (f"{len(common)} steps, max |loss - reference| {diffs[worst]:.3g} at step {common[worst]} "
            f"({relative:.2g} relative){', every loss the same float' if same else ''}{speed}")


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    reference = steps(argv[1])
    if not reference:
        print(f"{Path(argv[1]).stem}: no steps (the reference run failed or was skipped)")
        return 1
    for path in argv[2:]:
        run = steps(path)
        name = Path(path).stem
        print(f"{name} vs {Path(argv[1]).stem}: {compare(reference, run) if run else 'no steps'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
