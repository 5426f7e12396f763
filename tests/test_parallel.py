"""Several streams on one Engine (edgespec/lanes.py, rounds.py): each stream's output is the
target's alone, whatever its neighbours.

1. Statistical, in numpy: three streams decode at once through the real rounds, lanes, loop
   and drafters over a Markov context of three sequences (tests/markov.py), with different
   sampling settings (sampled with drafts, greedy, seeded with an adaptive drafter whose
   lengths are planned jointly); the sampled stream's output must pass the same goodness-of-fit
   tests as a stream alone (tests/test_lossless_stats.py), and a broken acceptance rule must
   fail them the same way. The passes must really have been shared.
2. Real models (SmolLM2-135M F32 target, Q4_1 draft, three lanes): greedy answers batched equal
   each alone (or differ first at a near-tie of the target's logits); seeded answers likewise;
   a stream cancelled mid-answer leaves the others' answers intact.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from edgespec import Engine, SamplingParams
from edgespec.errors import EngineBusyError
from edgespec.drafting import AdaptiveLength, Costs, FixedLength, ModelDrafter
from edgespec.drafting.batch import Ask, BatchCosts, plan_round
from edgespec.engine.lanes import Lanes
from edgespec.results import LoopStats
from edgespec.speculative import decode

from markov import MarkovContext
from test_lossless_stats import MAIN, N_NEW, N_RUNS, check_caught, check_matches_plain
from test_real_models import NEAR_TIE, check_greedy_equivalent

GREEDY = SamplingParams(temperature=0.0)


def run_interleaved(runs: int = N_RUNS, turns: bool = False) -> tuple[np.ndarray, MarkovContext]:
    """Stream 0 samples at T = 1 with K = 4 drafts (``runs`` answers of N_NEW tokens, the ones
    checked); stream 1 decodes greedily with K = 2; stream 2 samples seeded at T = 0.6 with an
    adaptive drafter planned with the others'. Streams 1 and 2 go on until stream 0 is done.
    ``turns``: the streams take turns (engine/rounds.py), one stream's round per pass."""
    costs = Costs({1: 1.0, 2: 1.1, 9: 1.8}, 0.05)
    target = MarkovContext(MAIN.target, n_seq=3)
    draft = MarkovContext(MAIN.draft, n_seq=3)
    lanes = Lanes(target, draft, None, 3, plan=lambda asks: plan_round(
        asks, BatchCosts(costs.bare, 0.0, lambda b: 0.05 + 0.01 * (np.asarray(b) - 1))))
    if turns:
        lanes.rounds.take_turns_when(lambda: True)
    done = threading.Event()
    out = np.zeros((runs, N_NEW), dtype=np.int64)
    errors: list[BaseException] = []

    def stream(i: int) -> None:
        lane = lanes.lanes[i]
        lanes.rounds.join(lane.member)
        try:
            if i == 2:
                policy = AdaptiveLength(costs, k_max=8)
                policy.joint = lambda rates, cap, alone: lane.plan(Ask(rates, cap, alone))
            else:
                policy = FixedLength(4 if i == 0 else 2)
            drafter = ModelDrafter(lane.draft, frozenset(), policy)
            params = [SamplingParams.neutral(1.0), GREEDY,
                      SamplingParams.neutral(0.6)][i]
            rng = np.random.default_rng(11 + i)
            r = 0
            while (r < runs) if i == 0 else not done.is_set():
                context = list(MAIN.context)
                lane.target.truncate(0)
                lane.target.eval(context[:-1], 0)
                drafter.rollback(0)
                run_params = params.replace(seed=r) if i == 2 else params
                tokens = [s.token for s in decode(lane.target, context, params=run_params,
                                                  rng=rng, max_tokens=N_NEW, drafter=drafter,
                                                  stats=LoopStats())]
                if i == 0:
                    out[r] = tokens
                r += 1
        except BaseException as e:  # noqa: BLE001 - raised in the test's thread below
            errors.append(e)
        finally:
            if i == 0:
                done.set()
            lanes.rounds.leave(lane.member)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out, target


@pytest.mark.slow
def test_a_stream_among_others_keeps_the_targets_distribution():
    seqs, target = run_interleaved()
    assert target.parts > 2.5 * target.calls         # the three streams shared their passes
    check_matches_plain(seqs)


