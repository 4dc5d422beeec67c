"""Class mix per row group in hashed order when one file name is in every class (issue 28 item 7).

    python -m benchmarks.bench_same_names [--classes 200] [--per-class 20] [--group 100]

A folder tree of --classes classes, each holding the same --per-class file names 0001.jpg, 0002.jpg, ...; the
manifest (sorted by class, name) is put in hashed order by the rule before the class tie (order_hash(name), then
manifest order) and by `tasks.convert.plan.ordered` (order_hash(name), then class_tie(class)); per row group of
--group rows it prints distinct classes (mean, min), the spread of the labels in it (standard deviation; a uniform
sample of K equal classes: K/sqrt(12)), the mean label distance of adjacent rows (uniform: ~K/3), and the share of
groups whose labels are one contiguous range; next to the uniform expectation of a random permutation."""

from __future__ import annotations

import argparse
import itertools
import random
import statistics

import pyarrow as pa

from tasks.convert.plan import order_hash, order_rows


def _metrics(labels: list[int], group: int) -> dict[str, float]:
    groups = [labels[i : i + group] for i in range(0, len(labels) - group + 1, group)]
    distinct = [len(set(g)) for g in groups]
    return {
        "distinct mean": statistics.mean(distinct),
        "distinct min": min(distinct),
        "label sd": statistics.mean(statistics.pstdev(g) for g in groups),
        "adjacent |dlabel|": statistics.mean(abs(a - b) for a, b in itertools.pairwise(labels)),
        "contiguous groups": sum(max(g) - min(g) + 1 == len(set(g)) for g in groups) / len(groups),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--classes", type=int, default=200)
    parser.add_argument("--per-class", type=int, default=20)
    parser.add_argument("--group", type=int, default=100)
    args = parser.parse_args()
    wnids = [f"class {c:04d}" for c in range(args.classes)]
    rows = [(c, f"{i:04d}.jpg") for c in range(args.classes) for i in range(1, args.per_class + 1)]
    table = pa.table({"wnid": [wnids[c] for c, _ in rows], "name": [n for _, n in rows], "size": [1] * len(rows)})
    before = [c for _, (c, _) in sorted(enumerate(rows), key=lambda r: (order_hash(r[1][1]), r[0]))]
    after = [wnids.index(w) for w in order_rows(table, "hashed").column("wnid").to_pylist()]
    uniform = [c for c, _ in rows]
    random.Random(0).shuffle(uniform)
    results = {"before (name, manifest order)": before, "after (name, class tie)": after, "uniform shuffle": uniform}
    columns = list(_metrics(before, args.group))
    print(f"{args.classes} classes x {args.per_class} images named 0001..; row groups of {args.group} rows")
    print("| order | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, labels in results.items():
        values = _metrics(labels, args.group)
        print(f"| {name} | " + " | ".join(f"{values[c]:.2f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
