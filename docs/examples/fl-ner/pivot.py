"""The results table of docs/fl-ner.md: comparison.csv of the fl-ner report, one row per
configuration, test entity F1 (%) per dataset and head, and epsilon per dataset.

    .venv/bin/python docs/examples/fl-ner/pivot.py runs/fl-ner/report/comparison.csv
"""

import csv
import sys

DATASETS = [("wnut17", "WNUT-17"), ("ncbi", "NCBI-disease")]
HEADS = [("softmax", "softmax"), ("crf", "CRF")]
FAMILIES = [
    ("central", "(a) central SGD", ""),
    ("dpsgd", "(b) central DP-SGD", "z = "),
    ("fedavg", "(c) FedAvg", "n = "),
    ("clientdp", "(d) FedAvg + client DP-SGD (z = 1)", "n = "),
    ("dpfedavg", "(e) DP-FedAvg (z = 1)", "n = "),
]
UNIT = {"central": "—", "dpsgd": "example", "fedavg": "—", "clientdp": "example", "dpfedavg": "user"}


def main(path: str) -> None:
    rows = {r["run"]: r for r in csv.DictReader(open(path, newline=""))}
    params: dict[str, list[str]] = {}
    for name in rows:
        ds, head, family, *rest = name.split("-")
        value = rest[0][1:] if rest else ""
        if ds == DATASETS[0][0] and head == HEADS[0][0] and value not in params.setdefault(family, []):
            params[family].append(value)
    header = ["configuration", *[f"F1 {d} {h}" for _, d in DATASETS for _, h in HEADS], *[f"ε {d} (δ)" for _, d in DATASETS], "ε protects one"]
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join(["---"] + ["---:"] * (len(header) - 2) + ["---"]) + " |")
    for family, label, prefix in FAMILIES:
        for value in params.get(family, []):
            suffix = f"-{family}" + (f"-{'z' if family == 'dpsgd' else 'n'}{value}" if value else "")
            cells = [f"{label}" + (f", {prefix}{value}" if value else "")]
            for ds, _ in DATASETS:
                for head, _ in HEADS:
                    r = rows.get(f"{ds}-{head}{suffix}")
                    cells.append("" if r is None or not r["test_f1"] else f"{100 * float(r['test_f1']):.1f}")
            for ds, _ in DATASETS:
                eps = {(r["epsilon"], r["delta"]) for head, _ in HEADS if (r := rows.get(f"{ds}-{head}{suffix}"))}
                (e, d), *more = sorted(eps) or [("", "")]
                cells.append("∞" if not e else f"{float(e):.3g} ({float(d):g})" + (" *" if more else ""))
            cells.append(UNIT[family])
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
