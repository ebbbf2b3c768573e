"""summarize beside other processes: --threads auto (the default) against a fixed count of every core, and
llama.cpp on the same GGUF, in one run.

A user's machine is rarely idle. Each condition starts N busy processes (a Python loop each, normal priority) and
keeps them for its runs; under each, every contender summarizes the first --limit example articles with the CLI's
defaults, once per round, the order alternating (A B, B A). The median of the rounds counts.

    specdec auto      `specdec summarize` as it runs by default: all cores, fewer while other processes keep
                      cores busy (decoding/threads.py)
    specdec fixed     the same with --threads <all cores> (what it did before --threads auto)
    llama.cpp         llama-cpp-python on the same GGUF, n_threads = every core (bench.peers; left out when not
                      installed)

Both specdec runs are greedy on the same weights, so their summaries must be equal (a changing thread count
changes no bits); the script says so.

    .venv/bin/python benchmarks/under_load.py --busy 0,1,2 --limit 3 --out benchmarks/under-load.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from specdec_cli.bench.machine import cpu_model
from specdec_cli.bench.runners import examples_dir
from specdec_cli.options import SummarizeOptions
from specdec_cli.tasks import summarize as task

SPIN = "while True: pass"


def busy(n: int) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]
    time.sleep(0.5)
    return procs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", default="0,1,2", help="busy processes per condition, comma-separated")
    ap.add_argument("--limit", type=int, default=3, help="the first N example articles")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    cores = torch.get_num_threads()
    opts = SummarizeOptions()
    articles = [task.read_article(str(p)) for p in sorted((examples_dir() / "articles").glob("*.txt"))[: args.limit]]
    target, draft = task.load_pair(opts, progress=False)
    llama = None
    if not args.no_llama_cpp:
        try:
            import llama_cpp  # noqa: F401

            from specdec_cli.bench.peers import llama_cpp_records

            llama = llama_cpp_records
        except ImportError:
            print("llama.cpp: not installed (pip install llama-cpp-python), left out")
    print(f"# {cpu_model()}, {cores} cores; {len(articles)} articles; CLI defaults", flush=True)

    def specdec(threads: str):
        t0 = time.perf_counter()
        out = task.summarize(target, draft, articles, opts.replace(threads=threads))
        return time.perf_counter() - t0, [s.text for s in out]

    task.summarize(target, draft, articles[:1], opts.replace(max_new_tokens=4))  # untimed: first calls
    results = []
    for n in [int(x) for x in args.busy.split(",")]:
        procs = busy(n)
        try:
            times: dict[str, list[float]] = {"auto": [], "fixed": []}
            texts = {}
            for r in range(args.rounds):
                for name in ("auto", "fixed") if r % 2 == 0 else ("fixed", "auto"):
                    wall, texts[name] = specdec("auto" if name == "auto" else str(cores))
                    times[name].append(wall)
            row = {"busy": n, "auto_s": statistics.median(times["auto"]), "fixed_s": statistics.median(times["fixed"]),
                   "auto_runs_s": times["auto"], "fixed_runs_s": times["fixed"], "same_text": texts["auto"] == texts["fixed"]}
            if llama is not None:
                rec = llama(opts, articles, None, threads=cores, repeat=1)[0]
                row["llama_cpp_s"] = rec.wall_s
                row["llama_cpp_same_text"] = rec.outputs == texts["auto"]
        finally:
            for p in procs:
                p.kill()
                p.wait()
        row["fixed_over_auto"] = row["fixed_s"] / row["auto_s"]
        if "llama_cpp_s" in row:
            row["llama_cpp_over_auto"] = row["llama_cpp_s"] / row["auto_s"]
        results.append(row)
        print(f"{n} busy: auto {row['auto_s']:.2f} s, fixed {cores} threads {row['fixed_s']:.2f} s "
              f"({row['fixed_over_auto']:.2f}x)" + (f", llama.cpp {row['llama_cpp_s']:.2f} s "
              f"({row['llama_cpp_over_auto']:.2f}x)" if "llama_cpp_s" in row else "")
              + ("" if row["same_text"] else "  AUTO AND FIXED DIFFER"), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"cpu": cpu_model(), "cores": cores, "articles": [a.name for a in articles],
                                              "rounds": args.rounds, "command": " ".join(sys.argv), "results": results},
                                             indent=1) + "\n")
    return 0 if all(r["same_text"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
