"""Prometheus metrics for ``edgespec serve --metrics``: what the server did (requests, tokens,
time, how speculation went) and what each model is doing now, for ``GET /metrics``.

Each :class:`Metrics` holds its own :class:`prometheus_client.CollectorRegistry`, so several
servers (or tests) in one process never share a value; the exposition text is
``prometheus_client``'s own (:meth:`Metrics.render`). This is the only module of the package
that imports ``prometheus_client``.

Counters, added to by :meth:`Metrics.generation_done` once per finished generation (label
``model``; ``prometheus_client`` writes the ``_total`` suffix, and a ``_created`` series
beside each):

=======================================================  =========================================
edgespec                                                 llama-server (``--metrics``)
=======================================================  =========================================
``edgespec_prompt_tokens_evaluated_total``               ``llamacpp:prompt_tokens_total`` (both
                                                         count the prompt tokens evaluated, cache
                                                         hits excluded)
``edgespec_prompt_tokens_total``                         — (every prompt token, cached or not)
``edgespec_prompt_tokens_restored_total``                — (restored from the prompt cache)
``edgespec_prompt_seconds_total``                        ``llamacpp:prompt_seconds_total``
``edgespec_tokens_predicted_total``                      ``llamacpp:tokens_predicted_total``
``edgespec_tokens_predicted_seconds_total``              ``llamacpp:tokens_predicted_seconds_total``
``edgespec_target_passes_total``                         ``llamacpp:n_decode_total``, roughly
                                                         (here: the target's decoding passes
                                                         only, not its prompt batches)
``edgespec_draft_tokens_total``                          — (llama-server reports ``draft_n``
``edgespec_draft_tokens_accepted_total``                 and ``draft_n_accepted`` per response)
``edgespec_drafting_rounds_total``                       — rounds that drafted at least one token
``edgespec_draft_position_tested_total{position}``       — per draft position (0-based): rounds
``edgespec_draft_position_accepted_total{position}``     that checked / accepted it
``edgespec_generations_total{endpoint,finish_reason}``   —
=======================================================  =========================================

Embeddings (:meth:`Metrics.embedding_done`, once per answered embedding request):
``edgespec_embedding_tokens_total{model}`` (the tokens embedded, after truncation) and
``edgespec_embedding_inputs_total{model,endpoint}`` (the texts or token lists embedded).

Histograms (label ``model``): ``edgespec_time_to_first_token_seconds`` and
``edgespec_inter_token_latency_seconds`` (the gaps between streamed tokens' arrival). The time
to first token is the client's: from the request's arrival, so reading its body, loading the
model, waiting for the Engine's turn and evaluating the prompt are in it. A response's own
``edgespec.first_token_seconds`` (:attr:`~edgespec.results.GenerationStats.first_token_seconds`)
counts from the generation's turn only: prompt evaluation and the first step, the part the
Engine's settings change.
Requests (:meth:`Metrics.request`): ``edgespec_requests_total{endpoint,status}`` and the
gauge ``edgespec_requests_in_flight{endpoint}``.

Gauges read from each loaded Engine at scrape time (label ``model``):
``edgespec_requests_processing`` (``llamacpp:requests_processing``: 1 while a generation
holds the Engine), ``edgespec_requests_deferred`` (``llamacpp:requests_deferred``: the
generations queued behind it), ``edgespec_threads{role="target"|"draft"}`` (CPU threads each
model runs with now), ``edgespec_draft_length`` (draft tokens per drafting round: the pinned
length, 0 without a drafter, or with an adaptive length the last speculative generation's
mean) and ``edgespec_draft_length_adaptive`` (1 when the cost model chooses the length).
llama-server's throughput gauges (``prompt_tokens_seconds``, ``predicted_tokens_seconds``)
are left out: ``rate()`` over the counters gives them.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, Sequence

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram, generate_latest)
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from ..results import GenerationStats

log = logging.getLogger(__name__)

PREFIX = "edgespec_"

# Inter-token gaps: 1 ms (a run of accepted drafts) to 2 s (a slow CPU's plain pass).
TOKEN_GAP_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
                     float("inf"))
# Time to first token, from the request's arrival: model loading, queueing and prompt
# evaluation included.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                float("inf"))


class RequestMetrics:
    """One request in flight (see :meth:`Metrics.request`). Set ``status`` to the HTTP
    status code before it ends; :meth:`end` (or leaving the ``with`` block) counts it once."""

    def __init__(self, metrics: "Metrics", endpoint: str):
        self.endpoint = endpoint
        self.status: Optional[int | str] = None
        self._metrics = metrics
        self._ended = False
        metrics._in_flight.labels(endpoint=endpoint).inc()

    def end(self, status: Optional[int | str] = None,
            exc: Optional[BaseException] = None) -> None:
        """Count the request as finished with ``status`` (else :attr:`status`; else, after an
        exception, its own ``status_code``/``status`` when it carries an HTTP code, or 500;
        else 200). A second call does nothing."""
        if self._ended:
            return
        self._ended = True
        if status is not None:
            self.status = status
        if self.status is None:
            self.status = _status_of(exc) if exc is not None else 200
        m = self._metrics
        m._in_flight.labels(endpoint=self.endpoint).dec()
        m._requests.labels(endpoint=self.endpoint, status=str(self.status)).inc()

    def __enter__(self) -> "RequestMetrics":
        return self

    def __exit__(self, *exc_info) -> None:
        self.end(exc=exc_info[1])


def _status_of(exc: BaseException) -> int:
    """The HTTP status an exception stands for (an APIError's ``status``, an HTTPException's
    ``status_code``), or 500."""
    for attr in ("status_code", "status"):
        code = getattr(exc, attr, None)
        if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599:
            return code
    return 500


class Metrics:
    """The server's metrics, in a registry of their own.

    ``models()`` yields ``(model name, Engine)`` for each loaded model at scrape time; the
    Engines' state now (busy, queued, threads, draft length) is read from them then.
    """

    def __init__(self, models: Callable[[], Iterable[tuple[str, "Engine"]]] = lambda: ()):
        self.registry = CollectorRegistry(auto_describe=False)
        self._models = models
        self._lock = threading.Lock()
        self._draft_length: dict[str, float] = {}     # adaptive: the last generation's mean
        r = self.registry

        def counter(name: str, doc: str, labels: Sequence[str] = ("model",)) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=r)

        self._requests = counter("requests", "HTTP requests finished, by endpoint and "
                                 "status code.", ("endpoint", "status"))
        self._in_flight = Gauge(PREFIX + "requests_in_flight", "HTTP requests being served "
                                "now, by endpoint.", ("endpoint",), registry=r)
        self._generations = counter("generations", "Generations finished, by endpoint and "
                                    "finish reason.", ("model", "endpoint", "finish_reason"))
        self._prompt_tokens = counter("prompt_tokens", "Prompt tokens, cached or evaluated.")
        self._prompt_evaluated = counter("prompt_tokens_evaluated", "Prompt tokens evaluated "
                                         "(not found in the KV cache).")
        self._prompt_restored = counter("prompt_tokens_restored", "Prompt tokens brought back "
                                        "from the prompt cache (another conversation's KV "
                                        "state kept in host memory).")
        self._prompt_seconds = counter("prompt_seconds", "Seconds spent evaluating prompts.")
        self._predicted = counter("tokens_predicted", "Tokens generated.")
        self._predicted_seconds = counter("tokens_predicted_seconds",
                                          "Seconds spent generating (prompts excluded).")
        self._passes = counter("target_passes", "Target model passes while decoding.")
        self._drafted = counter("draft_tokens", "Draft tokens proposed.")
        self._accepted = counter("draft_tokens_accepted", "Draft tokens accepted by the "
                                 "target.")
        self._drafting_rounds = counter("drafting_rounds", "Decoding rounds that drafted at "
                                        "least one token.")
        self._tested_at = counter("draft_position_tested", "Rounds in which the draft token "
                                  "at this position (0-based) was checked.",
                                  ("model", "position"))
        self._accepted_at = counter("draft_position_accepted", "Rounds in which the draft "
                                    "token at this position (0-based) was accepted.",
                                    ("model", "position"))
        self._embedding_tokens = counter("embedding_tokens", "Tokens embedded (after "
                                         "truncation).")
        self._embedding_inputs = counter("embedding_inputs", "Texts (or token lists) "
                                         "embedded, by endpoint.", ("model", "endpoint"))
        self._ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Seconds from a "
                               "request's arrival to its first generated token (model "
                               "loading, queueing and prompt evaluation included).", ("model",),
                               buckets=TTFT_BUCKETS, registry=r)
        self._token_gap = Histogram(PREFIX + "inter_token_latency_seconds", "Seconds between "
                                    "streamed tokens' arrival.", ("model",),
                                    buckets=TOKEN_GAP_BUCKETS, registry=r)
        r.register(_EngineCollector(self))

    # -- recording ------------------------------------------------------------------------

    def request(self, endpoint: str) -> RequestMetrics:
        """A request to ``endpoint`` in flight from now: ``with metrics.request(path) as r:
        … r.status = 200``. Leaving the block counts it in ``requests_total`` (an exception
        without a status set counts as its HTTP code, else 500)."""
        return RequestMetrics(self, endpoint)

    def generation_done(self, model: str, endpoint: str, stats: "GenerationStats",
                        ttft: Optional[float], token_gaps: Sequence[float],
                        finish_reason: str) -> None:
        """Add a finished generation of ``model``: its counters, its time to first token
        (None: no token came) and the gaps between its tokens' arrival, in seconds."""
        loop = stats.loop
        self._generations.labels(model=model, endpoint=endpoint,
                                 finish_reason=finish_reason).inc()
        for c, v in ((self._prompt_tokens, stats.prompt_tokens),
                     (self._prompt_evaluated, stats.prompt_tokens_evaluated),
                     (self._prompt_restored, stats.prompt_tokens_restored),
                     (self._prompt_seconds, stats.prompt_seconds),
                     (self._predicted, stats.completion_tokens),
                     (self._predicted_seconds, stats.decode_seconds),
                     (self._passes, stats.target_passes),
                     (self._drafted, stats.drafted),
                     (self._accepted, stats.accepted)):
            c.labels(model=model).inc(max(0, v))
        drafting_rounds = max(0, loop.rounds - loop.plain_passes)
        self._drafting_rounds.labels(model=model).inc(drafting_rounds)
        for c, counts in ((self._tested_at, stats.tested_at),
                          (self._accepted_at, stats.accepted_at)):
            for i, n in enumerate(counts):
                c.labels(model=model, position=str(i)).inc(max(0, n))
        if ttft is not None:
            self._ttft.labels(model=model).observe(max(0.0, ttft))
        if token_gaps:
            gap = self._token_gap.labels(model=model)
            for g in token_gaps:
                gap.observe(max(0.0, g))
        if stats.speculative:
            with self._lock:
                self._draft_length[model] = (stats.drafted / drafting_rounds
                                             if drafting_rounds else 0.0)

    def embedding_done(self, model: str, endpoint: str, inputs: int, tokens: int) -> None:
        """Add an answered embedding request of ``model``: ``inputs`` embedded, ``tokens`` in
        all."""
        self._embedding_tokens.labels(model=model).inc(max(0, tokens))
        self._embedding_inputs.labels(model=model, endpoint=endpoint).inc(max(0, inputs))

    # -- exposition -----------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The body and content type for ``GET /metrics`` (Prometheus text format)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def _last_draft_length(self, model: str) -> Optional[float]:
        with self._lock:
            return self._draft_length.get(model)


