#!/usr/bin/env python3
"""Seeded fuzzing of the laga CLI with bad and extreme input: config.json fields, flags of `laga run` and
`laga plan`, corrupted .npy files for --load, and argument soups.

Every case states what must happen: the exit codes allowed (2 for invalid input), words of which the message
must contain one (the field, the file, the rule), a time bound, no signal, and a bound on the memory the
process touched (a refusal allocates nothing the plan has not counted). A failing case prints its seed,
index and command, so it reproduces alone:

    fuzz_cli.py LAGA [--seed N] [--cases N] [--only CATEGORY] [--case INDEX] [--summary FILE]

Exit status 1 when a case fails (with --report-only, 0 and only the per-category counts).
"""
import argparse
import concurrent.futures
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TINY = {
    "hidden_size": 32, "num_attention_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0,
                     "beta_slow": 1.0, "original_max_position_embeddings": 16},
    "rms_norm_eps": 1e-6,
}
INT_FIELDS = ["hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim"]
FLOAT_FIELDS = ["rope_theta", "rms_norm_eps"]
YARN_FIELDS = ["factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow", "original_max_position_embeddings"]
# Values no field accepts: out of range, of the wrong type, or too large for any machine.
BAD_INTS = ["0", "-1", "-9223372036854775808", "18446744073709551616", "1e400", "-1e400", "1.5", "\"8\"", "true",
            "[]", "{}", "4611686018427387904", "9223372036854775807", "2147483648", "1099511627776",
            "1152921504606846976", "1e19"]
BAD_FLOATS = ["0", "-1", "1e400", "-1e400", "\"1\"", "true", "[]", "{}", "-0.0"]
BAD_YARN = {"factor": ["0.5", "-1", "1e400", "\"4\"", "null"], "mscale": ["-1", "1e400", "\"1\""],
            "mscale_all_dim": ["-1", "1e400", "[]"], "beta_fast": ["0.5", "-1", "1e400"],
            "beta_slow": ["0", "-1", "1e400"],
            "original_max_position_embeddings": ["0", "-1", "1.5", "1e400", "18446744073709551616"]}
HUGE = ["4611686018427387904", "9223372036854775807", "9223372036854775808", "18446744073709551616",
        "2147483648", "4294967297", "1152921504606846976"]
MEMORY_WORDS = ["does not fit", "memory", "64 bits"]


class Case:
    def __init__(self, category, args, expect=(2,), words=None, timeout=10.0, setup=None, note="",
                 memory_mib=2048, max_seconds=None):
        self.category, self.args, self.expect, self.words = category, args, tuple(expect), words or []
        self.timeout, self.setup, self.note, self.memory_mib = timeout, setup, note, memory_mib
        self.max_seconds = max_seconds  # a bound on the answer's time (laga plan: a few seconds, see below)


def json_with(field, raw, base=TINY, nested=None):
    """config.json text with one field's value replaced by the raw JSON text `raw` (None: key removed)."""
    obj = json.loads(json.dumps(base))
    marker = "\"@@FUZZ@@\""
    target = obj["rope_scaling"] if nested else obj
    if raw is None:
        target.pop(field, None)
        return json.dumps(obj)
    target[field] = "@@FUZZ@@"
    return json.dumps(obj).replace(marker, raw)


def config_cases(rng, work, n):
    cases = []
    for i in range(n):
        kind = rng.random()
        path = os.path.join(work, f"config_{i}.json")
        if kind < 0.55:
            field = rng.choice(INT_FIELDS)
            raw = rng.choice(BAD_INTS)
            if field == "qk_rope_head_dim" and rng.random() < 0.2:
                raw = rng.choice(["7", "65537", "131072"])
            text = json_with(field, raw)
            words = [field] + (MEMORY_WORDS if raw in HUGE or raw in ("1099511627776", "1e19") else [])
        elif kind < 0.7:
            field = rng.choice(FLOAT_FIELDS)
            raw = rng.choice(BAD_FLOATS)
            text, words = json_with(field, raw), [field]
        elif kind < 0.82:
            field = rng.choice(YARN_FIELDS)
            raw = rng.choice(BAD_YARN[field])
            text, words = json_with(field, raw, nested=True), ["rope_scaling." + field, field]
        elif kind < 0.9:
            field = rng.choice(INT_FIELDS[:2] + INT_FIELDS[3:])
            text, words = json_with(field, None), [field]
        else:
            good = json.dumps(TINY)
            cut = rng.randrange(1, len(good) - 1)
            text, words = good[:cut], ["JSON", "json"]
        cases.append(Case("config", ["run", "--model", path, "--seq", "32"], words=words,
                          setup=("write", path, text), note=f"{path}: {text}"))
    return cases


