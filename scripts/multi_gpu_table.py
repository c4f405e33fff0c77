#!/usr/bin/env python3
"""Tables of `laga run --json` documents from real multi-GPU runs (scripts/gpu.sh multi): the block's time
per form, the collectives' time and bus bandwidth, LAGA's speed-up over explicit, and what the alpha-beta
time model predicts for the same points from the measured compute (`laga plan --json`: the collectives of the
same configuration priced at the "node" placement, all ranks of the group on one node, with the plan's default
link figures, which the --json output records).

    python3 scripts/multi_gpu_table.py run1.json run2.json ... [--laga build/laga] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def plan_of(laga, d):
    """`laga plan --json` of a run document's configuration and variant: (the variant's plan, the time model)."""
    o, r = d["options"], d["runs"][0]
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "config.json")
        with open(model, "w") as f:
            json.dump(d["config"], f)
        cmd = [laga, "plan", "--model", model, "--seq", str(o["seq"]), "--sp", str(o["sp"]), "--batch", str(o["batch"]),
               "--layout", r["layout"], "--kernel", r["kernel"], "--dtype", r["dtype"], "--json"]
        cmd += ["--kv-grad-reduce-in-fp32"] if r.get("kv_grad_reduce_in_fp32") else []
        doc = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return doc["points"][0]["variants"][r["variant"]], doc["time_model"]


def modeled_comm(plan):
    return next(pl["collective_s"] for pl in plan["modeled"]["placements"] if pl["placement"] == "node")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("documents", nargs="+", help="laga run --json documents of multi-GPU runs")
    ap.add_argument("--json", dest="out_json", help="write the points, collectives and speed-ups here")
    ap.add_argument("--laga", default="build/laga", help="the laga binary (its `laga plan --json` prices the collectives)")
    args = ap.parse_args(argv)
    points, coll, machine, tm = [], [], None, None
    for path in args.documents:
        try:
            d = json.load(open(path))
        except Exception:
            print(f"{path}: no JSON (the run failed; see its log)")
            continue
        o, r = d["options"], d["runs"][0]
        machine = machine or d["machine"]
        P = o["sp"]
        # The slowest rank sets the block's time (causal all_gather loads the last rank most).
        ranks = r["ranks"]
        slow = max(ranks, key=lambda k: k["seconds_forward_total"] + k["seconds_backward_total"])
        fwd, bwd = slow["seconds_forward_total"], slow["seconds_backward_total"]
        comm = slow["seconds_forward"]["communication"] + slow["seconds_backward"]["communication"]
        compute = fwd + bwd - comm
        plan, tm = plan_of(args.laga, d)
        model = compute + modeled_comm(plan)
        points.append({"seq": o["seq"], "sp": P, "layout": r["layout"], "form": r["variant"], "kernel": r["kernel"],
                       "forward_s": fwd, "backward_s": bwd, "communication_s": comm, "compute_s": compute,
                       "modeled_block_s": model, "rank": slow["rank"], "communicator": d["machine"]["communicator"],
                       "device": d["machine"].get("device_name", "")})
        for c in ranks[0]["traffic"]:
            coll.append({"seq": o["seq"], "sp": P, "layout": r["layout"], "form": r["variant"], "phase": c["phase"],
                         "collective": c["collective"], "tensor": c["tensor"], "bytes_sent": c["bytes_sent"],
                         "seconds": c["seconds"], "bus_gbs": c["bus_bytes_per_s"] * 1e-9})
    if not points:
        return 1
    print(f"block time, slowest rank (measured; {points[0]['communicator']}, {points[0]['device']}); "
          "model = measured compute + modeled NVLink collectives")
    print(f"{'S':>6} {'P':>2} {'layout':10} {'form':10} {'fwd ms':>8} {'bwd ms':>8} {'comm ms':>8} "
          f"{'block ms':>9} {'model ms':>9} {'model/meas':>10}")
    for p in points:
        blk = p["forward_s"] + p["backward_s"]
        print(f"{p['seq']:>6} {p['sp']:>2} {p['layout']:10} {p['form']:10} {p['forward_s']*1e3:8.2f} "
              f"{p['backward_s']*1e3:8.2f} {p['communication_s']*1e3:8.2f} {blk*1e3:9.2f} "
              f"{p['modeled_block_s']*1e3:9.2f} {p['modeled_block_s']/blk:10.3f}")
    print("\nLAGA / explicit speed-up of the block (fwd + bwd, measured; modeled beside)")
    speedups = []
    for p in points:
        if p["form"] != "laga":
            continue
        ex = [q for q in points if q["form"] == "explicit" and q["seq"] == p["seq"] and q["sp"] == p["sp"]
              and q["layout"] == p["layout"] and q["kernel"] == p["kernel"]]
        if ex:
            e = ex[0]
            meas = (e["forward_s"] + e["backward_s"]) / (p["forward_s"] + p["backward_s"])
            mod = e["modeled_block_s"] / p["modeled_block_s"]
            speedups.append({"seq": p["seq"], "sp": p["sp"], "layout": p["layout"], "measured": meas, "modeled": mod})
            print(f"  S {p['seq']:>6} P {p['sp']} {p['layout']:10} measured {meas:.3f}x  modeled {mod:.3f}x")
    print("\ncollectives on rank 0: time and bus bandwidth (bytes sent / time; NCCL's busbw)")
    for c in coll:
        print(f"  S {c['seq']:>6} P {c['sp']} {c['layout']:10} {c['form']:10} {c['phase']:8} {c['collective']:14} "
              f"{c['tensor']:10} {c['bytes_sent']/2**20:10.2f} MiB {c['seconds']*1e3:8.3f} ms {c['bus_gbs']:7.1f} GB/s")
    if args.out_json:
        json.dump({"machine": machine, "points": points, "collectives": coll, "speedups": speedups,
                   "time_model": {"label": "modeled", "bandwidth_bytes_per_s": tm["intra"]["bandwidth_bytes_per_s"],
                                  "latency_s": tm["intra"]["latency_s"]}},
                  open(args.out_json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
