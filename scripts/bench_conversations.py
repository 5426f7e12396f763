#!/usr/bin/env python3
"""Time to first token when conversations alternate, with the prompt cache on and off.

    python scripts/bench_conversations.py [--pair gemma3-270m] [--conversations 3]
        [--rounds 3] [--prompt-tokens 800]

Three conversations (~800 prompt tokens each) take turns on one Engine: each turn appends a
few words to its own conversation, so the turn after a switch shares ~800 tokens with a state
the cache kept aside, and none with the live cache. The time to first token of those turns is
set against the time to first token of a turn that continues the conversation just served
(the live cache holds it). Two Engines are loaded side by side, ``cache_ram`` on and 0, and
every turn runs on both, alternately, so a slow stretch of the machine falls on both sides.

A pair with a chat template (smollm2-135m) is driven with chat messages; one without (the
Gemma pair, a base model) with raw text. Greedy; speculation on; short answers (the first
token is what is timed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgespec import Engine, SamplingParams
from edgespec.registry import resolve_pair

GREEDY = SamplingParams(temperature=0.0)
TOPICS = ("the river port of Lyon", "the bridges of Porto", "the old town of Graz",
          "the canals of Ghent", "the hills of Tbilisi")


def opening(topic: str, n_tokens: int, engine: Engine) -> str:
    """A text about ``topic`` of about ``n_tokens`` tokens (sentences vary, as notes do)."""
    parts, i = [], 0
    while len(engine.tokenize(" ".join(parts))) < n_tokens:
        parts.append(f"Note {i} on {topic}: visitors in year {1800 + 7 * i} counted "
                     f"{3 + i % 11} markets, {i % 5 + 1} churches and {20 + i} inns.")
        i += 1
    return " ".join(parts)


def first_token_seconds(engine: Engine, prompt, raw: bool) -> tuple[float, object]:
    t0 = time.perf_counter()
    s = engine.stream(prompt, raw=raw, max_tokens=8, sampling=GREEDY)
    ttft = None
    for _ in s:
        if ttft is None:
            ttft = time.perf_counter() - t0
    return (ttft if ttft is not None else time.perf_counter() - t0), s.result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default="gemma3-270m")
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=800)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    target, draft = resolve_pair(args.pair)
    engines = {"cache on": Engine.load(target, draft, n_ctx=4096, n_threads=args.threads),
               "cache off": Engine.load(target, draft, n_ctx=4096, n_threads=args.threads,
                                        cache_ram=0)}
    any_engine = engines["cache on"]
    chat = not any_engine.template.is_fallback
    topics = TOPICS[:args.conversations]
    texts = {t: opening(t, args.prompt_tokens, any_engine) for t in topics}
    convs = {side: {t: ([{"role": "system", "content": texts[t]}] if chat else texts[t])
                    for t in topics} for side in engines}
    switch = {side: [] for side in engines}
    cont = {side: [] for side in engines}
    restored = {side: [] for side in engines}
    evaluated = {side: {"switch": [], "continue": []} for side in engines}

    def turn(side: str, topic: str, words: str) -> tuple[float, object]:
        c = convs[side][topic]
        if chat:      # the conversation so far, the answer included, and a new question
            prompt = c + [{"role": "user", "content": words}]
        else:
            prompt = c + " " + words
        seconds, g = first_token_seconds(engines[side], prompt, raw=not chat)
        convs[side][topic] = (prompt + [{"role": "assistant", "content": g.text}] if chat
                              else prompt + g.text)
        return seconds, g

    # every conversation's first turn (cold: the whole prompt is evaluated)
    for topic in topics:
        for side in engines:
            turn(side, topic, "Tell me more.")
    for r in range(args.rounds):
        for topic in topics:
            for side in engines:
                s, g = turn(side, topic, f"And in round {r}?")       # after a switch
                switch[side].append(s)
                restored[side].append(g.stats.prompt_tokens_restored)
                evaluated[side]["switch"].append(g.stats.prompt_tokens_evaluated)
                s, g = turn(side, topic, f"Anything else in round {r}?")   # continuing
                cont[side].append(s)
                evaluated[side]["continue"].append(g.stats.prompt_tokens_evaluated)
    n_prompt = len(any_engine.prompt_tokens(convs["cache on"][topics[0]], raw=not chat))
    print(f"pair {args.pair} ({'chat messages' if chat else 'raw text'}), "
          f"{len(topics)} conversations of ~{n_prompt} prompt tokens, {args.rounds} rounds, "
          f"threads {any_engine.threads['target']}")
    print(f"{'':10} {'TTFT after a switch':>22} {'TTFT continuing':>18} {'ratio':>7}")
    for side in engines:
        sw, co = statistics.median(switch[side]), statistics.median(cont[side])
        print(f"{side:10} {sw * 1000:19.1f} ms {co * 1000:15.1f} ms {sw / co:7.2f}"
              + f"   tokens evaluated: {statistics.median(evaluated[side]['switch']):.0f} "
              f"after a switch, {statistics.median(evaluated[side]['continue']):.0f} "
              "continuing"
              + (f"; restored {statistics.median(restored[side]):.0f} a switch"
                 if side == "cache on" else ""))
    print("cache state:", engines["cache on"].prompt_cache.describe())
    for e in engines.values():
        e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