def flag_cases(rng, work, n):
    fifo = os.path.join(work, "fifo.json")
    fifo_dir = os.path.join(work, "fifo_load")
    base = ["run", "--model", "tiny", "--seq", "32"]
    table = [
        (["--seq"], ["0", "-1", "abc", "4611686018427387904", "9223372036854775808", "1e9", "16385k"], ["seq"]),
        (["--batch"], ["0", "-1", "4611686018427387904", "9223372036854775807", "x"], ["batch"]),
        (["--seq", "2048", "--sp"], ["1024", "4096", "65", "2147483648", "4294967297", "-3", "0x10"], ["sp"]),
        (["--sp"], ["3", "64", "33", "-1"], ["sp"]),
        (["--form"], ["lag", "all", "", "EXPLICIT"], ["form"]),
        (["--layout"], ["ring", "all", "a2a,all_gather"], ["layout"]),
        (["--kernel"], ["flash", "all"], ["kernel"]),
        (["--dtype"], ["bfloat16", "float16", "int8"], ["dtype"]),
        (["--warmup"], ["-1", "101", "4294967296"], ["warmup"]),
        (["--tolerance"], ["-1", "abc"], ["tolerance"]),
        (["--phantom-rank"], ["-2", "5", "2147483648"], ["phantom-rank", "phantom"]),
        (["--recompute"], ["kv --form explicit", "all"], ["recompute"]),
        (["--device"], ["tpu", "cuda"], ["device"]),
        (["--comm"], ["nccl", "mpi"], ["comm"]),
        (["--absorbed-attention"], ["flash"], ["absorbed-attention"]),
        (["--load"], ["/nonexistent/dir", fifo_dir], ["npy", "load"]),
        (["--model"], [fifo, "/nonexistent.json", "/dev/null", "/"], ["model", "config"]),
        (["--json"], ["/nonexistent/dir/x.json"], ["json"]),
        (["--save"], ["/dev/null/x"], ["save"]),
    ]
    cases = []
    for i in range(n):
        flag, values, words = rng.choice(table)
        value = rng.choice(values)
        args = base + flag + value.split(" ") if " " in value else base + flag + [value]
        cases.append(Case("flags", args, words=words + ["The following argument", "Could not convert", "--"]))
    return cases


def plan_cases(rng, work, n):
    big = ["1000000000000000", "3000000000", "4611686018427387904", "18014398509481985k", "9007199254740993k",
           "1e9", "1000000000"]
    table = [
        (["--seq"], big, 2 | 0),
        (["--seq", "3000000000", "--kernel", "eager", "--seq"], big, 0),
        (["--batch"], ["4611686018427387904", "9223372036854775807", "1000000000000", "0", "-5"], 0),
        (["--sp"], ["4294967297", "4294967296", "2147483648", "0", "-8", "7", "1073741824"], 0),
        (["--layers"], ["0", "-1", "2147483647", "4294967296"], 0),
        (["--gpu-mem"], ["0", "-1GB", "1e400", "abc", "1XB", "nan", "inf"], 0),
        (["--seq", "1000000000", "--sp"], ["1", "8", "1000000000", "999999999"], 0),
    ]
    cases = []
    for i in range(n):
        flag, values, _ = rng.choice(table)
        value = rng.choice(values)
        model = rng.choice(["deepseek-v3", "kimi-k2", "small"])
        args = ["plan", "--model", model] + flag + [value]
        # Any input: an answer (0) or a refusal (2), within a second.
        # The bound catches a plan that walks the sequence (minutes at these sizes), not a slow start: it leaves room
        # for a loaded 2-core CI machine, where the binary alone takes up to a second to start.
        cases.append(Case("plan", args, expect=(0, 2), words=[], timeout=10.0, max_seconds=5.0))
    # The answer must reach its destination.
    cases.append(Case("plan", ["plan", "--model", "small", "--seq", "64", "--sp", "2", "--out", "/dev/full"],
                      expect=(3,), words=["/dev/full", "writ"], note="write error"))
    return cases


