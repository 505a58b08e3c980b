#!/usr/bin/env python3
"""Summarises `learner eval --json` output (one suite per line, from stdin or
files): per suite, each method's total cost against the best heuristic's and
against `search`'s, and the worst task against the best heuristic's plan of
that task (the suite's best heuristic, and the best of all heuristics that
solved the task), with the tasks over 1 % behind each. With several suites,
a last row puts them together: percentages averaged over the suites, the
worst of the worst tasks, counts summed.

    learner eval --json --suite A.json --suite B.json --methods all --checkpoint RUN \
        | scripts/eval-summary.py [--method policy]
"""
import argparse
import json
import sys

HEURISTICS = {"random", "round_robin", "size", "dim", "lookup", "size_lookup", "torchrec"}


def pct(a, b):
    return (a / b - 1.0) * 100.0


def summarise(report, method):
    methods = report["methods"]
    if method not in methods:
        return None
    ours = methods[method]["per_task_ms"]
    best = report.get("best_heuristic")
    search = methods.get("search", {}).get("per_task_ms")
    heur = [m for m in methods if m in HEURISTICS]
    row = {"suite": report["suite"], "tasks": len(ours), "best_heuristic": best}
    if best:
        # The yardstick's row sits apart where it was not asked for.
        yardstick = methods.get(best) or report.get("reference")
        pairs = [(o, h) for o, h in zip(ours, yardstick["per_task_ms"]) if o and h]
        row["vs_best_heuristic"] = pct(sum(o for o, _ in pairs), sum(h for _, h in pairs))
        row["worst_task_vs_best_heuristic"] = max(pct(o, h) for o, h in pairs)
        row["tasks_over_1pct_vs_best_heuristic"] = sum(1 for o, h in pairs if pct(o, h) > 1.0)
    per_task_best = []
    for k, o in enumerate(ours):
        costs = [methods[m]["per_task_ms"][k] for m in heur if methods[m]["per_task_ms"][k]]
        if o and costs:
            per_task_best.append(pct(o, min(costs)))
    if per_task_best:
        row["worst_task_vs_any_heuristic"] = max(per_task_best)
        row["tasks_over_1pct_vs_any_heuristic"] = sum(1 for p in per_task_best if p > 1.0)
    if search:
        pairs = [(o, s) for o, s in zip(ours, search) if o and s]
        row["vs_search"] = pct(sum(o for o, _ in pairs), sum(s for _, s in pairs))
        row["mean_task_vs_search"] = sum(pct(o, s) for o, s in pairs) / max(1, len(pairs))
    row["failed"] = sum(1 for o in ours if o is None)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="eval --json outputs (default: stdin)")
    ap.add_argument("--method", default="policy")
    args = ap.parse_args()
    lines = []
    for f in args.files or ["-"]:
        stream = sys.stdin if f == "-" else open(f)
        lines += [l for l in stream if l.strip().startswith("{")]
    cols = ["vs_best_heuristic", "vs_search", "mean_task_vs_search", "worst_task_vs_best_heuristic",
            "tasks_over_1pct_vs_best_heuristic", "worst_task_vs_any_heuristic",
            "tasks_over_1pct_vs_any_heuristic", "failed"]
    print("| suite | best heuristic | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    rows = [r for r in (summarise(json.loads(line), args.method) for line in lines) if r]
    for row in rows:
        name = row["suite"].rsplit("/", 1)[-1]
        print(f"| {name} | {row['best_heuristic']} | " + cells(row, cols) + " |")
    if len(rows) > 1:
        tasks = sum(r["tasks"] for r in rows)
        print(f"| all: {len(rows)} suites, {tasks} tasks | | " + cells(overall(rows, cols), cols) + " |")


def overall(rows, cols):
    """The suites together: percentages averaged over suites (each suite
    weighs alike), worst tasks the worst, counts summed."""
    total = {}
    for c in cols:
        values = [r[c] for r in rows if r.get(c) is not None]
        if len(values) < len(rows):
            continue  # a column some suite lacks is left out, not averaged over the others
        if c.startswith("worst"):
            total[c] = max(values)
        elif isinstance(values[0], float):
            total[c] = sum(values) / len(values)
        else:
            total[c] = sum(values)
    return total


def cells(row, cols):
    out = []
    for c in cols:
        v = row.get(c)
        out.append("-" if v is None else (f"{v:+.2f} %" if isinstance(v, float) else str(v)))
    return " | ".join(out)


if __name__ == "__main__":
    main()
