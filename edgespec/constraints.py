"""Grammar-constrained decoding: JSON schema, any JSON, a regular expression, a grammar (Lark, or
llama.cpp's GBNF). The only importer of the grammar engine, llguidance.

A :class:`Constraint` is what the output must match; it is checked when it is made (a bad
schema, regex or grammar is a one-line :class:`~edgespec.errors.ConstraintError`) and belongs
to no model. For a generation the Engine turns it into a :class:`GrammarState` over the target's
vocabulary: the set of tokens allowed at each position (a boolean mask), the tokens the grammar
forces next, and consume/rollback as tokens are drafted, accepted and rejected.

Lossless constrained speculation: the same allowed set masks the target's p and the draft's q
at every position, so the output is distributed exactly as the target's constrained sampling.
The grammar engine's tokenizer is built from a model's vocabulary once per model file and kept
for the life of the process (1-6 s for a 262k vocabulary).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
from llguidance import LLMatcher, LLParserLimits, LLTokenizer, TokenizerWrapper
from llguidance.gbnf_to_lark import any_to_lark

from .errors import BackendError, ConstraintError

# A schema, regex or grammar that takes longer than this to compile is refused.
COMPILE_SECONDS = 2.0

# JSON as people (and models' training data) write it: '{"a": 1, "b": 2}'. Compact JSON made
# the 135M test model nest objects until max_tokens (docs/decisions.md).
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _limits() -> LLParserLimits:
    # llguidance's defaults bound each step's work; verbose errors would echo whole grammars.
    return LLParserLimits(verbose_errors=False)


def _first_line(text: str) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line[:300]


def _with_deadline(what: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (which drops the GIL in the grammar engine) for at most COMPILE_SECONDS."""
    out: dict = {}

    def work() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread
            out["error"] = e
    t = threading.Thread(target=work, name="edgespec-grammar", daemon=True)
    t.start()
    t.join(COMPILE_SECONDS)
    if t.is_alive():
        raise ConstraintError(f"{what} is too complex: it did not compile in "
                              f"{COMPILE_SECONDS:g} s; simplify it")
    if "error" in out:
        raise out["error"]
    return out["value"]


@dataclass(frozen=True)
class Constraint:
    """What a generation's output must match. Build one with :meth:`json_schema`, :meth:`json`,
    :meth:`regex` or :meth:`grammar`; each checks its input and raises
    :class:`~edgespec.errors.ConstraintError` with the grammar engine's message."""

    kind: str
    source: str = field(repr=False)                 # the schema / regex / grammar as given
    compiled: str = field(repr=False)               # llguidance's grammar
    schema: Optional[dict] = field(default=None, repr=False, compare=False)

    @classmethod
    def json_schema(cls, schema: Any) -> "Constraint":
        """A JSON value matching ``schema``: a dict, a JSON string, or a pydantic model class
        (pydantic is not a dependency; a class with ``model_json_schema`` works)."""
        if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ConstraintError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise ConstraintError(f"a JSON schema must be a JSON object, not "
                                  f"{type(schema).__name__}")
        _check_schema(schema)
        grammar = LLMatcher.grammar_from_json_schema(closed_objects(schema),
                                                     defaults=_JSON_STYLE)
        return cls._checked("json_schema", json.dumps(schema), grammar, schema, "the JSON schema")

    @classmethod
    def json(cls) -> "Constraint":
        """Any JSON object (what OpenAI's ``response_format: json_object`` asks for)."""
        schema = {"type": "object"}
        grammar = LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_STYLE)
        return cls._checked("json", json.dumps(schema), grammar, schema, "the JSON grammar")

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        """Text that matches the regular expression ``pattern`` as a whole (Rust regex
        syntax: no look-around or back-references)."""
        if not isinstance(pattern, str) or not pattern:
            raise ConstraintError("a regular expression must be a non-empty string")
        return cls._checked("regex", pattern, LLMatcher.grammar_from_regex(pattern), None,
                            "the regular expression")

    @classmethod
    def grammar(cls, text: str) -> "Constraint":
        """Text that the grammar derives: Lark syntax (llguidance's dialect, with
        ``%json {…}`` for embedded schemas), or a llama.cpp GBNF grammar (``root ::= …``),
        converted to Lark."""
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError("a grammar must be a non-empty string")
        lark = text
        if "::=" in text:
            try:
                lark = any_to_lark(text)
            except Exception as e:  # noqa: BLE001 - the converter raises plain exceptions
                raise ConstraintError(f"the GBNF grammar could not be read: "
                                      f"{_first_line(e)}") from None
        return cls._checked("grammar", text, LLMatcher.grammar_from_lark(lark), None,
                            "the grammar")

    @classmethod
    def _checked(cls, kind: str, source: str, grammar: str, schema: Optional[dict],
                 what: str) -> "Constraint":
        is_error, messages = _with_deadline(
            what, lambda: LLMatcher.validate_grammar_with_warnings(grammar, None,
                                                                   limits=_limits()))
        if is_error:
            raise ConstraintError(f"{what} is invalid: {_first_line(messages[0])}")
        return cls(kind, source, grammar, schema)

    def after_reasoning(self, open_tag: str, close_tag: str, opened: bool,
                        tag_tokens: Optional[tuple[int, int]] = None) -> "Constraint":
        """This constraint on the answer that follows a reasoning block: free text up to the
        first ``close_tag``, in a block that ``open_tag`` starts (optional: the model may
        answer at once; absent when the prompt ``opened`` it), whitespace, then the answer
        held to this constraint. ``tag_tokens``: the tags' ids where each is one special
        token (the grammar names the tokens; their text is not the token). One grammar masks
        the target's p and the draft's q alike, reasoning included: still lossless."""
        if tag_tokens is None:
            block = f"body[stop={json.dumps(close_tag)}]: /(?s:.*)/\n"
            opening = json.dumps(open_tag)
        else:
            block = f"body: TEXT? <[{tag_tokens[1]}]>\nTEXT: /(?s:.+)/\n"
            opening = f"<[{tag_tokens[0]}]>"
        start = "start: body WS @answer\n" if opened else \
            f"start: reasoning? WS @answer\nreasoning: {opening} body\n"
        answer = json.loads(self.compiled) if self.compiled.lstrip().startswith("{") else \
            {"grammars": [{"lark_grammar": self.compiled}]}
        first, *rest = answer["grammars"]
        top = start + block + "WS: /[ \\t\\r\\n]*/\n"
        grammar = json.dumps({"grammars": [{"lark_grammar": top},
                                           {**first, "name": "answer"}, *rest]})
        return self._checked(self.kind, self.source, grammar, self.schema,
                             "the constraint after the reasoning")

    def parse(self, text: str) -> Any:
        """The value of a completed JSON output (``json_schema`` and ``json`` kinds), checked
        against the schema; raises :class:`ConstraintError` otherwise."""
        if self.kind not in ("json_schema", "json"):
            raise ConstraintError(f"a {self.kind} constraint has no JSON value")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"the output is not complete JSON: {e}") from None
        validate_json(value, self.schema)
        return value