def npy_header(descr="<f8", fortran=False, shape=(2, 3)):
    shp = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    return "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, "True" if fortran else "False", shp)


def npy_bytes(header, payload, version=(1, 0)):
    h = header.encode("latin1")
    pad = 64 - (10 + len(h) + 1) % 64
    h = h + b" " * pad + b"\n"
    return b"\x93NUMPY" + bytes(version) + len(h).to_bytes(2, "little") + h + payload


def npy_cases(rng, work, n, laga):
    ref = os.path.join(work, "npy_ref")
    names = ["x", "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
             "o_proj", "dy"]
    cases = []
    for i in range(n):
        name = rng.choice(names)
        kind = rng.choice(["truncate", "descr", "fortran", "shape", "huge", "magic", "version", "header_len",
                           "garbage_header", "empty", "trailing", "fifo", "directory"])
        d = os.path.join(work, f"npy_{i}")
        cases.append(Case("npy", ["run", "--model", "tiny", "--seq", "32", "--load", d],
                          words=[name + ".npy"], setup=("npy", ref, d, name, kind, rng.randrange(1 << 30)),
                          note=f"{name}.npy: {kind}"))
    return cases


def soup_cases(rng, work, n):
    opts = {
        "--model": ["tiny", "small", "nope"], "--seq": ["16", "32", "64", "0", "31", "16k"],
        "--batch": ["1", "2", "0"], "--sp": ["1", "2", "4", "3", "8"], "--form": ["explicit", "absorbed", "laga", "x"],
        "--layout": ["a2a", "all_gather", "x"], "--kernel": ["eager", "fused", "x"],
        "--dtype": ["float32", "float64", "bfloat16"], "--recompute": ["none", "kv"],
        "--absorbed-attention": ["mqa", "expanded"], "--warmup": ["0", "1", "-1"], "--phantom-rank": ["0", "1", "7"],
    }
    cases = []
    for i in range(n):
        args = ["run"]
        for flag in rng.sample(sorted(opts), rng.randrange(1, 6)):
            args += [flag, rng.choice(opts[flag])]
        if "--seq" not in args:
            args += ["--seq", "32"]
        if rng.random() < 0.3:
            args.append("--check")
        # Odd mixes of valid flags: whatever the verdict, a clean one (0 ran, 1 check failed, 2 refused).
        cases.append(Case("soup", args, expect=(0, 1, 2), words=[], timeout=60.0, memory_mib=8192))
    return cases


