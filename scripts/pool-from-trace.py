#!/usr/bin/env python3
"""Derive embshard's pool CSV from a trace of embedding lookups.

The trace is a PyTorch file holding one batch of lookups for T tables, laid
out as Meta's dlrm_datasets are (fbgemm_t856_bs65536.pt): a tuple
(indices, offsets, lengths), or a dict with those keys, where
  lengths  [T, B]   lookups of each table for each of the B samples,
  offsets  [T*B+1]  where each (table, sample) bag starts in indices
                    (table-major; T*B entries, without the final one, also
                    accepted),
  indices  [N]      the rows looked up, N = offsets[-1].

For each table it writes one pool CSV line (README, "File formats"): rows =
max(--min-rows, largest index + 1) unless --tables gives the real hash size,
pooling_factor = mean lookups per sample, bin_k = share of the table's
unique rows looked up (2^(k-1), 2^k] times in the batch (bin_0: once,
bin_16: more than 32768): DreamShard's recipe. The trace holds no embedding
dimensions: give them with --dim (all tables) or --tables.

Usage:
  .venv/bin/python scripts/pool-from-trace.py TRACE.pt --dim 16 --out pool.csv
  .venv/bin/python scripts/pool-from-trace.py TRACE.pt --tables tables.csv --out pool.csv

--tables FILE is a CSV with the columns `name`, `rows` and `dim` (any order,
other columns ignored, so `learner plan`'s own CSV will do) and one line per
table in the trace's order (the names and sizes of your model's tables, say
from its EmbeddingBagCollection config); an empty rows field takes the
trace's. Then put the pool in a configuration (`[data] pool = "pool.csv"`)
and `learner generate` splits it and draws the task suites from it, or
place its tables with a trained model (`learner plan --tables pool.csv`).

Needs PyTorch (the project's .venv has it after scripts/setup.sh).
"""

import argparse
import csv
import os
import sys
import warnings

# torch warns at import when numpy is missing; nothing here needs numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

NUM_BINS = 17
# Accepted by embshard's pool reader (common/src/pool.rs).
MAX_ROWS = 1 << 40
MAX_DIM = 1 << 16
MAX_POOLING = 1e5


class TraceError(Exception):
    """A fault in the user's files, named with the file."""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="pool-from-trace.py",
        description=__doc__.split("\n\n")[0],
        epilog="See the module text (head of this file) and README.md, 'Your own tables'.",
    )
    p.add_argument("trace", help="PyTorch file: (indices, offsets, lengths) as in dlrm_datasets")
    p.add_argument("--out", required=True, help="pool CSV to write (replaced whole, or not at all)")
    sizes = p.add_mutually_exclusive_group(required=True)
    sizes.add_argument("--dim", type=int, help="embedding dimension of every table")
    sizes.add_argument(
        "--tables",
        help="CSV with columns name, rows and dim (any order, others ignored), one line per "
        "table in the trace's order (rows may be empty)",
    )
    p.add_argument(
        "--prefix",
        default="t",
        help="with --dim: tables are named PREFIX0, PREFIX1, … (default: t)",
    )
    p.add_argument(
        "--min-rows",
        type=int,
        default=100,
        help="smallest hash size derived from a trace (default: 100, DreamShard's)",
    )
    args = p.parse_args(argv)
    if args.dim is not None and not 1 <= args.dim <= MAX_DIM:
        p.error(f"--dim {args.dim}: must lie in 1..={MAX_DIM}")
    if not 1 <= args.min_rows <= MAX_ROWS:
        p.error(f"--min-rows {args.min_rows}: must lie in 1..={MAX_ROWS}")
    return args


