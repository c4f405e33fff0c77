#!/usr/bin/env python3
"""Compare a phantom run's measurements with `laga plan` for the same configuration.

    phantom_vs_plan.py RUN.json PLAN.json [PLAN.json ...]

RUN.json comes from `laga run --phantom-rank R --sp P ... --json RUN.json` (one or many variants);
each PLAN.json from `laga plan --json` for one layout and kernel (the same model, seq, sp, batch, dtype).
Prints one row per run: saved bytes measured and planned, and whether the saved tensors (name and bytes),
the bytes sent and the peaks agree. Exit 1 when the saved bytes, the saved tensors or the traffic differ
(they must be EQUAL: the plan runs the same orchestration on the meta backend), or a run has no plan.
"""
import json
import sys


def table(header, rows, left=3):
    widths = [max(len(str(x[i])) for x in [header] + rows) for i in range(len(header))]
    line = lambda cells: "  ".join(str(c).ljust(w) if i < left else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(header))
    print("-" * len(line(header)))
    for row in rows:
        print(line(row))


def print_phases(run):
    """Milliseconds by phase (forward / backward) and the device memory of every run."""
    phases = ["projections", "up_projections", "attention", "communication", "other"]
    short = {"projections": "proj", "up_projections": "up", "attention": "attn", "communication": "comm",
             "other": "other"}
    header = ["variant", "layout", "kernel"] + [f"{short[p]} f/b ms" for p in phases] + ["fwd ms", "bwd ms"]
    has_dev = any("device_peak_used_bytes" in r["ranks"][0] for r in run["runs"])
    if has_dev:
        header += ["dev before GiB", "dev peak GiB"]
    rows = []
    for r in run["runs"]:
        k = r["ranks"][0]
        row = [r["variant"], r["layout"], r["kernel"]]
        row += [f"{1e3 * k['seconds_forward'][p]:.1f}/{1e3 * k['seconds_backward'][p]:.1f}" for p in phases]
        row += [f"{1e3 * k['seconds_forward_total']:.1f}", f"{1e3 * k['seconds_backward_total']:.1f}"]
        if has_dev:
            row += [f"{k.get('device_used_before_bytes', 0) / 2**30:.2f}", f"{k.get('device_peak_used_bytes', 0) / 2**30:.2f}"]
        rows.append(row)
    table(header, rows)


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    run = json.load(open(argv[1]))
    plans = {}
    for path in argv[2:]:
        doc = json.load(open(path))
        for point in doc["points"]:
            key = (doc["layout"], doc["kernel"], point["seq"], point["sp"])
            plans[key] = point["variants"]
    seq, sp = run["options"]["seq"], run["options"]["sp"]
    rows, bad = [], 0
    for r in run["runs"]:
        rank = r["ranks"][0]
        variants = plans.get((r["layout"], r["kernel"], seq, sp))
        if variants is None or r["variant"] not in variants:
            rows.append((r["variant"], r["layout"], r["kernel"], str(rank["saved_bytes"]), "-", "NO PLAN", "", "", ""))
            bad += 1
            continue
        p = variants[r["variant"]]
        saved_eq = p["saved_bytes"] == rank["saved_bytes"]
        tensors_eq = sorted((t["name"], t["bytes"]) for t in p["saved"]) == sorted(
            (t["name"], t["bytes"]) for t in rank["saved"])
        sent_eq = p["bytes_sent"] == rank["bytes_sent"] and p["bytes_received"] == rank["bytes_received"]
        peaks_eq = (p["peak_forward_bytes"] == rank["peak_forward_bytes"]
                    and p["peak_backward_bytes"] == rank["peak_backward_bytes"])
        ok = saved_eq and tensors_eq and sent_eq
        bad += not ok
        rows.append((r["variant"], r["layout"], r["kernel"], str(rank["saved_bytes"]), str(p["saved_bytes"]),
                     "EQUAL" if saved_eq else "DIFFER", "yes" if tensors_eq else "NO", "yes" if sent_eq else "NO",
                     "yes" if peaks_eq else "differ"))
    table(["variant", "layout", "kernel", "saved (phantom)", "saved (plan)", "saved", "tensors", "traffic", "peaks"], rows)
    print()
    print_phases(run)
    phantom = run.get("phantom") or {}
    print(f"{len(rows) - bad} of {len(rows)} runs match the plan (rank {phantom.get('rank')} of {phantom.get('ranks')}, "
          f"seq {seq}, {run['options']['dtype']}, {run['machine']['device_name']})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
