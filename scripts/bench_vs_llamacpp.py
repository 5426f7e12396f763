#!/usr/bin/env python3
"""edgespec against llama.cpp's own C++ `llama-speculative-simple`, same pair, same prompts.

    python scripts/bench_vs_llamacpp.py \
        --binary .cache/llama.cpp-build/bin/llama-speculative-simple \
        --target T.gguf --draft D.gguf [--n-max 3,8,16] [-n 128] [--repeats 2]

Build the binary with scripts/build_llama_speculative.sh. Runs are interleaved (edgespec, then
the C++ example at each --spec-draft-n-max, rotating per prompt) and both report decoding
speed only (prompt processing excluded), greedy, 2 threads unless --threads says otherwise.

With `--prompts tasks --tasks code_edit,chat` the prompts are the task bench's, rendered by the
target's chat template (the C++ example gets the rendered text), each answered whole as the
task bench does (a code edit up to its file's budget), every edgespec generation from cold
caches; `--spec draft-simple:4,draft-simple:16,ngram-simple,ngram-mod` chooses llama.cpp's
drafting modes (`draft-simple:N` is `--n-max N` of the draft model). The table then gives
both decoding tok/s and whole answers' seconds (prompt included), with acceptance.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

from edgespec import Engine, SamplingParams
from edgespec.bench.prompts import PROMPT_SETS
from edgespec.config import default_threads

DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
N_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")


def cpp_extra_args() -> list:
    """``--no-repack`` where edgespec's preflight found that llama.cpp's extra CPU kernels
    (AMX, repacked weights) kill the process on this CPU: the binary is built from the same
    llama.cpp sources, natively, for the same CPU (it dies the same way, exit 132)."""
    from edgespec.backend.preflight import verdict
    return ["--no-repack"] if verdict().faults else []


def run_cpp(binary, target, draft, prompt, n, n_max, threads, mode="draft-simple",
            whole=False):
    """(tokens decoded, decoding seconds), or with ``whole`` also the prompt's seconds and
    (drafted, accepted)."""
    spec = ["--spec-type", mode] + (["--spec-draft-n-max", str(n_max)]
                                    if mode == "draft-simple" else [])
    proc = subprocess.run(
        [binary, "-m", target, "-md", draft, "-p", prompt, "-n", str(n), "--temp", "0",
         *spec, "-t", str(threads), "-c", "4096", *cpp_extra_args()],
        capture_output=True, text=True, timeout=1800)
    m, e = DECODED.search(proc.stderr), ENCODED.search(proc.stderr)
    if not m or not e:
        sys.exit(f"error: could not parse {binary} output:\n{proc.stderr[-2000:]}")
    if not whole:
        return int(m.group(1)), float(m.group(2))
    d, a = DRAFTED.search(proc.stderr), N_ACCEPT.search(proc.stderr)
    return (int(m.group(1)), float(m.group(2)), float(e.group(2)),
            (int(d.group(1)) if d else 0, int(a.group(1)) if a else 0))


def tasks_main(args) -> int:
    """The task bench's prompts, whole answers, edgespec's default and plain against llama.cpp's
    modes, interleaved (the order rotating per prompt)."""
    import itertools

    from edgespec.bench.long_prompts import cold
    from edgespec.bench.task_bench import edit_budget, edit_file_tokens
    from edgespec.bench.tasks import task_prompts
    from edgespec.engine.request import GenerationRequest

    modes = [m.partition(":") for m in args.spec.split(",")]
    names = ["edgespec default", "edgespec plain"] + [
        f"llama.cpp {m}" + (f" {k}" if k else "") for m, _, k in modes]
    greedy = SamplingParams(temperature=0.0)
    keys = itertools.count()
    rows = {}
    with Engine.load(target=args.target, draft=args.draft, n_threads=args.threads) as eng:
        files = edit_file_tokens(eng)
        for task in args.tasks.split(","):
            tot = {k: [0, 0.0, 0.0, 0, 0] for k in names}  # tokens, decode s, whole s, dr, acc
            for i, prompt in enumerate(task_prompts()[task]):
                ids = eng.prompt_tokens(prompt)
                n = args.max_tokens
                if task == "code_edit":
                    n = edit_budget(files[i], len(ids), eng.n_ctx)
                text = b"".join(eng.target.vocabulary.piece(t, special=True)
                                for t in ids).decode("utf-8", "replace")
                for name in names[i % len(names):] + names[:i % len(names)]:
                    t = tot[name]
                    if name.startswith("edgespec"):
                        cold(eng)
                        req = GenerationRequest(prompt, max_tokens=n, sampling=greedy,
                                                speculative=name.endswith("default"),
                                                index_key=f"vs-llamacpp-{next(keys)}")
                        stream = eng.submit(req)
                        for _ in stream:
                            pass
                        st = stream.result.stats
                        got = (st.completion_tokens, st.decode_seconds,
                               st.prompt_seconds + st.decode_seconds, st.drafted, st.accepted)
                    else:
                        _, mode, *k = name.split()
                        tok, dec, enc, (dr, ac) = run_cpp(args.binary, args.target,
                                                          args.draft, text, n,
                                                          int(k[0]) if k else 0,
                                                          args.threads, mode, whole=True)
                        got = (tok, dec, enc + dec, dr, ac)
                    for j, v in enumerate(got):
                        t[j] += v
                print(f"{task} {i + 1}: " + ", ".join(
                    f"{k} {v[0] / v[1]:.1f} tok/s" for k, v in tot.items() if v[1]),
                    file=sys.stderr, flush=True)
            rows[task] = tot
    plain = "edgespec plain"
    print(f"{'':26}{'tok/s':>8}{'whole s':>9}{'x plain':>8}{'accept':>8}")
    for task, tot in rows.items():
        print(task)
        for k, (n, dec, whole, dr, ac) in tot.items():
            acc = f"{ac / dr:.0%}" if dr else "-"
            print(f"  {k:24}{n / dec:8.1f}{whole:9.1f}{tot[plain][2] / whole:8.2f}{acc:>8}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--n-max", default="3,8,16")
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", default="default", choices=sorted(PROMPT_SETS) + ["tasks"])
    ap.add_argument("--tasks", default="code_edit,chat")
    ap.add_argument("--spec", default="draft-simple:4,draft-simple:16,ngram-simple,ngram-mod")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=default_threads())
    args = ap.parse_args()
    if args.prompts == "tasks":
        return tasks_main(args)
    n_maxes = [int(x) for x in args.n_max.split(",")]
    names = ["edgespec default", "edgespec plain"] + [f"llama.cpp n-max {k}" for k in n_maxes]
    tot = {k: [0, 0.0] for k in names}
    greedy = SamplingParams(temperature=0.0)
    with Engine.load(target=args.target, draft=args.draft, n_threads=args.threads) as eng:
        prompts = PROMPT_SETS[args.prompts]
        for r in range(args.repeats):
            for i, prompt in enumerate(prompts):
                order = names[(i + r) % len(names):] + names[:(i + r) % len(names)]
                for name in order:
                    if name.startswith("edgespec"):
                        out = eng.generate(prompt, max_tokens=args.max_tokens, sampling=greedy,
                                           raw=True, speculative=name.endswith("default"))
                        n, s = out.stats.completion_tokens, out.stats.decode_seconds
                    else:
                        n, s = run_cpp(args.binary, args.target, args.draft, prompt,
                                       args.max_tokens, int(name.split()[-1]), args.threads)
                    tot[name][0] += n
                    tot[name][1] += s
                print(f"after prompt {i + 1}/{len(prompts)} (running totals): " + ", ".join(
                    f"{k} {v[0] / v[1]:.1f}" for k, v in tot.items() if v[1]), file=sys.stderr)
    print(f"{'':22}{'tok/s':>8}")
    for k, (n, s) in tot.items():
        print(f"{k:22}{n / s:8.1f}")
    best_cpp = max(n / s for k, (n, s) in tot.items() if k.startswith("llama.cpp"))
    default = tot["edgespec default"][0] / tot["edgespec default"][1]
    print(f"edgespec default / best llama.cpp: {default / best_cpp:.2f}x")
    mine, plain = (tot[k][0] / tot[k][1] for k in ("edgespec default", "edgespec plain"))
    print(f"edgespec default / edgespec plain: {mine / plain:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