def make_npy(ref, d, name, kind, seed):
    rng = random.Random(seed)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(ref, d)
    path = os.path.join(d, name + ".npy")
    if kind == "fifo":
        os.remove(path)
        os.mkfifo(path)
        return
    if kind == "directory":
        os.remove(path)
        os.mkdir(path)
        return
    data = open(path, "rb").read()
    hlen = int.from_bytes(data[8:10], "little")
    header = data[10:10 + hlen].decode("latin1")
    payload = data[10 + hlen:]
    if kind == "truncate":
        data = data[:rng.randrange(0, len(data))]
    elif kind == "descr":
        new = rng.choice(["<i4", "|u1", ">f8", "<f2", "<c16", "O", "<f16"])
        data = npy_bytes(header.replace("'<f8'", "'" + new + "'").replace("'<f4'", "'" + new + "'"), payload)
    elif kind == "fortran":
        data = npy_bytes(header.replace("False", "True"), payload)
    elif kind == "shape":
        start, end = header.index("(") + 1, header.index(")")
        dims = [int(s) for s in header[start:end].split(",") if s.strip()]
        dims[rng.randrange(len(dims))] += rng.choice([-1, 1])
        data = npy_bytes(header[:start] + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + header[end:],
                         payload)
    elif kind == "huge":
        dims = rng.choice([(4611686018427387904,), (1 << 40, 1 << 40), (9223372036854775807, 2), (-1, 3),
                           (1 << 31, 1 << 31, 1 << 31)])
        data = npy_bytes(npy_header(shape=dims), payload)
    elif kind == "magic":
        data = b"\x93NUMPZ" + data[6:]
    elif kind == "version":
        data = data[:6] + bytes([rng.choice([0, 4, 255]), 0]) + data[8:]
    elif kind == "header_len":
        data = data[:8] + (0xFFFF).to_bytes(2, "little") + data[10:]
    elif kind == "garbage_header":
        # Printable characters of the dict replaced (the padding is free to hold anything).
        g = bytearray(header.encode("latin1"))
        spots = [k for k in range(header.index("}") + 1) if not chr(g[k]).isspace()]
        for _ in range(rng.randrange(1, 4)):
            k = rng.choice(spots)
            g[k] = rng.choice([b for b in range(33, 256) if b != g[k]])
        data = data[:10] + bytes(g) + payload
    elif kind == "empty":
        data = b""
    elif kind == "trailing":
        data = data + b"\0" * rng.choice([1, 7, 8])
    open(path, "wb").write(data)


def prepare(case, laga, work):
    if not case.setup:
        return
    kind = case.setup[0]
    if kind == "write":
        open(case.setup[1], "w").write(case.setup[2])
    elif kind == "npy":
        make_npy(*case.setup[1:])