def load_trace(path):
    """The trace's (indices, offsets, lengths) as int64 tensors, checked."""
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file")
    except Exception as e:  # pickle, zip or tensor errors: name the file.
        # torch's own advice (load with weights_only=False) is not one this
        # script takes: a trace holds tensors only.
        first = (str(e).strip().splitlines() or [""])[0]
        detail = type(e).__name__ + ("" if "weights_only" in str(e) or not first else f": {first}")
        raise TraceError(
            f"{path}: not a lookup trace this script reads ({detail}); it reads a file of "
            "torch.save((indices, offsets, lengths)), tensors only, or of a dict of those three "
            "(scripts/synthetic-trace.py writes one)"
        )
    if isinstance(data, dict):
        missing = [k for k in ("indices", "offsets", "lengths") if k not in data]
        if missing:
            raise TraceError(f"{path}: a dict without {', '.join(missing)}")
        data = (data["indices"], data["offsets"], data["lengths"])
    if not isinstance(data, (tuple, list)) or len(data) != 3:
        raise TraceError(
            f"{path}: expected (indices, offsets, lengths), found {type(data).__name__}"
            + (f" of {len(data)}" if isinstance(data, (tuple, list)) else "")
        )
    named = dict(zip(("indices", "offsets", "lengths"), data))
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TraceError(f"{path}: {name} is a {type(t).__name__}, not a tensor")
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TraceError(f"{path}: {name} holds {t.dtype}, not integers")
    indices, offsets, lengths = (named[k].to(torch.int64) for k in ("indices", "offsets", "lengths"))
    if indices.dim() != 1 or offsets.dim() != 1:
        raise TraceError(
            f"{path}: indices and offsets must be 1-D (found {indices.dim()}-D and {offsets.dim()}-D)"
        )
    if lengths.dim() != 2 or lengths.shape[0] == 0 or lengths.shape[1] == 0:
        raise TraceError(
            f"{path}: lengths must be [tables, batch], found shape {list(lengths.shape)}"
        )
    tables, batch = lengths.shape
    if offsets.numel() == tables * batch:
        offsets = torch.cat([offsets, torch.tensor([indices.numel()], dtype=torch.int64)])
    if offsets.numel() != tables * batch + 1:
        raise TraceError(
            f"{path}: offsets has {offsets.numel()} entries; lengths [{tables}, {batch}] needs "
            f"{tables * batch + 1} (or {tables * batch})"
        )
    steps = offsets[1:] - offsets[:-1]
    if int(offsets[0]) != 0 or bool((steps < 0).any()):
        raise TraceError(f"{path}: offsets must start at 0 and never decrease")
    if int(offsets[-1]) != indices.numel():
        raise TraceError(
            f"{path}: offsets end at {int(offsets[-1])} but indices has {indices.numel()} entries"
        )
    if not torch.equal(steps, lengths.reshape(-1)):
        bad = int((steps != lengths.reshape(-1)).nonzero()[0])
        raise TraceError(
            f"{path}: lengths[{bad // batch}][{bad % batch}] = {int(lengths.reshape(-1)[bad])} but "
            f"offsets give that bag {int(steps[bad])} lookups"
        )
    if indices.numel() and int(indices.min()) < 0:
        raise TraceError(f"{path}: indices holds a negative row ({int(indices.min())})")
    return indices, offsets, lengths