@pytest.mark.slow
def test_a_stream_taking_turns_with_others_keeps_the_targets_distribution():
    # Half the runs of the test above (one stream's round a pass hands the models from thread
    # to thread four times as often): the broken rule below is caught over a quarter of them.
    seqs, target = run_interleaved(N_RUNS // 2, turns=True)
    assert target.parts == target.calls              # one stream's rows a pass
    check_matches_plain(seqs)


@pytest.mark.slow
def test_a_broken_rule_among_other_streams_is_caught(monkeypatch):
    """Negative control: accepting every draft token, the interleaved stream emits the skewed
    draft's distribution, and the same test sees it."""
    import edgespec.speculative as spec
    monkeypatch.setattr(spec, "verify_block",
                        lambda x, q, p, rng, n_vocab: (len(x), p(len(x)).sample(rng)))
    seqs, _ = run_interleaved(N_RUNS // 4)
    check_caught(seqs, at_least=3)


def test_a_prompt_chunk_is_counted_by_its_tokens_and_teaches_no_cost():
    """A pass holding a prompt's chunk (its tokens, no logits) is counted in the rows per pass
    by the tokens it evaluated, and the costs are told only of decoding passes (a chunk's
    logits are not its size: counted so, its seconds went into the table as a pass of 0 or 1
    rows, and 0 divided the attention estimate)."""
    from edgespec.engine.rounds import Member, Rounds
    told = []
    model = MarkovContext(MAIN.target, n_seq=2)
    rounds = Rounds([model], on_pass=lambda *a: told.append(a))
    member = Member()
    rounds.join(member)
    rounds.eval_part(member, model, model.sequences[0], [1, 2, 3, 1, 2, 3], 0)
    rounds.eval_part(member, model, model.sequences[0], [1, 2], 2)
    rounds.leave(member)
    assert rounds.rows_per_pass == [6, 2]
    assert [(target, rows) for target, rows, _, _ in told] == [(True, 2)]


def test_a_prompt_pass_waits_for_a_stream_on_its_way_in_no_longer_than_its_hold(monkeypatch):
    """Clients sending at once reach the Engine milliseconds apart: a prompt pass that could
    fire waits while a stream is on its way in (submitted, not yet joined), so that its
    prompt is read in the same pass; not once it says it will not come soon (it queues for a
    lane), and never longer than the hold (a stream created and never read)."""
    from edgespec.engine import rounds as rounds_module
    from edgespec.engine.rounds import Member, Rounds
    monkeypatch.setattr(rounds_module, "HOLD", 1e6)     # the hold is HOLD_MAX, however
    monkeypatch.setattr(rounds_module, "HOLD_MAX", 0.6)     # short the passes measured
    model = MarkovContext(MAIN.target, n_seq=2)
    rounds = Rounds([model])

    def prompt(member: Member, seq: int, tokens: list, arrival=None, after: float = 0.0):
        time.sleep(after)
        member.prompting = True
        rounds.join(member, arrival)
        rounds.eval_part(member, model, model.sequences[seq], tokens, 1)
        member.prompting = False
        rounds.parked(member)               # (its reader has the first token)

    first, second = Member(), Member()
    with rounds.arriving() as key:          # the second stream is on its way in
        pass
    late = threading.Thread(target=prompt, args=(second, 1, [4, 5], key, 0.1))
    late.start()
    t0 = time.monotonic()
    prompt(first, 0, [1, 2, 3])
    late.join()
    assert rounds.rows_per_pass == [5], "the second prompt missed the first's pass"
    assert time.monotonic() - t0 < 0.5
    rounds.leave(first), rounds.leave(second)

    # One on its way that never joins holds the next prompt pass for the hold, no longer.
    with rounds.arriving():
        pass
    t0 = time.monotonic()
    prompt(first, 0, [0])
    assert 0.6 <= time.monotonic() - t0 < 3.0
    rounds.leave(first)
    # One that says it will not come soon (it queues for a lane) holds nothing.
    with rounds.arriving() as key:
        pass
    rounds.arrived(key)
    t0 = time.monotonic()
    prompt(second, 1, [1])
    assert time.monotonic() - t0 < 0.3
    assert rounds.rows_per_pass == [5, 1, 1]
    rounds.close()


# --- real models -----------------------------------------------------------------------------

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
           "Once upon a time there was a small robot who"]


@pytest.fixture(scope="module")
def eng(smollm2_f32_path, smollm2_q4_path):
    """Three streams at once on the KV cells of two whole contexts (engine/lanes.py): every
    test below runs its streams on shared cells."""
    with Engine.load(smollm2_f32_path, smollm2_q4_path, n_ctx=1024, parallel=2,
                     streams=3) as e:
        yield e


def together(eng: Engine, sampling: SamplingParams, n: int = 48, prompts=PROMPTS) -> dict:
    """Each prompt's answer, all generated at once (from a thread each)."""
    out, errors = {}, []
    start = threading.Barrier(len(prompts))

    def run(p: str) -> None:
        try:
            start.wait()
            out[p] = eng.generate(p, raw=True, max_tokens=n, sampling=sampling)
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


def test_greedy_answers_batched_equal_each_alone(eng, smollm2_f32_path):
    alone = {p: eng.generate(p, raw=True, max_tokens=48, sampling=GREEDY) for p in PROMPTS}
    passes = eng.lanes.rounds.passes
    batched = together(eng, GREEDY)
    assert eng.lanes.rounds.passes > passes      # some passes held several streams
    for p in PROMPTS:
        check_greedy_equivalent(smollm2_f32_path, eng.prompt_tokens(p, raw=True),
                                alone[p].tokens, batched[p].tokens, NEAR_TIE)
        assert batched[p].finish_reason == alone[p].finish_reason


def test_while_the_batch_gate_says_plain_the_streams_draft_nothing(eng, monkeypatch,
                                                                   smollm2_f32_path):
    """Several streams draft only while drafting measures faster than plain batching
    (drafting/gate.py): with the gate at plain, no batched stream drafts, the answers are
    still each alone's, and the rounds count every token the streams committed."""
    alone = {p: eng.generate(p, raw=True, max_tokens=32, sampling=GREEDY) for p in PROMPTS}
    gate = eng._drafting.gate
    assert gate is not None
    monkeypatch.setattr(gate, "drafts", lambda: False)
    committed = eng.lanes.rounds.committed
    batched = together(eng, GREEDY, 32)
    made = sum(len(batched[p].tokens) for p in PROMPTS)
    # (each stream's first token comes from its prompt's pass, its last is never verified)
    assert made - 2 * len(PROMPTS) <= eng.lanes.rounds.committed - committed <= made
    for p in PROMPTS:
        assert batched[p].stats.drafted == 0
        check_greedy_equivalent(smollm2_f32_path, eng.prompt_tokens(p, raw=True),
                                alone[p].tokens, batched[p].tokens, NEAR_TIE)


def test_while_the_streams_take_turns_each_pass_is_one_streams_and_answers_are_alone(
        eng, monkeypatch, smollm2_f32_path):
    """When sharing passes measures slower than running the streams in turn (drafting/
    gate.py), the rounds serve one stream at a time (engine/rounds.py): every decoding pass
    holds one stream's rows, each stream drafts as it would alone, and the answers are each
    alone's."""
    alone = {p: eng.generate(p, raw=True, max_tokens=32, sampling=GREEDY) for p in PROMPTS}
    gate, rounds = eng._drafting.gate, eng.lanes.rounds
    monkeypatch.setattr(gate, "regime", "turns")
    monkeypatch.setattr(gate, "_roll", lambda n: None)      # (held there for the test)
    assert rounds.turns == gate.turns        # (the rounds ask the gate)
    streams_per_pass = []
    run = rounds._run

    def watched(model, group):
        if not any(r.member.prompting for r in group):
            streams_per_pass.append(len({r.member for r in group}))
        return run(model, group)
    monkeypatch.setattr(rounds, "_run", watched)
    batched = together(eng, GREEDY, 32)
    assert streams_per_pass and set(streams_per_pass) == {1}
    assert all(batched[p].stats.drafted > 0 for p in PROMPTS)
    for p in PROMPTS:
        check_greedy_equivalent(smollm2_f32_path, eng.prompt_tokens(p, raw=True),
                                alone[p].tokens, batched[p].tokens, NEAR_TIE)


def test_streams_beyond_parallel_run_while_what_they_reach_fits(eng):
    """Three lanes share the cells of two contexts: three short answers hold all three lanes
    at once (from one thread: none waits); two answers whose max_tokens is the context may
    each reach a whole context, so a third waits for their cells though a lane is free (from
    the thread that holds them it would wait for itself: EngineBusyError), and enters when
    one ends."""
    lanes = eng.lanes
    assert lanes.n == 3 and lanes.cells == 2 * eng.n_ctx
    for m in (eng.target, eng.draft):       # (the same tokenizer: the draft shares too)
        assert m.config.n_cells == 2 * eng.n_ctx and len(m.sequences) == 3
    alone = {p: eng.generate(p, raw=True, max_tokens=12, sampling=GREEDY) for p in PROMPTS}
    streams = [eng.stream(p, raw=True, max_tokens=12, sampling=GREEDY) for p in PROMPTS]
    for s in streams:
        next(s)
    assert len(lanes.owners) == 3 and lanes.waiting == 0
    for p, s in zip(PROMPTS, streams):
        list(s)
        assert len(s.result.tokens) == len(alone[p].tokens)

    whole = eng.n_ctx - 16       # (the server's "no limit": to the context's end)
    a = eng.stream(PROMPTS[0], raw=True, max_tokens=whole, sampling=GREEDY)
    b = eng.stream(PROMPTS[1], raw=True, max_tokens=whole, sampling=GREEDY)
    next(a), next(b)
    assert len(lanes.owners) == 2
    with pytest.raises(EngineBusyError):
        next(eng.stream(PROMPTS[2], raw=True, max_tokens=4, sampling=GREEDY))
    done = {}
    late = threading.Thread(target=lambda: done.setdefault("r", eng.generate(
        PROMPTS[2], raw=True, max_tokens=4, sampling=GREEDY)))
    late.start()
    deadline = time.monotonic() + 30
    while lanes.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert lanes.waiting == 1 and "r" not in done and len(lanes.owners) == 2
    a.close()
    late.join(60)
    assert len(done["r"].tokens) == 4 and done["r"].finish_reason == "length"
    b.close()
    assert not eng.busy and lanes.waiting == 0


def test_blas_runs_on_one_thread_while_an_engine_is_open(eng):
    """numpy's BLAS threads spin after a product on the cores llama.cpp's threads need
    (engine/threads.py): held to one while an Engine is open, and given back its count when
    the last one closes (the real library, through threadpoolctl)."""
    from threadpoolctl import threadpool_info

    from edgespec.drafting.reduced_head import OneThreadBlas
    from edgespec.engine.threads import BlasHold
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    assert blas and all(i["num_threads"] == 1 for i in blas)
    libs = OneThreadBlas.libraries()
    assert libs
    holders, before = BlasHold._holders, BlasHold._before
    try:
        # As if no Engine were open, with a count of 2: two engines open, then closed.
        BlasHold._holders, BlasHold._before = 0, []
        for lib in libs:
            lib.set_num_threads(2)
        BlasHold.acquire()
        BlasHold.acquire()
        BlasHold.release()
        assert [lib.get_num_threads() for lib in libs] == [1] * len(libs)
        BlasHold.release()
        assert [lib.get_num_threads() for lib in libs] == [2] * len(libs)
    finally:
        BlasHold._holders, BlasHold._before = holders, before
        for lib in libs:
            lib.set_num_threads(1)


def test_seeded_answers_batched_equal_each_alone(eng):
    """A seed's text does not depend on the drafts, nor on the streams beside it (the keyed
    noise is the position's and the token's): equal token for token, where the numerics of a
    batch and of a lone pass agree (F32: no near-tie was met here)."""
    params = SamplingParams(temperature=0.8, seed=7)
    alone = {p: eng.generate(p, raw=True, max_tokens=32, sampling=params) for p in PROMPTS}
    batched = together(eng, params, 32)
    for p in PROMPTS:
        assert batched[p].tokens == alone[p].tokens, p


def test_a_stream_cancelled_mid_answer_leaves_the_others_whole(eng):
    alone = {p: eng.generate(p, raw=True, max_tokens=40, sampling=GREEDY) for p in PROMPTS[1:]}
    victim = eng.stream(PROMPTS[0], raw=True, max_tokens=200, sampling=GREEDY)
    results = {}

    def run(p: str) -> None:
        results[p] = eng.generate(p, raw=True, max_tokens=40, sampling=GREEDY)
    threads = [threading.Thread(target=run, args=(p,)) for p in PROMPTS[1:]]
    for t in threads:
        t.start()
    for i, _ in enumerate(victim):
        if i == 5:
            victim.cancel()
    for t in threads:
        t.join()
    assert victim.result.finish_reason == "cancelled"
    for p in PROMPTS[1:]:
        assert results[p].tokens == alone[p].tokens
    assert not eng.busy and eng.lanes.waiting == 0


def test_gemma_greedy_answers_batched_equal_each_alone(gemma_f32_path, gemma_q4_path):
    """The same on the Gemma pair (262k vocabulary, the draft's reduced head per lane); a
    near-tie here is a gap under 0.02, as Gemma F32's batched and one-token logits differ by
    up to 0.016 (docs/decisions.md, "A draft of another family")."""
    with Engine.load(gemma_f32_path, gemma_q4_path, n_ctx=512, parallel=2, streams=3) as g:
        alone = {p: g.generate(p, raw=True, max_tokens=32, sampling=GREEDY) for p in PROMPTS}
        batched = together(g, GREEDY, 32)
        for p in PROMPTS:
            check_greedy_equivalent(gemma_f32_path, g.prompt_tokens(p, raw=True),
                                    alone[p].tokens, batched[p].tokens, 0.02)
