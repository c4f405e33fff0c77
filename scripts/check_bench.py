#!/usr/bin/env python3
"""Validates `laga bench` documents against docs/bench-schema.json, then checks what a schema cannot say
(python3 standard library only).

    python3 scripts/check_bench.py FILE.json [FILE.json ...] [--schema docs/bench-schema.json]

Schema keywords understood (a subset of JSON Schema 2020-12, all the schema uses): type, required, properties,
additionalProperties, items, enum, const, minimum, minItems, $ref to #/$defs/NAME. An unknown keyword is an
error, so the schema cannot silently outgrow this checker.

Consistency checks: in every rank's record the saved tensors add up to saved_bytes, and the collectives to the
traffic totals; the records are in rank order and hold the point's
rank; every summary of the repeats has min <= q1 <= median <= q3 <= max; a complete document holds one point per combination of the
configuration's lists; each modeled block time is the measured compute plus the modeled collectives; with
--gemm-check (`gemms`), every GEMM ratio, rate and summary agrees with the times, the calls cover each pass's
GEMMs once, in order, and their FLOPs are the block's GEMM FLOPs.
Exit code 0 when every file passes, 1 otherwise (each problem printed with its JSON path).
"""
import argparse
import itertools
import json
import math
import os
import sys

KNOWN = {"$schema", "$id", "title", "description", "$defs", "type", "required", "properties",
         "additionalProperties", "items", "enum", "const", "minimum", "minItems", "$ref"}
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate(value, schema, root, path="$", errors=None):
    """Appends 'path: problem' strings to errors (returned)."""
    if errors is None:
        errors = []
    unknown = set(schema) - KNOWN
    if unknown:
        errors.append(f"{path}: schema uses unsupported keyword(s) {sorted(unknown)}")
    if "$ref" in schema:
        ref = schema["$ref"]
        prefix = "#/$defs/"
        if not ref.startswith(prefix) or ref[len(prefix):] not in root.get("$defs", {}):
            errors.append(f"{path}: unresolvable $ref {ref}")
            return errors
        return validate(value, root["$defs"][ref[len(prefix):]], root, path, errors)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(TYPES[t](value) for t in types):
            errors.append(f"{path}: expected {' or '.join(types)}, got {type(value).__name__} {value!r:.60}")
            return errors
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}, got {value!r:.60}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r:.60} is not one of {schema['enum']}")
    if "minimum" in schema and TYPES["number"](value):
        if not math.isfinite(value) or value < schema["minimum"]:
            errors.append(f"{path}: {value} is below the minimum {schema['minimum']} (or not finite)")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: {len(value)} items, at least {schema['minItems']} required")
        if "items" in schema:
            for i, item in enumerate(value):
                validate(item, schema["items"], root, f"{path}[{i}]", errors)
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing required key '{key}'")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                validate(item, props[key], root, f"{path}.{key}", errors)
            elif extra is False:
                errors.append(f"{path}: unexpected key '{key}'")
            elif isinstance(extra, dict):
                validate(item, extra, root, f"{path}.{key}", errors)
    return errors


def summaries(node, path):
    """Yields (path, summary) for every summary object under node."""
    if isinstance(node, dict):
        if {"median", "q1", "q3", "min", "max", "n"} <= set(node):
            yield path, node
            return
        for k, v in node.items():
            yield from summaries(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from summaries(v, f"{path}[{i}]")


def measured_rank(p):
    """The record of the rank a point describes in detail (its `rank`)."""
    return next(r for r in p["ranks"] if r["rank"] == p["rank"])


def close(a, b, rel=1e-9):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-300)


def gemm_consistency(p, at):
    """--gemm-check's section of point p: ratios from the times, counts, order of issue, FLOPs."""
    errors = []
    g = p["gemms"]
    gl, sm = g["list"], g["summary"]
    issued = {"forward": [], "backward": []}
    flops = {"forward": 0.0, "backward": 0.0}
    for j, e in enumerate(gl):
        ep = f"{at}.gemms.list[{j}]"
        if e["in_block_s"] <= 0 or e["alone_s"] <= 0:
            errors.append(f"{ep}: times must be positive to form a ratio")
            continue
        if not close(e["ratio"], e["in_block_s"] / e["alone_s"]):
            errors.append(f"{ep}: ratio {e['ratio']} != in_block_s / alone_s = {e['in_block_s'] / e['alone_s']}")
        if not close(e["flops"], 2.0 * e["m"] * e["n"] * e["k"] * e["batch"], 1e-12):
            errors.append(f"{ep}: flops {e['flops']} != 2 m n k batch")
        for rate, t in (("in_block_flops_per_s", "in_block_s"), ("alone_flops_per_s", "alone_s")):
            if not close(e[rate], e["flops"] / e[t]):
                errors.append(f"{ep}: {rate} != flops / {t}")
        if len(e["issued"]) != e["calls"]:
            errors.append(f"{ep}: {len(e['issued'])} issued positions for {e['calls']} calls")
        for where in e["issued"]:
            issued[where["pass"]].append(where["index"])
            flops[where["pass"]] += e["flops"]
    for pas, idx in issued.items():
        if sorted(idx) != list(range(len(idx))):
            errors.append(f"{at}.gemms: the {pas} GEMMs' positions are not 0..{len(idx) - 1}, each once")
        # The probe saw the GEMMs the block counted: every FLOP of the pass but attention's kernel.
        want = sum(v for ph, v in measured_rank(p)[f"flops_{pas}"].items() if ph != "attention")
        if not close(flops[pas], want):
            errors.append(f"{at}.gemms: {pas} GEMM FLOPs {flops[pas]} != the block's non-attention FLOPs {want}")
    if errors:
        return errors
    if sm["count"] != len(gl):
        errors.append(f"{at}.gemms.summary: count {sm['count']} != {len(gl)} entries")
    if sm["calls"] != sum(e["calls"] for e in gl):
        errors.append(f"{at}.gemms.summary: calls {sm['calls']} != the entries' calls")
    in_block = sum(e["calls"] * e["in_block_s"] for e in gl)
    alone = sum(e["calls"] * e["alone_s"] for e in gl)
    if not (close(sm["in_block_s"], in_block) and close(sm["alone_s"], alone)):
        errors.append(f"{at}.gemms.summary: in_block_s/alone_s are not the sums of calls x median")
    if not close(sm["time_weighted_ratio"], in_block / alone):
        errors.append(f"{at}.gemms.summary: time_weighted_ratio {sm['time_weighted_ratio']} != {in_block / alone}")
    worst = max(e["ratio"] for e in gl)
    if sm["worst_ratio"] != worst or sm["worst"] >= len(gl) or gl[sm["worst"]]["ratio"] != worst:
        errors.append(f"{at}.gemms.summary: worst_ratio/worst do not name the largest ratio {worst}")
    if sm["within_10pct"] != (sm["time_weighted_ratio"] <= 1.10):
        errors.append(f"{at}.gemms.summary: within_10pct disagrees with time_weighted_ratio")
    return errors


