#!/usr/bin/env python3
"""Compares two runs' logging.jsonl files step by step.

usage: compare_losses.py REFERENCE.jsonl OTHER.jsonl STEPS MAX_RELATIVE_DIFFERENCE
Exits 0 when both hold STEPS steps and every step's loss is within the relative difference of the
reference's, printing the largest difference; 1 otherwise.
"""
import json
import sys


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f]


def main():
    reference, other, steps, tolerance = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    a, b = losses(reference), losses(other)
    if len(a) != steps or len(b) != steps:
        print(f"expected {steps} steps in each, got {len(a)} and {len(b)}")
        return 1
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    print(f"max relative loss difference {worst:.2e} over {steps} steps")
    return 0 if worst <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