class _EngineCollector:
    """The gauges read from the loaded Engines at scrape time."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        def gauge(name: str, doc: str, labels: Sequence[str] = ("model",)):
            return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))
        return (gauge("requests_processing", "Generations running now, each in a lane of "
                      "its own (at most streams_max)."),
                gauge("requests_deferred", "Generations queued for a lane now."),
                gauge("requests_deferred_total", "Generations that had to wait for a lane "
                      "since the model was loaded."),
                gauge("streams_parallel", "Whole contexts of KV cache: the generations "
                      "the model runs at once whatever their length (--parallel)."),
                gauge("streams_max", "Lanes: the most generations the model runs at once, "
                      "those beyond streams_parallel while their lengths fit (--streams)."),
                gauge("batch_rows", "Mean rows of the model's last passes (its streams' verify "
                      "rows, plain rows and prompt chunks batched together)."),
                gauge("threads", "CPU threads each model runs with now.", ("model", "role")),
                gauge("draft_length", "Draft tokens per drafting round: the pinned length "
                      "(0: no drafter), or the cost model's mean in the last speculative "
                      "generation."),
                gauge("draft_length_adaptive", "1 when a cost model chooses the draft "
                      "length, 0 when it is pinned."))

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        (processing, deferred, deferred_total, parallel, most, rows, threads, length,
         adaptive) = families
        for model, engine in self.metrics._models():
            try:
                lanes, counts, spec = engine.lanes, engine.threads, engine.spec
            except Exception as e:  # noqa: BLE001 - a closing Engine must not fail the scrape
                log.debug("metrics: skipping %s: %s", model, e)
                continue
            processing.add_metric([model], len(lanes.running))
            deferred.add_metric([model], lanes.waiting)
            deferred_total.add_metric([model], lanes.deferred)
            parallel.add_metric([model], lanes.contexts)
            most.add_metric([model], lanes.n)
            rows.add_metric([model], lanes.rows_per_pass)
            for role in ("target", "draft"):
                if counts.get(role) is not None:
                    threads.add_metric([model, role], counts[role])
            adaptive.add_metric([model], 1 if spec.drafts and spec.is_adaptive else 0)
            k = (0.0 if not spec.drafts else self.metrics._last_draft_length(model)
                 if spec.is_adaptive else float(spec.fixed_k))
            if k is not None:
                length.add_metric([model], k)
        return iter(families)
