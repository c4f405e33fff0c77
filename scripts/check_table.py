#!/usr/bin/env python3
"""One row per `laga run --check --json` document: the worst relative error against each reference.

    python3 scripts/check_table.py run1.json run2.json ... [--json summary.json]

--json writes the same rows, with every tensor's error, as one document (the form committed under
bench/results/checks/ and read by scripts/results.py).
"""
import argparse
import json
import sys

REFS = ["explicit P=1, same device", "explicit same P", "CPU float64"]


def summary_row(d):
    r = d["runs"][0]
    return {"model": d["options"]["model"], "seq": d["options"]["seq"], "batch": d["options"]["batch"],
            "variant": r["variant"], "form": r["form"], "layout": r["layout"], "kernel": r["kernel"],
            "dtype": r["dtype"], "kv_grad_reduce_in_fp32": r.get("kv_grad_reduce_in_fp32", False),
            "sp": d["options"]["sp"], "communicator": d["machine"]["communicator"],
            "device": d["machine"].get("device_name", d["machine"]["device"]), "commit": d["machine"]["commit"],
            "dirty": d["machine"].get("dirty"), "hostname": d["machine"].get("hostname"),
            "checks": [{"reference": c["reference"], "tolerance": c["tolerance"],
                        "tensors": {t["tensor"]: t["rel_error"] for t in c["tensors"]},
                        "ok": all(t["ok"] for t in c["tensors"])} for c in r.get("check", [])]}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("documents", nargs="+", help="laga run --check --json documents")
    ap.add_argument("--json", dest="out_json", help="write the rows, every tensor's error included, here")
    args = ap.parse_args(argv)
    rows, summary = [], []
    for path in args.documents:
        try:
            d = json.load(open(path))
        except Exception:
            rows.append((path.split("/")[-1], "-", "-", "no JSON: the run failed (see its log)", "", "", ""))
            continue
        s = summary_row(d)
        summary.append(s)
        cells = {c["reference"]: f"{max(c['tensors'].values()):.2e} {'ok' if c['ok'] else 'FAIL'} "
                                 f"(tol {c['tolerance']:.0e})" for c in s["checks"]}
        kv = " (K/V grads fp32)" if s["kv_grad_reduce_in_fp32"] else ""
        rows.append((f"{s['variant']} / {s['layout']}{kv} / {s['kernel']}", f"P={s['sp']}", s["dtype"], s["communicator"])
                    + tuple(cells.get(k, "-") for k in REFS))
    header = ("variant / layout / kernel", "P", "dtype", "communicator") + tuple("vs " + k for k in REFS)
    w = [max(len(str(x[i])) for x in [header] + rows) for i in range(len(header))]
    for k, row in enumerate([header] + rows):
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(row)))
        if k == 0:
            print("-" * (sum(w) + 2 * (len(w) - 1)))
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump({"schema": "laga-checks/1", "runs": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
