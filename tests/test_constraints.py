"""Grammar-constrained decoding: checking constraints, and lossless constrained speculation.

The statistical test runs the real loop, drafters and grammar engine over a numpy Markov pair
with a six-token vocabulary (single characters and an end token), against the exact
constrained distribution of plain target sampling, computed by enumeration: a G-test of the
first four tokens' joint (tests/goodness.py) whose p-value must be at least 1e-6, so a correct
implementation fails it with probability at most one in a million. Its negative control draws
drafts from the masked q but hands the verifier the unmasked one, and fails the same test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from llguidance import LLTokenizer, TokenizerWrapper

from edgespec import constraints
from edgespec.config import SamplingParams
from edgespec.constraints import Constraint, GrammarState
from edgespec.drafting import FixedLength, ModelDrafter
from edgespec.errors import ConstraintError
from edgespec.sampling import warp
from edgespec.results import LoopStats
from edgespec.speculative import decode

from goodness import ALPHA, excess, g_test
from markov import MarkovLM, softmax

# --- checking what users give ----------------------------------------------------------------

PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}


def test_valid_constraints_compile():
    assert Constraint.json_schema(PERSON).kind == "json_schema"
    assert Constraint.json_schema(json.dumps(PERSON)).schema == PERSON
    assert Constraint.json().kind == "json"
    assert Constraint.regex(r"\d{3}-\d{4}").kind == "regex"
    assert Constraint.grammar('start: "yes" | "no"').kind == "grammar"
    gbnf = Constraint.grammar('root ::= "yes" | "no"')          # llama.cpp's GBNF
    assert gbnf.kind == "grammar" and gbnf.compiled


def test_a_pydantic_model_is_a_schema():
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int
    c = Constraint.json_schema(Person)
    assert c.parse('{"name": "Ada", "age": 36}') == {"name": "Ada", "age": 36}


@pytest.mark.parametrize("make, fragment", [
    (lambda: Constraint.json_schema("{not json"), "the JSON schema is not valid JSON"),
    (lambda: Constraint.json_schema({"type": "nope"}), "the JSON schema is invalid"),
    (lambda: Constraint.json_schema({"type": "object", "properties": {"a": {"minimum": "x"}}}),
     "the JSON schema is invalid at properties/a/minimum"),
    (lambda: Constraint.json_schema([1, 2]), "must be a JSON object"),
    (lambda: Constraint.regex("(ab"), "the regular expression is invalid"),
    (lambda: Constraint.regex(""), "non-empty"),
    (lambda: Constraint.grammar("start: undefined_rule"), "the grammar is invalid"),
    (lambda: Constraint.grammar("root ::= ( \"a\" "), "GBNF grammar could not be read"),
])
def test_bad_constraints_are_one_line_errors(make, fragment):
    with pytest.raises(ConstraintError) as e:
        make()
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg and len(msg) < 500


def test_a_constraint_that_does_not_compile_in_time_is_refused(monkeypatch):
    # A schema of 3000 properties takes milliseconds to compile: over a zero deadline.
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": f"a{i}+b"}
                                            for i in range(3000)}}
    monkeypatch.setattr(constraints, "COMPILE_SECONDS", 0)
    with pytest.raises(ConstraintError, match="too complex: it did not compile in 0 s"):
        Constraint.json_schema(big)


def test_parse_checks_the_schema():
    c = Constraint.json_schema(PERSON)
    with pytest.raises(ConstraintError, match="does not match the schema at age"):
        c.parse('{"name": "Ada", "age": -1}')
    with pytest.raises(ConstraintError, match="not complete JSON"):
        c.parse('{"name": "Ad')


# --- a tiny tokenizer for the Markov models -----------------------------------------------------

CHARS = [b"a", b"b", b"c", b"d", b"e"]
EOS = 5
V = 6


class _TinyVocab:
    """Single-character tokens a-e and an end token, as llguidance reads a vocabulary."""

    tokens = CHARS + [b"\xff<eos>"]
    eos_token_id = EOS
    bos_token_id = None
    special_token_ids = [EOS]

    def __call__(self, text: bytes) -> list[int]:
        return [CHARS.index(bytes([c])) for c in text if bytes([c]) in CHARS]


TOKENIZER = LLTokenizer(TokenizerWrapper(_TinyVocab()), n_vocab=V, eos_token=[EOS])
# After "a" only "b" may follow (a forced token); after "c" one of "d"/"e"; the output may end
# after any whole unit.
UNITS = Constraint.regex("(ab|c[de]|e)+")


def state() -> GrammarState:
    return GrammarState(UNITS, TOKENIZER, V)


def test_grammar_state_masks_forces_and_rolls_back():
    g = state()
    assert g.mask().tolist() == [True, False, True, False, True, False]
    assert g.consume([0]) == 1 and g.forced() == [1]
    assert g.mask().tolist() == [False, True, False, False, False, False]
    assert g.consume([1, 2, 0]) == 2 and g.depth == 3        # "a" after "c" is refused
    assert g.mask().tolist() == [False, False, False, True, True, False]
    g.rollback(2)
    assert g.depth == 1 and g.mask().tolist() == [False, True, False, False, False, False]
    g.consume([1])
    assert g.mask()[EOS]             # complete: the grammar may end here


# --- lossless constrained speculation -----------------------------------------------------------

N_RUNS = 20_000
N_NEW = 4


def markov_pair(seed=5):
    rng = np.random.default_rng(seed)
    target = rng.normal(0, 1.5, (V, V)).astype(np.float32)
    draft = (0.4 * target + np.where(np.arange(V) == 2, 2.0, 0.0)).astype(np.float32)
    return target, draft


def exact_distribution(target_logits, start: int) -> dict:
    """P(first N_NEW tokens) under plain constrained sampling (an ended output is padded
    with -1), by enumerating every allowed prefix."""
    out: dict = {}

    def walk(prefix, last, prob, g):
        if len(prefix) == N_NEW:
            out[tuple(prefix)] = out.get(tuple(prefix), 0.0) + prob
            return
        mask = g.mask()
        p = softmax(np.where(mask, target_logits[last], -np.inf).astype(np.float64))
        for t in np.flatnonzero(p > 0):
            if t == EOS:
                walk(prefix + [EOS] + [-1] * (N_NEW - len(prefix) - 1), t, prob * p[t], g)
                continue
            g.consume([int(t)])
            walk(prefix + [int(t)], int(t), prob * p[t], g)
            g.rollback(1)
    walk([], start, 1.0, state())
    return out


class _UnmaskedQ(ModelDrafter):
    """Broken on purpose: draws each draft from the masked q (so the grammar accepts it) but
    hands the verifier the unmasked q."""

    def draft(self, context, k_max, params, rng, should_stop, constraint=None, extend=None):
        d = super().draft(context, k_max, params, rng, should_stop, constraint, extend)
        for i in range(len(d.x)):
            before = context[-1] if i == 0 else d.x[i - 1]      # a bigram model's state
            d.q[i] = warp(self.model.table[before], params)
        return d


def run(kind: str, seed: int):
    target_logits, draft_logits = markov_pair()
    target, draft = MarkovLM(target_logits, eog=[EOS]), MarkovLM(draft_logits, eog=[EOS])
    cls = _UnmaskedQ if kind == "unmasked-q" else ModelDrafter
    drafter = None if kind == "plain" else cls(draft, frozenset([EOS]), FixedLength(3))
    params = SamplingParams.neutral(1.0)
    rng = np.random.default_rng(seed)
    counts: dict = {}
    stats = LoopStats()
    grammar = state()
    for _ in range(N_RUNS):
        context = [4]                       # "e": a unit ended, the grammar starts fresh
        target.truncate(0)
        if drafter is not None:
            drafter.rollback(0)
        # Rolled back to its start rather than built anew: the same state, without the
        # matcher's construction (more than half of a run's time).
        grammar.rollback(grammar.depth)
        out = [s.token for s in decode(target, context, params=params, rng=rng, max_tokens=N_NEW,
                                       drafter=drafter, stats=stats, constraint=grammar)]
        key = tuple(out + [-1] * (N_NEW - len(out)))
        counts[key] = counts.get(key, 0) + 1
    return counts, stats


def g_against(counts: dict, exact: dict) -> tuple[float, int, float]:
    """``(G, df, p-value)`` of the sampled outputs against the exact law."""
    keys = sorted(exact)
    return g_test([counts.get(k, 0) for k in keys], [exact[k] for k in keys])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "model"])
def test_constrained_speculation_matches_constrained_sampling(kind):
    """Power: a law f with N_RUNS · Σ (f − p)² / p of 100 fails with probability 99.5%."""
    exact = exact_distribution(markov_pair()[0], start=4)
    assert abs(sum(exact.values()) - 1) < 1e-9
    counts, stats = run(kind, seed=3 if kind == "plain" else 4)
    assert all(k in exact for k in counts), "an output the grammar does not allow"
    if kind == "model":
        assert stats.drafted > 0 and 0 < stats.accepted < stats.drafted
    g, df, p = g_against(counts, exact)
    assert p >= ALPHA, f"G {g:.1f} ({df} df), p = {p:.2e}"


@pytest.mark.slow
def test_masking_only_p_is_caught():
    """The same test fails, with G at least 20 times its critical value (measured: 66×)."""
    exact = exact_distribution(markov_pair()[0], start=4)
    counts, _ = run("unmasked-q", seed=4)
    g, df, p = g_against(counts, exact)
    assert p < ALPHA and excess(g, df, ALPHA) >= 20, \
        f"the broken drafter passed: G {g:.1f} ({df} df), p = {p:.2e}"


def test_objects_that_list_their_properties_are_closed_to_others_as_llama_cpp_does():
    from edgespec.constraints import closed_objects
    schema = {"type": "object", "properties": {
        "city": {"type": "string"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
        "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {}}}},
        "free": {"type": "object"},
        "open": {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
        "both": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}},
        "$defs": {"d": {"properties": {"x": {}}}}}
    out = closed_objects(schema)
    assert out["additionalProperties"] is False
    p = out["properties"]
    assert p["where"]["additionalProperties"] is False
    assert p["tags"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in p["free"]              # no properties listed: any
    assert p["open"]["additionalProperties"] is True              # said: kept
    assert all("additionalProperties" not in m for m in p["both"]["allOf"])
    assert out["$defs"]["d"]["additionalProperties"] is False
    assert "additionalProperties" not in schema                   # the caller's is untouched


def test_a_tool_schema_without_additional_properties_admits_no_invented_key(smollm2_q4_path):
    """The grammar (not only the check after it) refuses a key the schema does not list."""
    from edgespec.backend import GrammarVocab
    from edgespec.constraints import tokenizer_for
    vocab = GrammarVocab(smollm2_q4_path)
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"]}

    def taken(text: str) -> tuple[int, int]:
        g = GrammarState(Constraint.json_schema(schema), tokenizer_for(smollm2_q4_path,
                                                                       lambda: vocab),
                         len(vocab.pieces))
        tokens = vocab.tokenize(text.encode())
        return g.consume(tokens), len(tokens)
    n, total = taken('{"city": "Paris"}')
    assert n == total
    n, total = taken('{"city": "Paris", "type": "string"}')
    assert n < total


def test_an_integer_without_bounds_is_held_to_sixteen_digits(smollm2_q4_path):
    """As llama.cpp's grammar holds it: greedy SmolLM2 otherwise wrote 1s to the budget in a
    forced tool call. Bounds the schema states are kept."""
    from edgespec.backend import GrammarVocab
    from edgespec.constraints import INTEGER_LIMIT, closed_objects, tokenizer_for
    assert closed_objects({"type": "integer"}) == {"type": "integer", "maximum": INTEGER_LIMIT,
                                                   "minimum": -INTEGER_LIMIT}
    assert closed_objects({"type": "integer", "minimum": 0}) == {
        "type": "integer", "minimum": 0, "maximum": INTEGER_LIMIT}
    vocab = GrammarVocab(smollm2_q4_path)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    def whole(text: str) -> bool:
        g = GrammarState(Constraint.json_schema(schema), tokenizer_for(smollm2_q4_path,
                                                                       lambda: vocab),
                         len(vocab.pieces))
        tokens = vocab.tokenize(text.encode())
        return g.consume(tokens) == len(tokens)
    assert whole('{"n": ' + "9" * 16 + "}") and whole('{"n": -' + "9" * 16 + "}")
    assert not whole('{"n": ' + "1" * 17 + "}")
