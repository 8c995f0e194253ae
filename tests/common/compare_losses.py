#!/usr/bin/env python3
"""Compares two runs' logging.jsonl files step by step.

usage: compare_losses.py REFERENCE.jsonl OTHER.jsonl STEPS MAX_RELATIVE_DIFFERENCE [FIRST]
Exits 0 when both hold STEPS steps and every step's loss (or, with FIRST, each of the first FIRST
steps') is within the relative difference of the reference's, printing the largest difference; 1
otherwise.
"""
import json
import sys


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f]


def main():
    reference, other, steps, tolerance = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    first = int(sys.argv[5]) if len(sys.argv) > 5 else steps
    a, b = losses(reference), losses(other)
    if len(a) != steps or len(b) != steps:
        print(f"expected {steps} steps in each, got {len(a)} and {len(b)}")
        return 1
    if not 0 < first <= steps:
        print(f"FIRST must be 1-{steps}, got {first}")
        return 2
    worst = max(abs(x - y) / abs(x) for x, y in zip(a[:first], b[:first]))
    print(f"max relative loss difference {worst:.2e} over the first {first} of {steps} steps")
    return 0 if worst <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
