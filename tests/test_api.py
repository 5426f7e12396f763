"""The embeddable Python API under threads, cancellation and close, on the real SmolLM2 pair.

"Equal to a fresh engine" means equal to what an Engine that has done nothing else produces
for the same greedy request: the caches a cancelled or closed generation leaves behind must
not change the next answer.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from edgespec import (BackendError, Engine, EngineBusyError, EngineClosedError,
                      GenerationRequest, SamplingParams)

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
           "List three colours of the rainbow:", "Once upon a time there was a small robot who"]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"      # the model keeps counting: long generations
N = 24


def load(paths, **kw):
    # One llama.cpp thread: these tests are about Python threads calling the Engine, and on a
    # shared 2-core machine ggml's spinning worker threads make every step many times slower.
    return Engine.load(target=paths[0], draft=paths[1], n_ctx=1024, n_threads=1, **kw)


@pytest.fixture(scope="module")
def paths(smollm2_f32_path, smollm2_q4_path):
    return smollm2_f32_path, smollm2_q4_path


@pytest.fixture(scope="module")
def reference(paths):
    """Greedy outputs of a fresh engine for each prompt (each prompt on its own engine)."""
    out = {}
    for prompt in PROMPTS + [COUNTING]:
        with load(paths) as eng:
            out[prompt] = eng.generate(prompt, max_tokens=N, sampling=GREEDY, raw=True).tokens
    return out


@pytest.fixture(scope="module")
def eng(paths):
    with load(paths) as e:
        yield e


def gen(eng, prompt, n=N):
    return eng.generate(prompt, max_tokens=n, sampling=GREEDY, raw=True)


def consume(stream, on_event=None, delay=0.0):
    """Iterate in this thread; returns the events."""
    events = []
    for ev in stream:
        events.append(ev)
        if on_event:
            on_event(len(events))
        time.sleep(delay)
    return events


# ---------------------------------------------------------------------------------------------
# Threads


def test_threads_are_serialised_and_each_output_equals_its_reference(eng, reference):
    results: dict = {}
    errors = []
    start = threading.Barrier(len(PROMPTS))

    def worker(prompt):
        try:
            start.wait()
            results[prompt] = [gen(eng, prompt).tokens for _ in range(2)]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for prompt in PROMPTS:
        assert results[prompt] == [reference[prompt]] * 2, prompt
    assert not eng.busy and eng.waiting == 0


def test_streams_consumed_in_two_threads_do_not_interleave(eng, reference):
    """The second stream waits for the first to end, though both are being iterated."""
    a = eng.stream(PROMPTS[0], max_tokens=N, sampling=GREEDY, raw=True)
    b = eng.stream(PROMPTS[1], max_tokens=N, sampling=GREEDY, raw=True)
    order = []
    ta = threading.Thread(target=consume, args=(a, lambda n: order.append("a"), 0.01))
    tb = threading.Thread(target=consume, args=(b, lambda n: order.append("b")))
    ta.start()
    while not eng.busy:
        time.sleep(0.001)
    tb.start()
    ta.join(60)
    tb.join(60)
    assert "b" in order and order == sorted(order)
    assert a.result.tokens == reference[PROMPTS[0]]
    assert b.result.tokens == reference[PROMPTS[1]]


# ---------------------------------------------------------------------------------------------
# Cancellation


def test_cancel_from_another_thread_stops_within_one_step(eng, reference):
    stream = eng.stream(COUNTING, max_tokens=400, sampling=GREEDY, raw=True)
    reached = threading.Event()
    seen = [0]

    def on_event(n):
        seen[0] = n
        if n == 6:
            reached.set()

    t = threading.Thread(target=consume, args=(stream, on_event, 0.01))
    t.start()
    assert reached.wait(60)
    n_at_cancel = seen[0]
    eng.cancel()
    t.join(30)
    assert not t.is_alive()
    res = stream.result
    assert res.finish_reason == "cancelled"
    # the step in flight may still deliver its token; nothing after it
    assert n_at_cancel <= len(res.tokens) <= n_at_cancel + 2
    assert res.tokens == reference[COUNTING][:len(res.tokens)]
    assert not eng.busy
    # caches hold exactly what was generated, so the next answer is a fresh engine's
    assert eng.target.tokens == (eng.prompt_tokens(COUNTING, raw=True) + res.tokens)[:-1]
    for prompt in PROMPTS[:2]:
        assert gen(eng, prompt).tokens == reference[prompt]


def test_closing_the_stream_mid_generation(eng, reference):
    stream = eng.stream(COUNTING, max_tokens=400, sampling=GREEDY, raw=True)
    got = [next(stream) for _ in range(7)]
    stream.close()
    assert stream.result.finish_reason == "cancelled"
    assert stream.result.tokens == [e.token for e in got]
    assert stream.result.text == "".join(e.text for e in got)
    with pytest.raises(StopIteration):
        next(stream)
    assert not eng.busy
    assert gen(eng, PROMPTS[2]).tokens == reference[PROMPTS[2]]


def test_dropping_an_unfinished_stream_frees_the_engine_at_once(eng, reference):
    stream = eng.stream(COUNTING, max_tokens=400, sampling=GREEDY, raw=True)
    for _ in range(3):
        next(stream)
    assert eng.busy
    del stream               # no close(): the last reference going away ends it
    assert not eng.busy
    assert gen(eng, PROMPTS[3]).tokens == reference[PROMPTS[3]]


def test_cancel_during_prompt_processing(paths, reference):
    with Engine.load(target=paths[0], draft=paths[1], n_ctx=2048, n_batch=32,
                     n_threads=1) as e:
        prompt = "The quick brown fox jumps over the lazy dog. " * 120   # ~1300 tokens
        n_prompt = len(e.prompt_tokens(prompt, raw=True))
        stream = e.stream(prompt, max_tokens=8, sampling=GREEDY, raw=True)
        t = threading.Thread(target=consume, args=(stream,))
        t.start()
        while len(e.target.tokens) < 64:       # a few batches into the prompt
            time.sleep(0.005)
        stream.cancel()
        t.join(30)
        assert stream.result.finish_reason == "cancelled"
        assert stream.result.tokens == []
        assert 64 <= len(e.target.tokens) < n_prompt - 1       # stopped between batches
        assert e.target.cache_span() == (0, len(e.target.tokens) - 1)
        assert gen(e, PROMPTS[0]).tokens == reference[PROMPTS[0]]


def test_cancel_aimed_at_a_queued_generation_hits_only_that_one(eng, reference):
    running = eng.stream(PROMPTS[0], max_tokens=N, sampling=GREEDY, raw=True)
    queued = eng.stream(PROMPTS[1], max_tokens=N, sampling=GREEDY, raw=True)
    first = next(running)
    tq = threading.Thread(target=consume, args=(queued,))
    tq.start()
    while eng.waiting == 0:
        time.sleep(0.001)
    queued.cancel()
    tq.join(10)
    assert not tq.is_alive()
    assert queued.result.finish_reason == "cancelled" and queued.result.tokens == []
    rest = consume(running)
    assert [first.token] + [e.token for e in rest] == running.result.tokens
    assert running.result.finish_reason == "length"
    assert running.result.tokens == reference[PROMPTS[0]]


def test_engine_cancel_stops_the_running_one_and_the_queue_goes_on(eng, reference):
    running = eng.stream(COUNTING, max_tokens=400, sampling=GREEDY, raw=True)
    queued = eng.stream(PROMPTS[1], max_tokens=N, sampling=GREEDY, raw=True)
    next(running)
    done = []
    tq = threading.Thread(target=lambda: done.append(consume(queued)))
    tq.start()
    while eng.waiting == 0:
        time.sleep(0.001)
    eng.cancel()               # the running one (suspended here) ends now
    tq.join(60)
    assert running.result.finish_reason == "cancelled"
    assert queued.result.finish_reason == "length"
    assert queued.result.tokens == reference[PROMPTS[1]]


def test_a_cancel_with_nothing_running_is_not_remembered(eng, reference):
    eng.cancel()
    assert gen(eng, PROMPTS[0]).finish_reason == "length"
    stream = eng.stream(PROMPTS[0], max_tokens=N, sampling=GREEDY, raw=True)
    stream.cancel()            # before it started: it never runs
    assert list(stream) == []
    assert stream.result.finish_reason == "cancelled"


def test_a_second_generation_on_the_same_thread_raises_instead_of_deadlocking(eng, reference):
    stream = eng.stream(COUNTING, max_tokens=100, sampling=GREEDY, raw=True)
    next(stream)
    with pytest.raises(EngineBusyError, match="close"):
        gen(eng, PROMPTS[0])
    stream.close()
    assert gen(eng, PROMPTS[0]).tokens == reference[PROMPTS[0]]


# ---------------------------------------------------------------------------------------------
# asyncio


def test_astream_tasks_share_the_engine_and_keep_the_loop_responsive(eng, reference):
    async def one(prompt):
        events = [ev async for ev in eng.astream(prompt, max_tokens=N, sampling=GREEDY,
                                                 raw=True)]
        return [e.token for e in events]

    async def main():
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.create_task(ticker())
        outs = await asyncio.gather(*(one(p) for p in PROMPTS[:3]))
        done.set()
        await t
        return outs, ticks

    outs, ticks = asyncio.run(main())
    assert outs == [reference[p] for p in PROMPTS[:3]]
    assert ticks >= 10      # the loop kept running while llama.cpp worked


def test_cancelling_the_awaiting_task_cancels_the_generation(eng, reference):
    async def main():
        seen = []

        async def consumer():
            async for ev in eng.astream(COUNTING, max_tokens=400, sampling=GREEDY, raw=True):
                seen.append(ev)

        task = asyncio.create_task(consumer())
        while len(seen) < 4:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(1000):            # the worker thread notices within one step
            if not eng.busy:
                break
            await asyncio.sleep(0.01)
        assert not eng.busy
        return await eng.agenerate(PROMPTS[2], max_tokens=N, sampling=GREEDY, raw=True)

    out = asyncio.run(main())
    assert out.tokens == reference[PROMPTS[2]]


def test_an_event_loop_that_ends_mid_stream_does_not_hold_the_engine(eng, reference):
    async def main():
        s = eng.astream(COUNTING, max_tokens=400, sampling=GREEDY, raw=True)
        await s.__anext__()
        return s              # kept alive, unfinished, while its loop goes away

    kept = asyncio.run(main())
    done = []
    t = threading.Thread(target=lambda: done.append(gen(eng, PROMPTS[0]).tokens))
    t.start()
    t.join(120)
    assert done == [reference[PROMPTS[0]]]
    assert kept.result.finish_reason == "cancelled"


def test_astream_raises_argument_errors_at_the_call(eng):
    with pytest.raises(Exception, match="max_tokens"):
        eng.astream("hi", max_tokens=0)


def test_submit_takes_the_request_stream_builds_and_gives_the_same_answer(eng):
    """``stream(prompt, **arguments)`` is ``submit(GenerationRequest(prompt, **arguments))``:
    same greedy text, same checks (raised by the call), and asubmit for asyncio."""
    req = GenerationRequest(PROMPTS[2], max_tokens=N, sampling=GREEDY, raw=True)
    expected = gen(eng, PROMPTS[2]).text
    s = eng.submit(req)
    consume(s)
    assert s.result.text == expected

    async def main():
        s = eng.asubmit(req)
        async with s:
            async for _ in s:
                pass
        return s.result.text
    assert asyncio.run(main()) == expected
    with pytest.raises(Exception, match="max_tokens"):
        eng.submit(GenerationRequest("hi", max_tokens=0))


# ---------------------------------------------------------------------------------------------
# Close


def test_close_while_generating_stops_everything_then_refuses(paths):
    e = load(paths)
    running = e.stream(COUNTING, max_tokens=400, sampling=GREEDY, raw=True)
    queued = e.stream(PROMPTS[0], max_tokens=N, sampling=GREEDY, raw=True)
    started = threading.Event()
    ta = threading.Thread(target=consume, args=(running, lambda n: started.set(), 0.005))
    tb = threading.Thread(target=consume, args=(queued,))
    ta.start()
    assert started.wait(60)
    tb.start()
    while e.waiting == 0:
        time.sleep(0.001)
    t0 = time.perf_counter()
    e.close()
    closed_in = time.perf_counter() - t0
    ta.join(10)
    tb.join(10)
    assert not ta.is_alive() and not tb.is_alive()
    assert running.result.finish_reason == "cancelled"
    assert queued.result.finish_reason == "cancelled" and queued.result.tokens == []
    assert closed_in < 10, closed_in
    assert e.closed and e.target._closed and e.draft._closed
    for call in (lambda: gen(e, "hi"), e.info, lambda: e.tokenize("hi")):
        with pytest.raises(EngineClosedError, match="closed"):
            call()
    e.close()                  # twice is fine


def test_close_with_a_stream_left_open_in_this_thread(paths):
    e = load(paths)
    stream = e.stream(COUNTING, max_tokens=100, sampling=GREEDY, raw=True)
    next(stream)
    e.close()
    with pytest.raises(StopIteration):
        next(stream)
    assert stream.result.finish_reason == "cancelled"


def test_an_error_mid_generation_stays_an_error(eng, reference, monkeypatch):
    """A failure inside llama.cpp reaches the caller; closing the stream afterwards must not
    turn it into a "cancelled" result, and the engine answers the next request correctly."""
    real = eng.target.decode        # every pass of a generation goes through it
    n_prompt = len(eng.prompt_tokens(PROMPTS[0], raw=True))

    def failing(parts):
        # the second decoding pass: the prompt (whether evaluated or restored from the prompt
        # cache) and a first pass's tokens are in the cache
        if any(len(seq.tokens) >= n_prompt for seq, *_ in parts):
            raise BackendError("llama_decode failed with code -1 (invalid batch)")
        return real(parts)

    monkeypatch.setattr(eng.target, "decode", failing)
    stream = eng.stream(PROMPTS[0], max_tokens=N, sampling=GREEDY, raw=True)
    with pytest.raises(BackendError):
        consume(stream)
    stream.close()
    assert stream.result is None and isinstance(stream.error, BackendError)
    monkeypatch.undo()
    assert not eng.busy
    assert gen(eng, PROMPTS[0]).tokens == reference[PROMPTS[0]]
