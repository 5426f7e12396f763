"""edgespec/server/metrics.py: a scripted run of generations and requests, rendered and
parsed back with prometheus_client's own parser; every figure is checked against the
scripted stats. No server, no model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgespec.config import SpecConfig
from edgespec.results import GenerationStats
from edgespec.server.metrics import TOKEN_GAP_BUCKETS, Metrics
from edgespec.results import LoopStats


def samples(metrics: Metrics) -> dict[tuple[str, frozenset], float]:
    body, _ = metrics.render()
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: dict, name: str, **labels) -> float:
    return found[(name, frozenset(labels.items()))]


def families(metrics: Metrics) -> dict[str, str]:
    body, _ = metrics.render()
    return {f.name: f.type for f in text_string_to_metric_families(body.decode())}


def stats(prompt, evaluated, completion, p_s, d_s, *, drafted, accepted, passes, rounds,
          plain, tested, acc_at, speculative=True) -> GenerationStats:
    loop = LoopStats(rounds=rounds, target_passes=passes, drafted=drafted, accepted=accepted,
                     emitted=completion, tested_at=list(tested), accepted_at=list(acc_at),
                     plain_passes=plain)
    return GenerationStats(prompt_tokens=prompt, prompt_tokens_evaluated=evaluated,
                           completion_tokens=completion, prompt_seconds=p_s,
                           decode_seconds=d_s, speculative=speculative, loop=loop)


# (model, endpoint, stats, ttft, gaps, finish reason)
SCRIPT = [
    ("alpha", "/v1/chat/completions",
     stats(120, 120, 40, 0.5, 2.0, drafted=60, accepted=30, passes=12, rounds=12, plain=2,
           tested=[10, 7, 4], acc_at=[7, 4, 2]),
     0.6, [0.0005, 0.004, 0.03, 0.3, 1.5, 3.0], "stop"),
    ("alpha", "/v1/completions",
     stats(130, 10, 25, 0.05, 1.25, drafted=20, accepted=15, passes=10, rounds=10, plain=5,
           tested=[5, 4], acc_at=[4, 3]),
     0.1, [0.01, 0.02], "length"),
    ("beta", "/v1/chat/completions",
     stats(50, 50, 8, 0.2, 0.8, drafted=0, accepted=0, passes=8, rounds=8, plain=8,
           tested=[], acc_at=[], speculative=False),
     None, [], "stop"),
    ("alpha", "/v1/chat/completions",
     stats(140, 20, 30, 0.1, 1.5, drafted=24, accepted=12, passes=12, rounds=12, plain=4,
           tested=[8, 5, 3, 1], acc_at=[5, 3, 1, 0]),
     2.0, [0.002] * 29, "stop"),
]


@pytest.fixture
def run() -> Metrics:
    m = Metrics()
    for model, endpoint, st, ttft, gaps, reason in SCRIPT:
        m.generation_done(model, endpoint, st, ttft, gaps, reason)
    return m


def of(model):
    return [row for row in SCRIPT if row[0] == model]


@pytest.mark.parametrize("model", ["alpha", "beta"])
def test_counters_are_the_sums_of_the_scripted_stats(run, model):
    found = samples(run)
    rows = [st for _, _, st, _, _, _ in of(model)]
    expect = {
        "edgespec_prompt_tokens_total": sum(s.prompt_tokens for s in rows),
        "edgespec_prompt_tokens_evaluated_total": sum(s.prompt_tokens_evaluated for s in rows),
        "edgespec_prompt_seconds_total": sum(s.prompt_seconds for s in rows),
        "edgespec_tokens_predicted_total": sum(s.completion_tokens for s in rows),
        "edgespec_tokens_predicted_seconds_total": sum(s.decode_seconds for s in rows),
        "edgespec_target_passes_total": sum(s.target_passes for s in rows),
        "edgespec_draft_tokens_total": sum(s.drafted for s in rows),
        "edgespec_draft_tokens_accepted_total": sum(s.accepted for s in rows),
        "edgespec_drafting_rounds_total": sum(s.loop.rounds - s.loop.plain_passes
                                              for s in rows),
    }
    for name, want in expect.items():
        assert value(found, name, model=model) == pytest.approx(want), name


def test_the_two_models_are_separate_series(run):
    found = samples(run)
    assert value(found, "edgespec_prompt_tokens_total", model="alpha") == 390
    assert value(found, "edgespec_prompt_tokens_total", model="beta") == 50
    assert value(found, "edgespec_tokens_predicted_total", model="beta") == 8
    assert ("edgespec_draft_position_tested_total",
            frozenset({"model": "beta", "position": "0"}.items())) not in found


def test_per_position_series(run):
    found = samples(run)
    for name, attr in (("edgespec_draft_position_tested_total", "tested_at"),
                       ("edgespec_draft_position_accepted_total", "accepted_at")):
        want: dict[int, int] = {}
        for _, _, st, _, _, _ in of("alpha"):
            for i, n in enumerate(getattr(st, attr)):
                want[i] = want.get(i, 0) + n
        got = {int(dict(labels)["position"]): v for (n, labels), v in found.items()
               if n == name and dict(labels)["model"] == "alpha"}
        assert got == want, name
    assert value(found, "edgespec_draft_position_accepted_total", model="alpha",
                 position="3") == 0     # tested, never accepted: a zero, not a gap


def test_generations_by_endpoint_and_finish_reason(run):
    found = samples(run)
    name = "edgespec_generations_total"
    assert value(found, name, model="alpha", endpoint="/v1/chat/completions",
                 finish_reason="stop") == 2
    assert value(found, name, model="alpha", endpoint="/v1/completions",
                 finish_reason="length") == 1
    assert value(found, name, model="beta", endpoint="/v1/chat/completions",
                 finish_reason="stop") == 1
    assert sum(v for (n, _), v in found.items() if n == name) == len(SCRIPT)


@pytest.mark.parametrize("model", ["alpha", "beta"])
def test_histograms_count_and_sum(run, model):
    found = samples(run)
    ttfts = [t for _, _, _, t, _, _ in of(model) if t is not None]
    gaps = [g for _, _, _, _, gs, _ in of(model) for g in gs]
    for name, values in (("edgespec_time_to_first_token_seconds", ttfts),
                         ("edgespec_inter_token_latency_seconds", gaps)):
        if not values:     # beta: no token ever came, so no series
            assert (name + "_count", frozenset({"model": model}.items())) not in found
            continue
        assert value(found, name + "_count", model=model) == len(values)
        assert value(found, name + "_sum", model=model) == pytest.approx(sum(values))
        assert value(found, name + "_bucket", model=model, le="+Inf") == len(values)


def test_inter_token_buckets_span_a_millisecond_to_two_seconds(run):
    assert TOKEN_GAP_BUCKETS[0] == 0.001 and TOKEN_GAP_BUCKETS[-2] == 2.0
    found = samples(run)
    gaps = [g for _, _, _, _, gs, _ in of("alpha") for g in gs]
    for le in TOKEN_GAP_BUCKETS[:-1]:
        got = value(found, "edgespec_inter_token_latency_seconds_bucket", model="alpha",
                    le=str(le))
        assert got == sum(g <= le for g in gaps), le


def test_metric_types(run):
    with run.request("/health") as r:
        r.status = 200
    types = families(run)
    assert types["edgespec_prompt_tokens"] == "counter"
    assert types["edgespec_requests"] == "counter"
    assert types["edgespec_requests_in_flight"] == "gauge"
    assert types["edgespec_time_to_first_token_seconds"] == "histogram"
    assert types["edgespec_inter_token_latency_seconds"] == "histogram"
    assert all(name.startswith("edgespec_") for name in types)


def test_requests_by_endpoint_and_status():
    m = Metrics()
    with m.request("/v1/chat/completions") as r:
        assert value(samples(m), "edgespec_requests_in_flight",
                     endpoint="/v1/chat/completions") == 1
        r.status = 200
    with m.request("/v1/chat/completions") as r:
        r.status = 200
    with m.request("/v1/completions") as r:
        r.status = 400
    with pytest.raises(RuntimeError):
        with m.request("/v1/completions"):
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        with m.request("/v1/completions") as r:
            r.status = 503          # set before the failure: it stands
            raise RuntimeError("late")

    class APIError(Exception):      # the shape of edgespec.server.wire.APIError
        status = 404
    with pytest.raises(APIError):
        with m.request("/v1/models/x"):
            raise APIError()
    with m.request("/health"):
        pass                        # no status, no exception: 200
    r = m.request("/v1/chat/completions")      # a stream ended by hand, once
    r.end(200)
    r.end(500)

    found = samples(m)
    name = "edgespec_requests_total"
    assert value(found, name, endpoint="/v1/chat/completions", status="200") == 3
    assert value(found, name, endpoint="/v1/completions", status="400") == 1
    assert value(found, name, endpoint="/v1/completions", status="500") == 1
    assert value(found, name, endpoint="/v1/completions", status="503") == 1
    assert value(found, name, endpoint="/v1/models/x", status="404") == 1
    assert value(found, name, endpoint="/health", status="200") == 1
    assert ("edgespec_requests_total", frozenset({"endpoint": "/v1/chat/completions",
                                                  "status": "500"}.items())) not in found
    for (n, labels), v in found.items():
        if n == "edgespec_requests_in_flight":
            assert v == 0, dict(labels)


def test_content_type_is_prometheus_text(run):
    body, ctype = run.render()
    assert ctype.startswith("text/plain") and "version=" in ctype
    assert isinstance(body, bytes)
    assert b"# TYPE edgespec_prompt_tokens_total counter" in body


def test_two_metrics_objects_share_nothing(run):
    other = Metrics()
    other.generation_done("alpha", "/v1/completions", SCRIPT[1][2], 0.1, [0.01], "stop")
    with other.request("/v1/completions") as r:
        r.status = 200
    mine, theirs = samples(run), samples(other)
    assert value(theirs, "edgespec_prompt_tokens_total", model="alpha") == 130
    assert value(mine, "edgespec_prompt_tokens_total", model="alpha") == 390
    assert not any(n == "edgespec_requests_total" for n, _ in mine)
    assert ("edgespec_prompt_tokens_total",
            frozenset({"model": "beta"}.items())) not in theirs


# -- the gauges read from the Engines at scrape time ---------------------------------------


def fake_engine(*, busy=False, waiting=0, target=4, draft=2, spec=None):
    lanes = SimpleNamespace(running=["a generation"] if busy else [], waiting=waiting,
                            deferred=waiting + 2, n=8, contexts=4,
                            rows_per_pass=5.5 if busy else 0.0)
    return SimpleNamespace(lanes=lanes, spec=spec or SpecConfig(),
                           threads={"target": target, "draft": draft, "max": 8,
                                    "adaptive": True, "backed_off": False})


class Closed:
    """An Engine being closed: reading its state fails."""
    lanes = spec = False

    @property
    def threads(self):
        raise RuntimeError("closed")


def test_engine_gauges():
    engines = {"alpha": fake_engine(busy=True, waiting=3),                  # adaptive
               "beta": fake_engine(draft=None, spec=SpecConfig(drafter="none")),
               "gamma": fake_engine(spec=SpecConfig(drafter="hybrid", draft_max=6)),
               "delta": fake_engine(spec=SpecConfig(adaptive=False)),
               "closed": Closed()}
    m = Metrics(lambda: engines.items())
    found = samples(m)
    assert value(found, "edgespec_requests_processing", model="alpha") == 1
    assert value(found, "edgespec_requests_processing", model="beta") == 0
    assert value(found, "edgespec_requests_deferred", model="alpha") == 3
    assert value(found, "edgespec_requests_deferred", model="beta") == 0
    assert value(found, "edgespec_requests_deferred_total", model="alpha") == 5
    assert value(found, "edgespec_streams_parallel", model="alpha") == 4
    assert value(found, "edgespec_streams_max", model="alpha") == 8
    assert value(found, "edgespec_batch_rows", model="alpha") == 5.5
    assert value(found, "edgespec_threads", model="alpha", role="target") == 4
    assert value(found, "edgespec_threads", model="alpha", role="draft") == 2
    assert value(found, "edgespec_threads", model="beta", role="target") == 4
    assert ("edgespec_threads", frozenset({"model": "beta", "role": "draft"}.items())) \
        not in found
    assert value(found, "edgespec_draft_length", model="beta") == 0
    assert value(found, "edgespec_draft_length", model="gamma") == 6
    assert value(found, "edgespec_draft_length", model="delta") == SpecConfig.FIXED_DEFAULT
    assert value(found, "edgespec_draft_length_adaptive", model="alpha") == 1
    assert value(found, "edgespec_draft_length_adaptive", model="gamma") == 0
    assert value(found, "edgespec_draft_length_adaptive", model="beta") == 0
    # adaptive, and no generation yet: no figure rather than a made-up one
    assert ("edgespec_draft_length", frozenset({"model": "alpha"}.items())) not in found
    assert not any(dict(labels).get("model") == "closed" for _, labels in found)

    for model, endpoint, st, ttft, gaps, reason in SCRIPT:
        m.generation_done(model, endpoint, st, ttft, gaps, reason)
    last = SCRIPT[-1][2]        # alpha's last: 24 drafted over 12 - 4 drafting rounds
    assert value(samples(m), "edgespec_draft_length", model="alpha") == pytest.approx(
        last.drafted / (last.loop.rounds - last.loop.plain_passes))

    plain = stats(10, 10, 5, 0.1, 0.5, drafted=0, accepted=0, passes=5, rounds=5, plain=5,
                  tested=[], acc_at=[])
    m.generation_done("alpha", "/v1/completions", plain, 0.1, [], "stop")
    assert value(samples(m), "edgespec_draft_length", model="alpha") == 0  # drafting paused
    unspeculative = stats(10, 10, 5, 0.1, 0.5, drafted=0, accepted=0, passes=5, rounds=5,
                          plain=5, tested=[], acc_at=[], speculative=False)
    st = SCRIPT[0][2]
    m.generation_done("alpha", "/v1/completions", st, 0.1, [], "stop")
    m.generation_done("alpha", "/v1/completions", unspeculative, 0.1, [], "stop")
    assert value(samples(m), "edgespec_draft_length", model="alpha") == pytest.approx(
        st.drafted / (st.loop.rounds - st.loop.plain_passes))   # a plain request says nothing


def test_models_are_read_at_each_scrape():
    engines = {}
    m = Metrics(lambda: list(engines.items()))
    assert not any(n == "edgespec_requests_processing" for n, _ in samples(m))
    engines["alpha"] = fake_engine(waiting=1)
    assert value(samples(m), "edgespec_requests_deferred", model="alpha") == 1
    engines["alpha"].lanes.waiting = 0
    assert value(samples(m), "edgespec_requests_deferred", model="alpha") == 0