_SUBSCHEMAS = ("items", "additionalItems", "contains", "not", "if", "then", "else")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")


# An integer with no bounds gets llama.cpp's: at most 16 digits. Greedy SmolLM2 held to a
# tool's {"population": integer} otherwise wrote 1s until the budget ended (a cut call).
INTEGER_LIMIT = 10 ** 16 - 1


def closed_objects(schema: Any) -> Any:
    """``schema`` with every object that lists its ``properties`` and says nothing of others
    closed to them (``additionalProperties: false``), as llama.cpp's schema-to-grammar does:
    a model held to a tool's schema otherwise invents keys (SmolLM2 sent get_weather(city,
    type, description), which the client's function refused). What the output may be only
    narrows, so the output still validates against ``schema`` as given. ``allOf`` members stay
    open: closing each would forbid the others' properties. An integer without bounds is held
    to 16 digits (:data:`INTEGER_LIMIT`), as llama.cpp's grammar holds it."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), (dict, list)):
            out[key] = closed_objects(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_objects(v) for k, v in out[key].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = closed_objects(out["additionalProperties"])
    if (isinstance(out.get("properties"), dict) and "additionalProperties" not in out
            and "patternProperties" not in out and "unevaluatedProperties" not in out
            and "allOf" not in out):
        out["additionalProperties"] = False
    if out.get("type") == "integer":
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = INTEGER_LIMIT
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -INTEGER_LIMIT
    return out


def _check_schema(schema: dict) -> None:
    import jsonschema
    dialect = schema.get("$schema") if isinstance(schema, dict) else None
    if dialect is not None and not isinstance(dialect, str):
        raise ConstraintError("the JSON schema is invalid at $schema: it must be a string, the "
                              "URI of a JSON Schema dialect")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        at = "/".join(str(p) for p in e.absolute_path)
        raise ConstraintError(f"the JSON schema is invalid{f' at {at}' if at else ''}: "
                              f"{_first_line(e.message)}") from None


def validate_json(value: Any, schema: Optional[dict]) -> None:
    """Raise :class:`ConstraintError` naming the first place ``value`` breaks ``schema``."""
    if schema is None:
        return
    import jsonschema
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        at = "/".join(str(p) for p in e.absolute_path)
        raise ConstraintError(f"the value does not match the schema{f' at {at}' if at else ''}"
                              f": {_first_line(e.message)}") from None


# ---------------------------------------------------------------------------------------------
# The grammar engine's tokenizer, one per model file


class _Vocab:
    """What llguidance's TokenizerWrapper reads: token bytes (control tokens prefixed with
    0xff, its convention), end-of-generation ids, and a tokenize function."""

    def __init__(self, pieces: list[bytes], eog: Sequence[int], bos: int,
                 special: Sequence[int], tokenize: Callable[[bytes], list[int]]):
        self.tokens = pieces
        self.eos_token_id = sorted(eog)[0] if eog else 0
        self.bos_token_id = bos if bos >= 0 else None
        self.special_token_ids = list(special)
        self._tokenize = tokenize

    def __call__(self, text: bytes) -> list[int]:
        return self._tokenize(text)


_TOKENIZERS: dict[tuple, LLTokenizer] = {}
_TOKENIZERS_LOCK = threading.Lock()


def tokenizer_for(path: os.PathLike, load_vocab: Callable[[], Any]) -> LLTokenizer:
    """The grammar engine's tokenizer for the model file at ``path``, built once per file (by
    path, size and mtime) from ``load_vocab()``, which returns an object with ``pieces``,
    ``eog``, ``bos``, ``special`` and ``tokenize`` (``edgespec.backend.GrammarVocab``)."""
    st = Path(path).stat()
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    with _TOKENIZERS_LOCK:
        tok = _TOKENIZERS.get(key)
        if tok is None:
            v = load_vocab()
            wrapper = TokenizerWrapper(_Vocab(v.pieces, sorted(v.eog), v.bos, v.special,
                                              v.tokenize))
            tok = _TOKENIZERS[key] = LLTokenizer(wrapper, n_vocab=len(v.pieces),
                                                 eos_token=sorted(v.eog))
        return tok


def special_tag_id(tokenizer: LLTokenizer, ids: Sequence[int]) -> Optional[int]:
    """The id of a tag that tokenized (special texts parsed) to ``ids``, where it is one token
    the grammar engine reads as special (a control token, or a user-defined ``<…>`` one such
    as Qwen's ``<tool_call>``): a grammar names it by id, since its bytes are not the tag's
    text. None: the tag is text."""
    return ids[0] if len(ids) == 1 and tokenizer.is_special_token(ids[0]) else None


# ---------------------------------------------------------------------------------------------
# A constraint during one generation


class GrammarState:
    """A :class:`Constraint`'s state over one model's vocabulary during one generation.

    ``depth`` counts the tokens consumed since the generation started; the mask at each depth
    is kept until a rollback passes it, so the verify pass reads the masks the drafts were
    drawn under. ``seconds`` is the time spent in the grammar engine.
    """

    def __init__(self, constraint: Constraint, tokenizer: LLTokenizer, n_vocab: int):
        self.constraint = constraint
        self.n_vocab = n_vocab
        self._eos = frozenset(tokenizer.eos_tokens)
        t0 = time.perf_counter()
        self._m = LLMatcher(tokenizer, constraint.compiled, log_level=0, limits=_limits())
        self.seconds = time.perf_counter() - t0
        self._check()
        self._masks: list[Optional[np.ndarray]] = [None]
        # Per consumed token: whether the matcher saw it. An end token is allowed where the
        # grammar may end but not fed to the matcher: its rollback does not count one.
        self._fed: list[bool] = []

    @property
    def depth(self) -> int:
        return len(self._masks) - 1

    def _check(self) -> None:
        if self._m.is_error():
            raise BackendError(f"the grammar engine failed: {_first_line(self._m.get_error())}")

    def mask(self, depth: Optional[int] = None) -> np.ndarray:
        """The tokens allowed after ``depth`` consumed tokens (default: now), as a boolean
        array of ``n_vocab``. Only depths not rolled back are kept."""
        d = self.depth if depth is None else depth
        m = self._masks[d]
        if m is None:
            assert d == self.depth, "masks are computed for the current state only"
            t0 = time.perf_counter()
            bits = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8)
            m = np.unpackbits(bits, bitorder="little")[:self.n_vocab].view(bool)
            self.seconds += time.perf_counter() - t0
            self._check()
            self._masks[d] = m
        return m

    def forced(self) -> list[int]:
        """Tokens the grammar forces next, whatever the model would say (e.g. ``"name": "``
        inside a JSON object): free drafts."""
        t0 = time.perf_counter()
        out = list(self._m.compute_ff_tokens())
        self.seconds += time.perf_counter() - t0
        return out

    def consume(self, tokens: Sequence[int]) -> int:
        """Advance through as many of ``tokens`` as the grammar allows; how many it took.
        The mask before each is computed on the way: the verify pass reads them all."""
        n = 0
        for t in tokens:
            if not self.mask()[t]:
                break
            fed = t not in self._eos
            if fed:
                t0 = time.perf_counter()
                ok = self._m.consume_token(int(t))
                self.seconds += time.perf_counter() - t0
                if not ok:
                    self._check()
                    raise BackendError(f"the grammar engine refused token {t} it had allowed")
            self._masks.append(None)
            self._fed.append(fed)
            n += 1
        return n

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` consumed tokens."""
        if n <= 0:
            return
        fed = sum(self._fed[len(self._fed) - n:])
        t0 = time.perf_counter()
        ok = self._m.rollback(fed) if fed else True
        self.seconds += time.perf_counter() - t0
        if not ok:
            self._check()
            raise BackendError(f"the grammar engine could not roll back {n} tokens")
        del self._masks[len(self._masks) - n:]
        del self._fed[len(self._fed) - n:]
