"""Tool calls: functions a model may call, how they reach the prompt, the constrained shape of
a call, and turning the output into calls whose arguments match the tool's schema.

Two formats, as llama.cpp's server has:

* **native** — the GGUF's chat template declares tools (it reads ``tools``) and writes calls as
  ``<tool_call>{"name": …, "arguments": …}</tool_call>`` (Hermes, Qwen and the models trained
  like them): the template renders the tools and the history; the output is a grammar of
  free text or such calls.
* **generic** — any other template: a system instruction lists the tools, and the output is
  one JSON object, ``{"tool_call": {"name": …, "arguments": {…}}}`` to call (with parallel
  calls allowed, ``{"tool_calls": [{…}, …]}``), or ``{"response": "…"}`` to answer. Calls and
  tool results in the history are written in the same JSON, so the model sees the format it
  must continue.

Parallel calls are off unless asked for (as in llama.cpp's server): small models asked for a
list of calls tend to repeat the same call until the token budget ends.

Either way the output is constrained (:mod:`edgespec.constraints`), so a call always names a
given tool and its arguments always parse; they are checked against the tool's schema too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .chat_template import arguments_value, new_call_id, validate_messages
from .constraints import Constraint, _check_schema, closed_objects, validate_json
from .errors import ConstraintError, InvalidParameterError

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHOICES = ("auto", "none", "required")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, what it does, its parameters' JSON schema."""

    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})

    @classmethod
    def parse(cls, spec: Any, where: str = "tools[0]", schema: str = "parameters") -> "Tool":
        """From OpenAI's shape ``{"type": "function", "function": {"name", "description",
        "parameters"}}`` or the bare ``{"name", …}``; a bad one is a one-line error.
        ``schema``: the key of the parameters' JSON schema (Anthropic's ``input_schema``)."""
        if isinstance(spec, Tool):
            return spec
        if not isinstance(spec, dict):
            raise ConstraintError(f"{where} must be an object with a function")
        if "function" in spec or spec.get("type") is not None:
            if spec.get("type", "function") != "function":
                raise ConstraintError(f"{where}.type must be 'function', not "
                                      f"{spec.get('type')!r}")
            spec = spec.get("function")
            where += ".function"
            if not isinstance(spec, dict):
                raise ConstraintError(f"{where} must be an object with a name")
        name = spec.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConstraintError(f"{where}.name must be 1-64 letters, digits, '_' or '-', "
                                  f"not {name!r}")
        description = spec.get("description") or ""
        if not isinstance(description, str):
            raise ConstraintError(f"{where}.description must be a string")
        params = spec.get(schema, {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ConstraintError(f"{where}.{schema} must be a JSON schema object")
        try:
            _check_schema(params)
        except ConstraintError as e:
            raise ConstraintError(f"{where}.{schema}: {e}") from None
        return cls(name, description, params)

    def to_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name,
                                                 "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: ``arguments`` is JSON text that matches the tool's schema."""

    id: str
    name: str
    arguments: str

    @property
    def parsed_arguments(self) -> dict:
        return json.loads(self.arguments)

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def parse_tools(tools: Any, schema: str = "parameters") -> list[Tool]:
    """``tools`` as Tools (see :meth:`Tool.parse`; ``schema``: the key of their schemas)."""
    if not isinstance(tools, (list, tuple)) or not tools:
        raise ConstraintError("tools must be a non-empty list of tool definitions")
    out = [Tool.parse(t, f"tools[{i}]", schema) for i, t in enumerate(tools)]
    names = [t.name for t in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ConstraintError(f"tools: the name {dup!r} is given twice")
    return out


def parse_choice(choice: Any, tools: Sequence[Tool]) -> str:
    """``"auto"``, ``"none"``, ``"required"``, or the name of the one tool to call (given as
    a name, or OpenAI's ``{"type": "function", "function": {"name": …}}``)."""
    if choice is None:
        return "auto"
    if isinstance(choice, dict):
        choice = (choice.get("function") or {}).get("name")
        if not isinstance(choice, str):
            raise InvalidParameterError("tool_choice", choice, "{'type': 'function', "
                                        "'function': {'name': NAME}}")
    elif choice in CHOICES:
        return choice
    names = [t.name for t in tools]
    if choice not in names:
        raise InvalidParameterError("tool_choice", choice,
                                    "'auto', 'none', 'required' or one of the tools: "
                                    + ", ".join(names))
    return choice


# ---------------------------------------------------------------------------------------------
# Messages that carry calls and results


def for_generic_template(messages: Sequence[dict], as_json: bool = True) -> list[dict]:
    """Messages for a template that knows nothing of tools: calls become the assistant's JSON
    (the format the model is asked to write), results become user messages in JSON. With
    ``as_json=False`` (no call may be made now) both are said in words, so the model answers
    in words rather than imitate the JSON."""
    if not as_json:
        return [_in_words(m) for m in messages]
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"],
                      "arguments": arguments_value(c["function"]["arguments"])}
                     for c in m["tool_calls"]]
            value = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
            out.append({"role": "assistant", "content": json.dumps(value, ensure_ascii=False)})
        elif m["role"] == "tool":
            result = {"tool_call_id": m.get("tool_call_id", ""),
                      "content": arguments_value(m["content"])}
            if m.get("name"):
                result["name"] = m["name"]
            out.append({"role": "user", "content": json.dumps({"tool_response": result},
                                                              ensure_ascii=False)})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def _in_words(m: dict) -> dict:
    if m["role"] == "assistant" and m.get("tool_calls"):
        calls = "; ".join(f"I called {c['function']['name']} with {c['function']['arguments']}"
                          for c in m["tool_calls"])
        return {"role": "assistant", "content": (m["content"] + "\n" if m["content"] else "")
                + calls + "."}
    if m["role"] == "tool":
        return {"role": "user", "content": f"The tool {m.get('name') or 'call'} returned: "
                                           f"{m['content']}"}
    return {"role": m["role"], "content": m["content"]}


# ---------------------------------------------------------------------------------------------
# One request's plan


def _call_schema(tools: Sequence[Tool]) -> dict:
    return {"anyOf": [{"type": "object",
                       "properties": {"name": {"const": t.name},
                                      "arguments": closed_objects(t.parameters)},
                       "required": ["name", "arguments"], "additionalProperties": False}
                      for t in tools]}


GENERIC_INSTRUCTION = (
    "You can call these tools (JSON schemas of their arguments):\n{tools}\n"
    "Answer with one JSON object: {call} to call {what}{or_respond}. A tool's result comes "
    "back as {{\"tool_response\": …}}{then}.")


@dataclass
class ToolPlan:
    """How one request uses its tools: the messages the template renders, the template's
    ``tools`` argument, the output's constraint, and how the output becomes calls."""

    tools: list[Tool]
    choice: str
    native: bool
    messages: list[dict]
    template_tools: Optional[list[dict]]
    constraint: Optional[Constraint]

    @classmethod
    def make(cls, messages: list[dict], tools: Optional[Sequence[Tool]], choice: str,
             native_template: bool, parallel: bool = False,
             tag_ids: Optional[tuple[int, int]] = None) -> "ToolPlan":
        """The plan of ``messages`` with ``tools`` and ``choice``. ``parallel``: several calls
        in one answer, where the template writes call tags (``native_template``); the
        generic JSON format makes one at a time: small models repeat one call in it until
        the budget ends (docs/decisions.md, "generic-tool-calls")."""
        tools = list(tools or [])
        parallel = parallel and native_template
        use = [t for t in tools if choice in CHOICES or t.name == choice]
        if not use or choice == "none":
            # No call may be made; the history may still hold calls and results.
            msgs = (list(messages) if native_template
                    else for_generic_template(messages, as_json=False))
            return cls(tools, "none", native_template, msgs,
                       [t.to_openai() for t in tools] if native_template and tools else None,
                       None)
        if native_template:
            return cls(tools, choice, True, list(messages),
                       [t.to_openai() for t in tools],
                       _native_constraint(use, choice, parallel, tag_ids))
        listing = json.dumps([{"name": t.name, "description": t.description,
                               "parameters": t.parameters} for t in use], ensure_ascii=False)
        instruction = GENERIC_INSTRUCTION.format(
            tools=listing, what="tools" if parallel else "a tool",
            call=('{"tool_calls": [{"name": TOOL, "arguments": {…}}, …]}' if parallel else
                  '{"tool_call": {"name": TOOL, "arguments": {…}}}'),
            or_respond=(', or {"response": TEXT} to answer directly' if choice == "auto"
                        else ""),
            then=("; once the results answer the question, answer with "
                  '{"response": TEXT}. For example, after {"tool_response": {"content": '
                  '{"temperature": 21}}} to a question about the temperature: {"response": '
                  '"It is 21 degrees."}' if choice == "auto" else ""))
        msgs = for_generic_template(messages)
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + instruction}
        else:
            msgs.insert(0, {"role": "system", "content": instruction})
        key, call = (("tool_calls", {"type": "array", "items": _call_schema(use),
                                     "minItems": 1}) if parallel else
                     ("tool_call", _call_schema(use)))
        calls = {"type": "object", "properties": {key: call}, "required": [key],
                 "additionalProperties": False}
        schema = calls if choice != "auto" else {"anyOf": [calls, {
            "type": "object", "properties": {"response": {"type": "string"}},
            "required": ["response"], "additionalProperties": False}]}
        return cls(tools, choice, False, msgs, None, Constraint.json_schema(schema))

    def finish(self, gen):
        """A finished :class:`~edgespec.results.Generation` in its final form: the answer's
        text, and the calls the output makes (``finish_reason`` ``"tool_calls"``)."""
        complete = gen.finish_reason == "stop"
        gen.text, gen.tool_calls = self.calls(gen.text, complete)
        if gen.tool_calls and complete:
            gen.finish_reason = "tool_calls"
        return gen

    def calls(self, text: str, complete: bool) -> tuple[str, list[ToolCall]]:
        """(content, calls) of an output. An incomplete output (cut by max_tokens) has its
        answer's text as far as it got, never the format's wrapper (a cut ``{"response":
        "…`` gives the text inside), and only the calls it completed (a cut call gives
        neither text nor a call)."""
        if self.constraint is None:
            return text, []
        if self.native:
            return self._native_calls(text)
        if not complete:
            return _cut_response(text), []
        value = json.loads(text)            # the grammar guarantees JSON
        if "response" in value:
            return value["response"], []
        found = value["tool_calls"] if "tool_calls" in value else [value["tool_call"]]
        return "", [self._call(c["name"], c["arguments"]) for c in found]

    def _native_calls(self, text: str) -> tuple[str, list[ToolCall]]:
        if CALL_OPEN not in text:
            return text, []
        content = text.split(CALL_OPEN, 1)[0].strip()
        found = re.finditer(f"{CALL_OPEN}\\s*(.*?)\\s*{CALL_CLOSE}", text, re.S)
        calls = []
        for m in found:
            value = json.loads(m.group(1))
            calls.append(self._call(value["name"], value.get("arguments", {})))
        return content, calls

    def _call(self, name: str, arguments: Any) -> ToolCall:
        tool = next(t for t in self.tools if t.name == name)
        validate_json(arguments, tool.parameters)
        return ToolCall(new_call_id(), name, json.dumps(arguments, ensure_ascii=False))


