"""Runs the fuzz targets of tests/fuzz/targets.py with atheris.

    python tests/fuzz/run.py --minutes M [--targets a,b,...] [--json OUT]
    python tests/fuzz/run.py --seconds-per-target S      (the test suite's short run)

Each target runs in its own process (atheris fuzzes once per process) for its share of the
time, starting from its seed corpus tests/fuzz/corpus/<target>/ (new interesting inputs are
added to a scratch copy, not to the committed seeds). A crash, an unexpected exception or a
sanitizer report stops that target and leaves the input as crash-<target>-*; copy it into
the target's corpus as a regression input once fixed.

For the ASan/UBSan build (make sanitize-build), run with the sanitizer runtime preloaded:
    make fuzz-asan MINUTES=M          (sets LD_PRELOAD and ASAN_OPTIONS, see the Makefile)
The JSON records executions, crashes and whether a sanitizer runtime was loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def _one(target: str, seconds: float, corpus: str, artifacts: str, seed: int = 0) -> None:
    import atheris

    sys.path.insert(0, HERE)
    with atheris.instrument_imports(include=["recflash", "targets"]):
        import targets  # noqa: F401
        import recflash.ingest.sources  # noqa: F401
        import recflash.ingest.hexids  # noqa: F401
    fn = targets.TARGETS[target]
    # warm up the template stores before fuzzing starts (not counted as an input)
    if target.startswith("store_") or target == "meta_values":
        targets._template("clean")
    atheris.Setup([sys.argv[0], corpus, f"-max_total_time={int(max(1, seconds))}", "-print_final_stats=1",
                   f"-artifact_prefix={artifacts}/crash-{target}-", "-rss_limit_mb=4096", "-timeout=60",
                   f"-seed={int(seed)}"],
                  fn)
    atheris.Fuzz()


def run(targets: list[str], seconds: float, out_dir: str, seed: int = 0) -> list[dict]:
    rows = []
    for t in targets:
        work = tempfile.mkdtemp(prefix=f"fuzz-{t}-", dir=out_dir)
        corpus = os.path.join(work, "corpus")
        seeds = os.path.join(CORPUS, t)
        if os.path.isdir(seeds):
            shutil.copytree(seeds, corpus)
        else:
            os.makedirs(corpus)
        t0 = time.time()
        r = subprocess.run([sys.executable, "-P", os.path.abspath(__file__), "--one", t, "--seconds", str(seconds),
                            "--corpus", corpus, "--artifacts", work, "--seed", str(seed)], capture_output=True, text=True,
                           timeout=seconds + 600)
        execs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", r.stderr)
        # crash-, timeout- and oom- artifacts are findings; slow-unit- ones only mark an input
        # that took long (a store open on a loaded machine), not a failure
        crashes = [f for f in os.listdir(work) if f.startswith("crash-") and "-slow-unit-" not in f]
        sanitizer = "ERROR: AddressSanitizer" in r.stderr or "runtime error:" in r.stderr
        row = {"target": t, "seconds": round(time.time() - t0, 1), "executions": int(execs[-1]) if execs else 0,
               "crashes": len(crashes), "sanitizer_reports": int(sanitizer), "returncode": r.returncode,
               "corpus_inputs": len(os.listdir(corpus))}
        if crashes or r.returncode not in (0,) or sanitizer:
            keep = os.path.join(out_dir, f"findings-{t}")
            os.makedirs(keep, exist_ok=True)
            for f in crashes:
                shutil.copy(os.path.join(work, f), keep)
            with open(os.path.join(keep, "stderr.txt"), "w") as f:
                f.write(r.stderr[-20000:])
            row["findings_dir"] = keep
            row["stderr_tail"] = r.stderr[-1500:]
        shutil.rmtree(work, ignore_errors=True)
        rows.append(row)
        print(f"  {t:18s} {row['executions']:>10,d} execs  {row['seconds']:7.1f} s  crashes={row['crashes']} "
              f"sanitizer={row['sanitizer_reports']} rc={row['returncode']}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=None, help="total time, split evenly over the targets")
    ap.add_argument("--seconds-per-target", type=float, default=None)
    ap.add_argument("--targets", default=None, help="comma-separated (default: all)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default=None, help="where findings are kept (default: a temp dir)")
    ap.add_argument("--seed", type=int, default=0,
                    help="libFuzzer's seed: 0 draws one (long runs explore); a fixed seed repeats the same "
                         "mutation sequence, so the test suite's short run is reproducible")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--artifacts", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        _one(args.one, args.seconds, args.corpus, args.artifacts, args.seed)
        return 0
    sys.path.insert(0, HERE)
    import targets as tmod

    names = args.targets.split(",") if args.targets else list(tmod.TARGETS)
    unknown = [n for n in names if n not in tmod.TARGETS]
    if unknown:
        ap.error(f"unknown targets {unknown}; known: {list(tmod.TARGETS)}")
    if args.seconds_per_target is None:
        args.seconds_per_target = (args.minutes if args.minutes is not None else 1.0) * 60 / len(names)
    out_dir = args.out or tempfile.mkdtemp(prefix="recflash-fuzz-run-")
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    load0 = os.getloadavg()
    rows = run(names, args.seconds_per_target, out_dir, args.seed)
    res = {"targets": rows, "total_executions": sum(r["executions"] for r in rows),
           "crashes": sum(r["crashes"] for r in rows), "sanitizer_reports": sum(r["sanitizer_reports"] for r in rows),
           "failed_targets": [r["target"] for r in rows if r["returncode"] != 0],
           "sanitizer_runtime": os.environ.get("LD_PRELOAD", ""), "asan_options": os.environ.get("ASAN_OPTIONS", ""),
           "seed": args.seed, "seconds": round(time.time() - t0, 1), "load_average_start": [round(x, 2) for x in load0],
           "load_average_end": [round(x, 2) for x in os.getloadavg()], "findings_dir": out_dir}
    print(json.dumps({k: res[k] for k in ("total_executions", "crashes", "sanitizer_reports", "failed_targets")}))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if not res["crashes"] and not res["sanitizer_reports"] and not res["failed_targets"] else 1


if __name__ == "__main__":
    sys.exit(main())
