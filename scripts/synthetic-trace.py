#!/usr/bin/env python3
"""Write a synthetic lookup trace, laid out as Meta's dlrm_datasets are.

What it is for: trying `scripts/pool-from-trace.py` and `learner plan` on
tables shaped like a real trace's, without one. docs/results.md ("Tables
from a lookup trace") measures `plan` on such traces.

Each table looks up a hot set of rows uniformly. The hot set holds about
lookups / 2^c rows, with c drawn per table between --reuse-lo and
--reuse-hi. So every hot row is looked up about 2^c times in the batch:
the reuse bins sit in the middle buckets and bin_0 is near 0, as in traces
of production models. Pooling (mean lookups per sample) is log-normal.
Hash sizes are log-uniform, never below the hot set. Dims are multiples of
4 between --dim-lo and --dim-hi.

Writes TRACE.pt, a tuple (indices, offsets, lengths) as
`scripts/pool-from-trace.py` reads it, and TRACE.tables.csv
(`name,rows,dim`, its --tables file).

Usage:
  .venv/bin/python scripts/synthetic-trace.py --tables 40 --seed 0 --out /tmp/t0.pt
  .venv/bin/python scripts/pool-from-trace.py /tmp/t0.pt --tables /tmp/t0.tables.csv --out /tmp/t0.csv

Needs PyTorch (the project's .venv has it after scripts/setup.sh).
"""

import argparse
import math
import os
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="synthetic-trace.py",
        description=__doc__.split("\n\n")[0],
        epilog="See the module text (head of this file).",
    )
    p.add_argument("--out", required=True, help="trace file to write (.pt)")
    p.add_argument("--tables", type=int, default=40, help="tables in the trace (40)")
    p.add_argument("--batch", type=int, default=65536, help="samples in the batch (65536)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix", default="t", help="table names are PREFIX0, PREFIX1, … (t)")
    p.add_argument("--pooling-median", type=float, default=8.0, help="median lookups per sample (8)")
    p.add_argument("--pooling-sigma", type=float, default=1.2, help="σ of log pooling (1.2)")
    p.add_argument("--max-pooling", type=float, default=100.0, help="pooling cap (100)")
    p.add_argument("--reuse-lo", type=float, default=3.0, help="least log2 lookups per hot row (3)")
    p.add_argument("--reuse-hi", type=float, default=9.0, help="most log2 lookups per hot row (9)")
    p.add_argument("--dim-lo", type=int, default=16, help="smallest dim (16)")
    p.add_argument("--dim-hi", type=int, default=32, help="largest dim (32)")
    p.add_argument("--rows-hi", type=float, default=1e7, help="largest hash size (1e7)")
    a = p.parse_args(argv)
    if a.tables < 1 or a.batch < 1:
        p.error("--tables and --batch must be positive")
    if not 0 <= a.reuse_lo <= a.reuse_hi <= 16:
        p.error("need 0 <= --reuse-lo <= --reuse-hi <= 16")
    if not 4 <= a.dim_lo <= a.dim_hi or (a.dim_lo + 3) // 4 > a.dim_hi // 4:
        p.error("need 4 <= --dim-lo <= --dim-hi, with a multiple of 4 between them")
    if a.pooling_median <= 0 or a.max_pooling <= 0:
        p.error("pooling must be positive")
    folder = os.path.dirname(os.path.abspath(a.out))
    if not os.path.isdir(folder):
        p.error(f"--out {a.out}: no folder {folder}")
    return a


def main(argv):
    a = parse_args(argv)
    import torch

    g = torch.Generator().manual_seed(a.seed)

    def uniform(lo, hi):
        return lo + (hi - lo) * torch.rand((), generator=g).item()

    lengths, indices, tables = [], [], []
    for t in range(a.tables):
        pooling = min(a.max_pooling, a.pooling_median * math.exp(a.pooling_sigma * torch.randn((), generator=g).item()))
        # Bag sizes: Poisson around the pooling, so some bags are empty.
        bags = torch.poisson(torch.full((a.batch,), pooling), generator=g).long()
        lookups = int(bags.sum())
        hot = max(1, round(lookups / 2 ** uniform(a.reuse_lo, a.reuse_hi)))
        rows = max(hot, round(10 ** uniform(math.log10(max(hot, 100)), math.log10(max(a.rows_hi, hot)))))
        # The hot rows are spread over the hash space.
        hot_rows = torch.randperm(rows, generator=g)[:hot] if rows <= 1 << 24 else torch.randint(rows, (hot,), generator=g)
        indices.append(hot_rows[torch.randint(hot, (lookups,), generator=g)])
        lengths.append(bags)
        # A multiple of 4 within [--dim-lo, --dim-hi].
        dim = 4 * round(uniform(a.dim_lo, a.dim_hi) / 4)
        dim = min(max(dim, 4 * ((a.dim_lo + 3) // 4)), 4 * (a.dim_hi // 4))
        tables.append((f"{a.prefix}{t}", rows, dim))
    lengths = torch.stack(lengths)
    flat = lengths.flatten()
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), flat.cumsum(0)])
    torch.save((torch.cat(indices), offsets, lengths), a.out)
    stem = a.out[:-3] if a.out.endswith(".pt") else a.out
    with open(stem + ".tables.csv", "w") as f:
        f.write("name,rows,dim\n")
        for name, rows, dim in tables:
            f.write(f"{name},{rows},{dim}\n")
    print(f"wrote {a.out} ({a.tables} tables, batch {a.batch}, {int(flat.sum())} lookups) and {stem}.tables.csv")


if __name__ == "__main__":
    main(sys.argv[1:])