def run_case(laga, case, work, limit_memory, retried=False):
    if not retried:
        prepare(case, laga, work)
    start = time.monotonic()

    def limit():  # the address space the process may take: refusals allocate nothing the plan has not counted
        if limit_memory:
            b = case.memory_mib << 20
            resource.setrlimit(resource.RLIMIT_AS, (b, b))

    proc = subprocess.Popen([laga] + case.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work,
                            start_new_session=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"), preexec_fn=limit)
    try:
        out, err = proc.communicate(timeout=case.timeout)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        hung = True
    seconds = time.monotonic() - start
    err = err.decode("utf-8", "replace")
    # Open MPI's singleton start-up (every laga process initialises MPI) now and then fails when several
    # start at once on a loaded machine: that is the launcher's failure, before laga reads its input. Once more.
    if not hung and proc.returncode != 0 and "An error occurred in MPI_Init" in err and not retried:
        return run_case(laga, case, work, limit_memory, retried=True)
    return proc.returncode, out.decode("utf-8", "replace"), err, hung, seconds


def judge(case, code, out, err, hung, seconds):
    """'ok', or (category of failure, why)."""
    if hung:
        return "hang", f"no answer within {case.timeout:.0f} s"
    if code < 0:
        return "crash", f"signal {-code} ({signal.Signals(-code).name})"
    if code not in case.expect and ("bad_alloc" in err or "out of memory" in err):
        return "memory", f"exit {code}: ran out of the {case.memory_mib} MiB address space allowed"
    if code not in case.expect:
        return "wrong exit", f"exit {code}, expected {' or '.join(map(str, case.expect))}"
    if case.max_seconds and seconds > case.max_seconds * float(os.environ.get("LAGA_TIME_SCALE", "1")):
        return "slow", f"{seconds:.2f} s, more than {case.max_seconds:.0f} s"
    if code == 2:
        text = out + err
        if not err.strip():
            return "no message", "exit 2 without a message"
        if case.words and not any(w in text for w in case.words):
            return "unnamed", f"the message names none of {case.words}"
    return "ok"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("laga")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("LAGA_FUZZ_SEED", "16")))
    ap.add_argument("--cases", type=int, default=60, help="cases per category (soups: a quarter)")
    ap.add_argument("--only", choices=["config", "flags", "plan", "npy", "soup"])
    ap.add_argument("--case", type=int, help="run only this index (as a failure prints it)")
    ap.add_argument("--summary", help="write the per-category counts as JSON to FILE")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once")
    ap.add_argument("--no-memory-limit", action="store_true",
                    help="no address-space limit (AddressSanitizer reserves terabytes of it)")
    ap.add_argument("--report-only", action="store_true", help="exit 0 whatever the verdicts (for before/after)")
    a = ap.parse_args()
    laga = os.path.abspath(a.laga)
    if b"__asan_init" in open(laga, "rb").read():  # AddressSanitizer reserves terabytes of address space
        a.no_memory_limit = True

    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="laga_fuzz_")
    try:
        ref = os.path.join(work, "npy_ref")
        r = subprocess.run([laga, "run", "--model", "tiny", "--seq", "32", "--save", ref], capture_output=True,
                           env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        if r.returncode != 0:
            print(f"fuzz: laga run --save failed ({r.returncode}): {r.stderr.decode()}", file=sys.stderr)
            return 1
        # FIFOs given as a config and as a .npy file (opening one for reading waits for a writer forever).
        os.mkfifo(os.path.join(work, "fifo.json"))
        shutil.copytree(ref, os.path.join(work, "fifo_load"))
        os.remove(os.path.join(work, "fifo_load", "x.npy"))
        os.mkfifo(os.path.join(work, "fifo_load", "x.npy"))
        cases = (config_cases(rng, work, a.cases) + flag_cases(rng, work, a.cases) + plan_cases(rng, work, a.cases) +
                 npy_cases(rng, work, a.cases, laga) + soup_cases(rng, work, max(1, a.cases // 4)))
        counts = {}
        failures = 0
        t0 = time.monotonic()
        chosen = [(i, c) for i, c in enumerate(cases)
                  if (not a.only or c.category == a.only) and (a.case is None or i == a.case)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            results = list(pool.map(lambda ic: run_case(laga, ic[1], work, not a.no_memory_limit), chosen))
        for (i, case), (code, out, err, hung, seconds) in zip(chosen, results):
            verdict = judge(case, code, out, err, hung, seconds)
            c = counts.setdefault(case.category, {"tried": 0, "refused": 0, "ok": 0, "crash": 0, "hang": 0,
                                                  "wrong exit": 0, "slow": 0, "no message": 0, "unnamed": 0,
                                                  "memory": 0})
            c["tried"] += 1
            if code == 2 and not hung:
                c["refused"] += 1
            if verdict == "ok":
                c["ok"] += 1
                continue
            kind, why = verdict
            c[kind] += 1
            failures += 1
            print(f"FAIL [{kind}] seed {a.seed} case {i} ({case.category}): {why}\n"
                  f"  laga {' '.join(case.args)}\n" + (f"  input: {case.note[:300]}\n" if case.note else "") +
                  f"  stderr: {err.strip()[-1500:]}\n"
                  f"  reproduce: {sys.argv[0]} {a.laga} --seed {a.seed} --cases {a.cases} --case {i}", flush=True)
        took = time.monotonic() - t0
        print(f"fuzz: seed {a.seed}, {sum(c['tried'] for c in counts.values())} cases in {took:.1f} s")
        print(f"{'category':10s} {'tried':>6s} {'refused':>8s} {'ok':>5s} {'crash':>6s} {'hang':>5s} {'wrong exit':>11s} "
              f"{'slow':>5s} {'unnamed':>8s} {'no msg':>7s} {'memory':>7s}")
        for cat, c in counts.items():
            print(f"{cat:10s} {c['tried']:6d} {c['refused']:8d} {c['ok']:5d} {c['crash']:6d} {c['hang']:5d} "
                  f"{c['wrong exit']:11d} {c['slow']:5d} {c['unnamed']:8d} {c['no message']:7d} {c['memory']:7d}")
        if a.summary:
            json.dump({"seed": a.seed, "laga": laga, "seconds": took, "categories": counts}, open(a.summary, "w"),
                      indent=2)
        return 0 if failures == 0 or a.report_only else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