def read_tables(path, count):
    """(name, rows or None, dim) per table from a CSV with columns `name`,
    `rows` and `dim`, in any order (headers as `learner plan` reads them:
    any case, padded, TorchRec's names). Other columns (a pool's
    pooling_factor or bins, say) are ignored: the trace gives those."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            lines = list(csv.reader(f))
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror}")
    lines = [(n, r) for n, r in enumerate(lines, 1) if any(c.strip() for c in r)]
    # TorchRec's EmbeddingBagConfig names, as `learner plan` reads them.
    aliases = {"num_embeddings": "rows", "embedding_dim": "dim"}
    at_line, header = lines[0] if lines else (1, [])
    header = [aliases.get(c, c) for c in (c.strip().lower() for c in header)]
    missing = [c for c in ("name", "rows", "dim") if c not in header]
    if missing:
        raise TraceError(
            f"{path}:{at_line}: the header needs the columns `name`, `rows` (or `num_embeddings`) "
            f"and `dim` (or `embedding_dim`), in any order; missing: "
            + ", ".join(f"`{c}`" for c in missing)
        )
    twice = [c for c in ("name", "rows", "dim") if header.count(c) > 1]
    if twice:
        raise TraceError(
            f"{path}:{at_line}: the header has `{twice[0]}` twice (or with its alias)"
        )
    at = {c: header.index(c) for c in ("name", "rows", "dim")}
    out, seen = [], set()
    for n, row in lines[1:]:
        if len(row) != len(header):
            raise TraceError(
                f"{path}:{n}: expected {len(header)} fields, as the header has, found {len(row)}"
            )
        name, rows, dim = (row[at[c]].strip() for c in ("name", "rows", "dim"))
        if not name:
            raise TraceError(f"{path}:{n}: field `name`: empty")
        if name in seen:
            raise TraceError(f"{path}:{n}: field `name`: duplicate table name `{name}`")
        seen.add(name)
        rows = positive_int(path, n, "rows", rows, MAX_ROWS, empty_ok=True)
        dim = positive_int(path, n, "dim", dim, MAX_DIM)
        out.append((name, rows, dim))
    if len(out) != count:
        raise TraceError(f"{path}: {len(out)} tables, but the trace has {count}")
    return out


def positive_int(path, line, field, text, largest, empty_ok=False):
    if empty_ok and text == "":
        return None
    try:
        v = int(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: field `{field}`: `{text}` is not an integer")
    if not 1 <= v <= largest:
        raise TraceError(f"{path}:{line}: field `{field}`: {v} must lie in 1..={largest}")
    return v


def table_stats(indices, batch):
    """(largest index + 1, pooling factor, 17 bin shares, unique rows, used once)."""
    import torch

    if indices.numel() == 0:
        return 0, 0.0, None, 0, 0
    counts = torch.unique(indices, return_counts=True)[1]
    # Bin k holds counts in (2^(k-1), 2^k]: the first boundary at or above.
    bounds = torch.tensor([1 << k for k in range(NUM_BINS - 1)], dtype=counts.dtype)
    bins = torch.bucketize(counts, bounds, right=False).bincount(minlength=NUM_BINS)
    shares = (bins.double() / counts.numel()).tolist()
    once = int(bins[0])
    return int(indices.max()) + 1, indices.numel() / batch, shares, counts.numel(), once


def write_pool(path, lines):
    """Writes the CSV whole or not at all (a temporary file, then renamed)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["name", "rows", "dim", "pooling_factor"] + [f"bin_{k}" for k in range(NUM_BINS)])
            w.writerows(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise TraceError(f"{path}: cannot write ({e.strerror})")


def main(argv):
    args = parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print(
            "pool-from-trace: PyTorch is not installed for this python; run it with the "
            "project's .venv/bin/python (scripts/setup.sh makes it)",
            file=sys.stderr,
        )
        return 1
    try:
        # Imported now, under the filter above: torch.load imports it later
        # and would warn there that numpy is missing (absent from some
        # torch versions: nothing to quiet then).
        import torch._subclasses.functional_tensor  # noqa: F401
    except ImportError:
        pass
    try:
        indices, offsets, lengths = load_trace(args.trace)
        tables, batch = lengths.shape
        given = (
            read_tables(args.tables, tables)
            if args.tables
            else [(f"{args.prefix}{t}", None, args.dim) for t in range(tables)]
        )
        lines, empty, lookups, unique, once = [], [], 0, 0, 0
        for t, (name, rows, dim) in enumerate(given):
            start, end = int(offsets[t * batch]), int(offsets[(t + 1) * batch])
            top, pooling, shares, u, o = table_stats(indices[start:end], batch)
            if rows is None:
                rows = max(args.min_rows, top)
                if rows > MAX_ROWS:
                    raise TraceError(f"{args.trace}: table {name} looks up row {top - 1}, beyond 2^40")
            elif top > rows:
                raise TraceError(
                    f"{args.tables}: table {name} has {rows} rows, but the trace looks up row {top - 1}"
                )
            if shares is None:
                # No lookup in the batch: one, so that the table is kept
                # (it still takes memory) and the pool reader takes it.
                empty.append(name)
                pooling, shares = 1.0 / batch, [1.0] + [0.0] * (NUM_BINS - 1)
            if pooling > MAX_POOLING:
                raise TraceError(f"{args.trace}: table {name} has {pooling:g} lookups per sample, above {MAX_POOLING:g}")
            lookups += end - start
            unique += u
            once += o
            lines.append([name, rows, dim, f"{pooling:.8g}"] + [f"{s:.6g}" for s in shares])
        write_pool(args.out, lines)
    except TraceError as e:
        print(f"pool-from-trace: {e}", file=sys.stderr)
        return 1
    if empty:
        shown = ", ".join(empty[:10]) + (f" and {len(empty) - 10} more" if len(empty) > 10 else "")
        print(
            f"pool-from-trace: {len(empty)} table(s) with no lookup in the trace ({shown}): "
            f"written with one lookup per batch",
            file=sys.stderr,
        )
    print(f"wrote {args.out}: {tables} tables")
    print(f"  batch                  {batch}")
    print(f"  lookups per batch      {lookups}")
    print(f"  mean pooling factor    {lookups / (tables * batch):.2f}")
    print(f"  unique rows per batch  {unique}")
    if unique:
        print(f"  unique rows used once  {100.0 * once / unique:.1f}%")
    if batch != 65536:
        print(
            f"  note: the reuse bins are for batches of {batch} samples; embshard's default "
            f"configuration models batches of 65536 ([sim] and [generate] batch)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