def consistency(doc):
    errors = []
    cfg = doc["config"]
    for i, p in enumerate(doc["points"]):
        at = f"$.points[{i}]"
        if p["rank"] != p["sp"] - 1:
            errors.append(f"{at}: rank {p['rank']} is not P-1")
        ranks = [r["rank"] for r in p["ranks"]]
        if p["rank"] not in ranks or ranks != sorted(set(ranks)):
            errors.append(f"{at}.ranks: not in rank order with rank {p['rank']} among them: {ranks}")
        for j, r in enumerate(p["ranks"]):
            rat = f"{at}.ranks[{j}]"
            if sum(t["bytes"] for t in r["saved"]) != r["saved_bytes"]:
                errors.append(f"{rat}: saved tensors do not add up to saved_bytes")
            for key in ("bytes_sent", "bytes_received"):
                if sum(c[key] for c in r["traffic"]) != r[key]:
                    errors.append(f"{rat}.traffic: collectives do not add up to {key}")
            if p["sp"] == 1 and r["bytes_sent"] != 0:
                errors.append(f"{rat}: P = 1 sends bytes")
        rep = p["repeats"]
        if rep["rank"] != p["rank"]:
            errors.append(f"{at}.repeats: rank {rep['rank']} is not the point's rank {p['rank']}")
        if "block_by_rank" in rep and len(rep["block_by_rank"]) != len(p["ranks"]):
            errors.append(f"{at}.repeats.block_by_rank: {len(rep['block_by_rank'])} ranks, {len(p['ranks'])} records")
        for spath, s in summaries(rep, f"{at}.repeats"):
            tol = 1.5e-9  # values are rounded to the nanosecond
            if not (s["min"] <= s["q1"] + tol and s["q1"] <= s["median"] + tol and s["median"] <= s["q3"] + tol
                    and s["q3"] <= s["max"] + tol):
                errors.append(f"{spath}: not min <= q1 <= median <= q3 <= max: {s}")
            if s["n"] != cfg["repeat"]:
                errors.append(f"{spath}: n = {s['n']}, but repeat = {cfg['repeat']}")
        m = p["modeled"]
        if m["label"] != "modeled":
            errors.append(f"{at}.modeled: not labelled modeled")
        for pl in m["placements"]:
            if abs(pl["block_s"] - (m["compute_s"] + pl["collective_s"])) > 2e-9:
                errors.append(f"{at}.modeled: block_s != compute_s + collective_s for {pl['placement']}")
            if p["sp"] == 1 and pl["collective_s"] != 0:
                errors.append(f"{at}.modeled: P = 1 has modeled collective time")
        if cfg.get("gemm_check", False) != ("gemms" in p):
            errors.append(f"{at}: gemms {'missing' if 'gemms' not in p else 'present'} but config.gemm_check is "
                          f"{cfg.get('gemm_check', False)}")
        if "gemms" in p:
            errors.extend(gemm_consistency(p, at))
    if doc["complete"]:
        labels = [v["label"] for v in cfg["variants"]]
        want = set(itertools.product(cfg["seq"], cfg["sp"], cfg["batch"], cfg["layouts"], cfg["kernels"], labels))
        got = [(p["seq"], p["sp"], p["batch"], p["layout"], p["kernel"], p["variant"]) for p in doc["points"]]
        if len(got) != len(set(got)):
            errors.append("$.points: a point appears twice")
        if set(got) != want:
            errors.append(f"$.points: {len(want - set(got))} configured points missing, "
                          f"{len(set(got) - want)} unexpected")
    return errors


def check_file(path, schema):
    with open(path) as f:
        doc = json.load(f)
    errors = validate(doc, schema, schema)
    if not errors:
        errors = consistency(doc)
    return doc, errors


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--schema", default=os.path.join(here, "..", "docs", "bench-schema.json"))
    args = ap.parse_args()
    with open(args.schema) as f:
        schema = json.load(f)
    bad = 0
    for path in args.files:
        doc, errors = check_file(path, schema)
        if errors:
            bad += 1
            print(f"{path}: {len(errors)} problem(s)")
            for e in errors[:30]:
                print(f"  {e}")
        else:
            print(f"{path}: ok ({len(doc['points'])} points, schema {doc['schema']})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