def plan_request(prompt: Any, tools: Optional[Sequence], tool_choice: Any, *,
                 native_template: bool, parallel: bool = False,
                 special_id: Callable[[str], Optional[int]] = lambda tag: None
                 ) -> Optional[ToolPlan]:
    """How a request uses tools; None when it has none and its history (a list of messages)
    holds no calls or results, so the ordinary path serves it. ``special_id(tag)``: the id
    of ``tag`` where it is one special token of the model's vocabulary (None: text)."""
    if tools is None and tool_choice is None:
        if isinstance(prompt, str) or not any(
                isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool")
                for m in prompt):
            return None
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    parsed = parse_tools(tools) if tools is not None else []
    ids = (special_id(CALL_OPEN), special_id(CALL_CLOSE)) if native_template else (None,)
    return ToolPlan.make(validate_messages(prompt), parsed,
                         parse_choice(tool_choice, parsed) if parsed else "none",
                         native_template=native_template, parallel=parallel,
                         tag_ids=ids if None not in ids else None)


def _native_constraint(tools: Sequence[Tool], choice: str, parallel: bool,
                       tag_ids: Optional[tuple[int, int]]) -> Constraint:
    """``auto``: free text, optionally followed by ``<tool_call>`` blocks; otherwise only
    calls (one, unless ``parallel``). ``tag_ids``: the tags' ids where each is one special
    token (Qwen's): the grammar names the tokens the model was trained to write, and free
    text may then hold any character; else the tags are text, and free text stops at ``<``."""
    if tag_ids is not None:
        open_, close, text = f"<[{tag_ids[0]}]>", f"<[{tag_ids[1]}]>", "/(?s:.+)/"
    else:
        open_, close, text = json.dumps(CALL_OPEN), json.dumps(CALL_CLOSE), "/[^<]+/"
    rules = ('calls: call ("\\n" call)*\n' if parallel else 'calls: call\n') + \
        f'call: {open_} "\\n" %json {json.dumps(_call_schema(tools))} "\\n" {close}\n'
    start = f"start: TEXT | TEXT? calls\nTEXT: {text}\n" if choice == "auto" else \
        "start: calls\n"
    return Constraint.grammar(start + rules)


def _cut_response(text: str) -> str:
    """The text inside a generic answer ``{"response": "…`` cut before its end (what the
    JSON string holds so far, an escape cut in half left out); "" for a cut call."""
    m = re.match(r'\s*\{\s*"response"\s*:\s*"', text)
    if m is None:
        return ""
    body = text[m.end():]
    try:
        value, _ = json.JSONDecoder().raw_decode('"' + body)
        return value                                   # the string ended; only "}" was cut
    except ValueError:
        pass
    for cut in range(min(len(body), 6) + 1):           # drop a half escape: \, \u00e
        try:
            return json.loads('"' + body[:len(body) - cut] + '"')
        except ValueError:
            continue
    return ""
