#!/usr/bin/env python3
"""Plots a `laga bench` JSON document (docs/bench.md) with matplotlib (Debian: python3-matplotlib).

    python3 scripts/plot_bench.py FILE.json [--outdir DIR] [--prefix NAME] [--sp P] [--seq S] [--kernel K]

Writes five PNG files, PREFIX-NAME.png (PREFIX defaults to the file's stem):
  memory       activation memory kept for backward, per variant, stacked by tensor (one panel per layout x kernel)
  time-phases  measured time (forward + backward) by phase against sequence length, per variant and layout
  traffic      bytes one rank sends, per variant, stacked by collective and tensor (one panel per layout)
  ratios       LAGA / explicit and absorbed / explicit against P: saved bytes, traffic, measured time and
               MODELED time
  modeled-time MODELED block time against P: one node (NVLink) and one rank a node (InfiniBand)
Measured figures are those of rank P-1, medians over the repeats (whiskers: min..max). Every modeled figure
is titled and labelled as modeled. --sp, --seq and --kernel pick the slice a plot shows (default: the largest
P and S of the sweep, and the fused kernel when present).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_bench import measured_rank as rank_of  # noqa: E402

MiB = 1024.0 ** 2
PHASES = ["projections", "up_projections", "attention", "communication", "other"]
PHASE_COLORS = {"projections": "#4c72b0", "up_projections": "#55a868", "attention": "#c44e52",
                "communication": "#8172b2", "other": "#999999"}
VARIANT_COLORS = {"explicit": "#333333", "absorbed (mqa)": "#d62728", "absorbed (expanded)": "#ff9896",
                  "laga": "#1f77b4", "laga +recompute kv": "#17becf"}
SHORT = {"explicit": "explicit", "absorbed (mqa)": "absorbed\n(mqa)", "absorbed (expanded)": "absorbed\n(expanded)",
         "laga": "LAGA", "laga +recompute kv": "LAGA\n+recompute"}


def load(path):
    with open(path) as f:
        return json.load(f)


def variants(doc):
    return [v["label"] for v in doc["config"]["variants"]]


def find(doc, **kw):
    return [p for p in doc["points"] if all(p[k] == v for k, v in kw.items())]


def one(doc, **kw):
    pts = find(doc, **kw)
    return pts[0] if pts else None


def default_slice(doc, sp=None, seq=None, kernel=None, batch=None):
    cfg = doc["config"]
    return {"sp": sp or max(cfg["sp"]), "seq": seq or max(cfg["seq"]), "batch": batch or min(cfg["batch"]),
            "kernel": kernel or ("fused" if "fused" in cfg["kernels"] else cfg["kernels"][0])}


def footer(fig, doc):
    m, b, c = doc["machine"], doc["build"], doc["config"]
    where = m["gpus"][c.get("gpu", 0)]["name"] if c["device"] == "cuda" and m["gpus"] else m["cpu_model"]
    fig.text(0.01, 0.005, f"laga bench {c['model']['name']}, {c['device']} ({where}, {m['cpu_cores']} cores), "
             f"{c['dtype']}, commit {b['commit'][:10]}{' (dirty)' if b['dirty'] else ' (tree unknown)' if b['dirty'] is None else ''}, "
             f"{doc['generated']}; "
             f"measured: rank P-1, median of {c['repeat']}",
             fontsize=7, color="#555555", ha="left", va="bottom")


def save(fig, plt, doc, path, rect):
    """Lays out the figure inside `rect` (room for the title above and the footer below), stamps the footer
    naming the run, writes the PNG and frees the figure."""
    fig.tight_layout(rect=rect)
    footer(fig, doc)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def model_text(doc):
    tm = doc["time_model"]
    return (f"{tm['intra']['name']} {tm['intra']['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s, "
            f"{tm['inter']['name']} {tm['inter']['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s per GPU, "
            f"{tm['node_size']} GPUs a node")


def byte_unit(largest):
    """(divisor, name) so that the largest value reads between 1 and 1024."""
    for div, name in ((1024.0 ** 3, "GiB"), (MiB, "MiB"), (1024.0, "KiB")):
        if largest >= div:
            return div, name
    return 1.0, "B"


def tensor_colors(names):
    import matplotlib
    cmap = matplotlib.colormaps["tab20"]
    return {n: cmap(i % 20) for i, n in enumerate(sorted(names))}


def plot_memory(doc, plt, path, sl):
    layouts, kernels, vs = doc["config"]["layouts"], doc["config"]["kernels"], variants(doc)
    names, largest, total = {}, 0, 0
    for p in find(doc, seq=sl["seq"], sp=sl["sp"], batch=sl["batch"]):
        for t in rank_of(p)["saved"]:
            names[t["name"]] = max(names.get(t["name"], 0), t["bytes"])
        largest = max(largest, rank_of(p)["saved_bytes"])
    order = sorted(names, key=lambda n: (-names[n], n))  # the largest tensors at the bottom of every bar
    colors = tensor_colors(names)
    div, unit = byte_unit(largest)
    fig, axes = plt.subplots(len(layouts), len(kernels), figsize=(4.2 * len(kernels) + 2.2, 3.6 * len(layouts) + 0.6),
                             squeeze=False, sharey="row")
    for i, layout in enumerate(layouts):
        for j, kernel in enumerate(kernels):
            ax = axes[i][j]
            for x, v in enumerate(vs):
                p = one(doc, seq=sl["seq"], sp=sl["sp"], batch=sl["batch"], layout=layout, kernel=kernel, variant=v)
                if not p:
                    continue
                bottom = 0.0
                for t in sorted(rank_of(p)["saved"], key=lambda t: order.index(t["name"])):
                    ax.bar(x, t["bytes"] / div, bottom=bottom, color=colors[t["name"]], edgecolor="white", linewidth=0.4)
                    bottom += t["bytes"] / div
                ax.text(x, bottom, f"{bottom:.3g}", ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(vs)))
            ax.set_xticklabels([SHORT.get(v, v) for v in vs], fontsize=7)
            ax.set_title(f"layout {layout}, kernel {kernel}", fontsize=9)
            if j == 0:
                ax.set_ylabel(f"saved for backward ({unit})")
            ax.margins(y=0.12)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in order]
    fig.legend(handles, order, loc="center right", fontsize=7, title="tensor\n(largest first)", title_fontsize=8)
    fig.suptitle(f"Activation memory per rank by tensor (measured): {doc['config']['model']['name']}, "
                 f"S={sl['seq']}, P={sl['sp']}, batch {sl['batch']}", fontsize=10)
    save(fig, plt, doc, path, rect=(0, 0.03, 1 - 1.9 / fig.get_figwidth(), 0.95))


def plot_time_phases(doc, plt, path, sl):
    layouts, vs, seqs = doc["config"]["layouts"], variants(doc), sorted(doc["config"]["seq"])
    fig, axes = plt.subplots(len(layouts), len(vs), figsize=(2.7 * len(vs) + 1.5, 3.1 * len(layouts) + 0.7),
                             squeeze=False, sharey="row")
    for i, layout in enumerate(layouts):
        for j, v in enumerate(vs):
            ax = axes[i][j]
            for x, s in enumerate(seqs):
                p = one(doc, seq=s, sp=sl["sp"], batch=sl["batch"], layout=layout, kernel=sl["kernel"], variant=v)
                if not p:
                    continue
                bottom = 0.0
                for ph in PHASES:
                    ms = 1e3 * (p["repeats"]["forward"]["by_phase"][ph]["median"] + p["repeats"]["backward"]["by_phase"][ph]["median"])
                    ax.bar(x, ms, bottom=bottom, color=PHASE_COLORS[ph], edgecolor="white", linewidth=0.4)
                    bottom += ms
                blk = p["repeats"]["block"]
                ax.errorbar(x, 1e3 * blk["median"], yerr=[[1e3 * (blk["median"] - blk["min"])], [1e3 * (blk["max"] - blk["median"])]],
                            fmt="none", ecolor="black", capsize=2, linewidth=0.8)
            ax.set_xticks(range(len(seqs)))
            ax.set_xticklabels([str(s) for s in seqs], fontsize=7)
            ax.set_title(f"{v}" + (f"\n{layout}" if len(layouts) > 1 else ""), fontsize=8)
            if i == len(layouts) - 1:
                ax.set_xlabel("sequence length S", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{layout}: fwd + bwd (ms)", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS[ph]) for ph in PHASES]
    fig.legend(handles, PHASES, loc="upper center", bbox_to_anchor=(0.5, 0.95), fontsize=7, ncol=len(PHASES),
               frameon=False)
    fig.suptitle(f"Time by phase vs sequence length (measured; medians, whiskers min..max of the block): "
                 f"{doc['config']['model']['name']}, P={sl['sp']}, kernel {sl['kernel']}", fontsize=10)
    save(fig, plt, doc, path, rect=(0, 0.03, 1, 0.91))


def plot_traffic(doc, plt, path, sl):
    layouts, vs = doc["config"]["layouts"], variants(doc)
    keys, largest = set(), 0
    for p in find(doc, seq=sl["seq"], sp=sl["sp"], batch=sl["batch"], kernel=sl["kernel"]):
        keys.update(f"{c['collective']} {c['tensor']}" for c in rank_of(p)["traffic"])
        largest = max(largest, rank_of(p)["bytes_sent"])
    colors = tensor_colors(keys)
    div, unit = byte_unit(largest)
    fig, axes = plt.subplots(1, len(layouts), figsize=(4.6 * len(layouts) + 2.4, 4.2), squeeze=False)
    for j, layout in enumerate(layouts):
        ax = axes[0][j]
        for x, v in enumerate(vs):
            p = one(doc, seq=sl["seq"], sp=sl["sp"], batch=sl["batch"], layout=layout, kernel=sl["kernel"], variant=v)
            if not p:
                continue
            agg = {}
            for c in rank_of(p)["traffic"]:
                k = f"{c['collective']} {c['tensor']}"
                agg[k] = agg.get(k, 0) + c["bytes_sent"]
            bottom = 0.0
            for k, b in sorted(agg.items()):
                ax.bar(x, b / div, bottom=bottom, color=colors[k], edgecolor="white", linewidth=0.4)
                bottom += b / div
            ax.text(x, bottom, f"{bottom:.3g}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(vs)))
        ax.set_xticklabels([SHORT.get(v, v) for v in vs], fontsize=7)
        ax.set_title(f"layout {layout}", fontsize=9)
        ax.set_ylabel(f"bytes sent by one rank, fwd + bwd ({unit})", fontsize=8)
        ax.margins(y=0.12)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in sorted(keys)]
    if handles:
        fig.legend(handles, sorted(keys), loc="center right", fontsize=7, title="collective, tensor (fwd + bwd)",
                   title_fontsize=7)
    fig.suptitle(f"Traffic per rank (measured): {doc['config']['model']['name']}, S={sl['seq']}, P={sl['sp']}, "
                 f"kernel {sl['kernel']}", fontsize=10)
    save(fig, plt, doc, path, rect=(0, 0.03, 1 - 2.3 / fig.get_figwidth(), 0.94))


def placement(p, name):
    for pl in p["modeled"]["placements"]:
        if pl["placement"] == name:
            return pl
    return None


def plot_ratios(doc, plt, path, sl):
    cfg = doc["config"]
    sps = sorted(cfg["sp"])
    others = [v for v in ("laga", "absorbed (mqa)") if v in variants(doc)]
    if "explicit" not in variants(doc) or not others:
        others = []
    panels = [("saved bytes (measured)", lambda p: rank_of(p)["saved_bytes"]),
              ("bytes sent (measured)", lambda p: rank_of(p)["bytes_sent"]),
              ("block time fwd + bwd (measured)", lambda p: p["repeats"]["block"]["median"]),
              ("block time, one node (MODELED)", lambda p: placement(p, "node")["block_s"]),
              ("block time, one rank a node (MODELED)", lambda p: placement(p, "cross-node")["block_s"])]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.9), squeeze=False)
    styles = {"a2a": "-", "all_gather": "--"}
    for k, (title, get) in enumerate(panels):
        ax = axes[0][k]
        for v in others:
            for layout in cfg["layouts"]:
                xs, ys = [], []
                for P in sps:
                    ex = one(doc, seq=sl["seq"], sp=P, batch=sl["batch"], layout=layout, kernel=sl["kernel"], variant="explicit")
                    o = one(doc, seq=sl["seq"], sp=P, batch=sl["batch"], layout=layout, kernel=sl["kernel"], variant=v)
                    if ex and o and get(ex) > 0:
                        xs.append(P)
                        ys.append(get(o) / get(ex))
                if xs:  # LAGA and absorbed move the same bytes: different markers keep both visible
                    ax.plot(xs, ys, styles.get(layout, ":"), marker="o" if v == "laga" else "x",
                            markersize=5 if v == "laga" else 6, fillstyle="none", color=VARIANT_COLORS.get(v),
                            label=f"{'LAGA' if v == 'laga' else v} / explicit, {layout}")
        ax.axhline(1.0, color="#888888", linewidth=0.7)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sps)
        ax.set_xticklabels([str(P) for P in sps])
        ax.set_xlabel("P (sequence-parallel ranks)", fontsize=8)
        ax.set_title(title, fontsize=9, color="#b00000" if "MODELED" in title else "black")
        if "MODELED" in title:
            ax.set_facecolor("#fff6f0")
        if k == 0:
            ax.set_ylabel("ratio to explicit", fontsize=8)
    h, lab = axes[0][0].get_legend_handles_labels()
    if h:
        fig.legend(h, lab, loc="upper center", bbox_to_anchor=(0.5, 0.925), fontsize=7, ncol=4, frameon=False)
    fig.suptitle(f"Ratios to explicit vs P: {doc['config']['model']['name']}, S={sl['seq']}, kernel {sl['kernel']}. "
                 f"MODELED = measured compute + alpha-beta collectives ({model_text(doc)})", fontsize=9)
    save(fig, plt, doc, path, rect=(0, 0.03, 1, 0.84))


def plot_modeled_time(doc, plt, path, sl):
    cfg = doc["config"]
    sps = sorted(cfg["sp"])
    layouts = cfg["layouts"]
    fig, axes = plt.subplots(1, 2 * len(layouts), figsize=(3.8 * 2 * len(layouts), 4.0), squeeze=False, sharey=True)
    k = 0
    for layout in layouts:
        for name, title in (("node", "one node (NVLink)"), ("cross-node", "one rank a node (InfiniBand)")):
            ax = axes[0][k]
            k += 1
            for v in variants(doc):
                xs, ys, cs = [], [], []
                for P in sps:
                    p = one(doc, seq=sl["seq"], sp=P, batch=sl["batch"], layout=layout, kernel=sl["kernel"], variant=v)
                    if p:
                        pl = placement(p, name)
                        xs.append(P)
                        ys.append(1e3 * pl["block_s"])
                        cs.append(1e3 * pl["collective_s"])
                if xs:
                    ax.plot(xs, ys, marker="o", markersize=3.5, color=VARIANT_COLORS.get(v), label=v)
                    pos = [(x, c) for x, c in zip(xs, cs) if c > 0]  # P = 1 has none
                    if pos:
                        ax.plot([x for x, _ in pos], [c for _, c in pos], linestyle=":", marker=".",
                                color=VARIANT_COLORS.get(v), linewidth=0.9)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(sps)
            ax.set_xticklabels([str(P) for P in sps])
            ax.set_xlabel("P", fontsize=8)
            ax.set_title(f"MODELED, {layout}: {title}", fontsize=9, color="#b00000")
            ax.set_facecolor("#fff6f0")
            if k == 1:
                ax.set_ylabel("ms per block (solid: block, dotted: collectives)", fontsize=8)
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="upper center", bbox_to_anchor=(0.5, 0.925), fontsize=7, ncol=len(lab), frameon=False)
    fig.suptitle(f"MODELED block time: measured compute (rank P-1, {cfg['device']}, {cfg['model']['name']}) + "
                 f"collectives priced by the alpha-beta model ({model_text(doc)}); S={sl['seq']}, kernel {sl['kernel']}",
                 fontsize=9)
    save(fig, plt, doc, path, rect=(0, 0.03, 1, 0.84))


PLOTS = [("memory", plot_memory), ("time-phases", plot_time_phases), ("traffic", plot_traffic),
         ("ratios", plot_ratios), ("modeled-time", plot_modeled_time)]


def make_plots(doc, outdir, prefix, sp=None, seq=None, kernel=None):
    """Writes the PNG files; returns {name: path}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(outdir, exist_ok=True)
    sl = default_slice(doc, sp, seq, kernel)
    out = {}
    for name, fn in PLOTS:
        path = os.path.join(outdir, f"{prefix}-{name}.png")
        fn(doc, plt, path, sl)
        out[name] = path
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--outdir", default=".")
    ap.add_argument("--prefix")
    ap.add_argument("--sp", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--kernel")
    args = ap.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_bench.py: matplotlib is not installed (Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return 2
    doc = load(args.file)
    prefix = args.prefix or os.path.splitext(os.path.basename(args.file))[0]
    for name, path in make_plots(doc, args.outdir, prefix, args.sp, args.seq, args.kernel).items():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
