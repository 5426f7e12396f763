"""Chat messages → prompt text, with the model's own GGUF chat template.

A GGUF's ``tokenizer.chat_template`` is code written by whoever made the file. It is rendered
only in jinja2's ``ImmutableSandboxedEnvironment`` (CVE-2024-34359 was llama-cpp-python
rendering it without one), and under limits: template size, output size and wall time, checked
at every call, attribute access, arithmetic operator and output chunk. A template that breaks a
rule or fails to render is replaced by the ChatML fallback with a warning, so a hostile file
can neither run code nor hang the program.

A model without a template (a base model, such as Gemma-3-270M) is never given ChatML markup
it did not declare: its messages are sent as plain text (:data:`PLAIN`), their contents one
after another with a blank line between them, so that it continues the text; one user
message is sent exactly as written, as ``edgespec run`` sends a prompt.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from datetime import datetime
from typing import Any, Mapping, Optional, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from .errors import InvalidParameterError, PromptTooLargeError, TemplateError, TemplateRefused
from .thinking import thinking_mode

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")

MAX_TEMPLATE_BYTES = 256 * 1024
MAX_OUTPUT_CHARS = 4 * 1024 * 1024
MAX_INPUT_CHARS = MAX_OUTPUT_CHARS // 2
MAX_RENDER_SECONDS = 1.0

# llama.cpp's fallback when a model carries no template.
CHATML = ("{% for message in messages %}"
          "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# A model without a template: the contents as plain text, for the model to continue.
PLAIN = ("{% for message in messages %}{% if not loop.first %}{{ '\n\n' }}{% endif %}"
         "{{ message['content'] }}{% endfor %}")
# What renders a model's messages (ChatTemplate.label), as replies and listings say it
LABELS = {"model": "model", "plain": "none (plain text)", "chatml": "fallback (ChatML)"}


def validate_messages(messages: Any) -> list[dict]:
    """Check a list of ``{"role", "content"}`` dicts; return plain copies.

    An assistant message may carry ``tool_calls`` (OpenAI's shape; its content may then be
    absent), and a ``tool`` message a ``tool_call_id`` (and ``name``): they are kept, the calls
    normalized (:func:`normalize_calls`)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidParameterError("messages", type(messages).__name__,
                                    "a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidParameterError(f"messages[{i}]", m, "an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise InvalidParameterError(f"messages[{i}].role", role, "one of " + ", ".join(ROLES))
        calls = m.get("tool_calls") if role == "assistant" else None
        if content is None and calls:
            content = ""
        if not isinstance(content, str):
            raise InvalidParameterError(f"messages[{i}].content", content, "a string")
        msg = {"role": role, "content": content}
        if calls:
            msg["tool_calls"] = normalize_calls(calls, f"messages[{i}].tool_calls")
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if isinstance(m.get(key), str):
                    msg[key] = m[key]
        out.append(msg)
    return out


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def normalize_calls(calls: Any, where: str) -> list[dict]:
    """A message's ``tool_calls`` in OpenAI's shape, arguments as JSON text."""
    if not isinstance(calls, list):
        raise InvalidParameterError(where, type(calls).__name__, "a list of tool calls")
    out = []
    for i, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise InvalidParameterError(f"{where}[{i}]", c, "{'id', 'type': 'function', "
                                        "'function': {'name', 'arguments'}}")
        args = f.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        out.append({"id": str(c.get("id") or new_call_id()), "type": "function",
                    "function": {"name": f["name"], "arguments": args}})
    return out



def arguments_value(text: str) -> Any:
    """JSON text as its value (a string that is not JSON stays a string)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _as_templates_read_them(messages: Sequence[dict]) -> list[dict]:
    """A call's arguments as an object: templates that know tools write them with
    ``tool_call.function.arguments | tojson``."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments":
                                                        arguments_value(c["function"]["arguments"])}}
                                     for c in m["tool_calls"]]}
        out.append(m)
    return out


class _LimitedSandbox(ImmutableSandboxedEnvironment):
    """A sandbox that also enforces a deadline and output-size limits."""

    intercepted_binops = frozenset({"*", "**", "+", "//", "%"})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.deadline = float("inf")

    def _tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError(f"rendering took longer than {MAX_RENDER_SECONDS:g} s")

    def unsafe_undefined(self, obj, attribute):
        # The stock sandbox returns an undefined value that prints as ''; a template that
        # reaches for internals is hostile, so fail loudly and fall back instead.
        raise SecurityError(f"access to {attribute!r} of a {type(obj).__name__} is not allowed")

    def call(self, __context, __obj, *args, **kwargs):
        self._tick()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj, attribute):
        self._tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        self._tick()
        return super().getitem(obj, argument)

    def call_binop(self, context, operator, left, right):
        self._tick()
        if operator == "+" and isinstance(left, (str, list, tuple)) and \
                isinstance(right, (str, list, tuple)) and \
                len(left) + len(right) > MAX_OUTPUT_CHARS:
            raise TemplateError("template builds an oversized value")
        if operator in ("*", "**"):
            for a, b in ((left, right), (right, left)):
                if isinstance(a, (str, list, tuple)) and isinstance(b, int) and \
                        len(a) * max(b, 0) > MAX_OUTPUT_CHARS:
                    raise TemplateError("template builds an oversized value")
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise TemplateError("template computes an oversized power")
        return super().call_binop(context, operator, left, right)


def _raise_exception(message: str) -> None:
    raise TemplateRefused(f"the model's chat template refused this conversation: {message}")


class ChatTemplate:
    """A compiled chat template with its special-token strings."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        self.bos_token, self.eos_token = bos_token, eos_token
        self.env = _LimitedSandbox(trim_blocks=True, lstrip_blocks=True,
                                   extensions=["jinja2.ext.loopcontrols"])
        self.env.globals.update(raise_exception=_raise_exception,
                                strftime_now=lambda fmt: datetime.now().strftime(fmt))
        self.fallback_reason: str | None = None
        self.source = source
        if source is None:
            self.fallback_reason = "the model has no chat template"
        elif len(source.encode("utf-8", "replace")) > MAX_TEMPLATE_BYTES:
            self.fallback_reason = f"its chat template is larger than {MAX_TEMPLATE_BYTES} bytes"
        else:
            try:
                self._template = self.env.from_string(source)
            except jinja2.TemplateError as e:
                self.fallback_reason = f"its chat template does not compile ({e})"
        if self.fallback_reason:
            self._template = self.env.from_string(CHATML if source is not None else PLAIN)
        self.thinking = thinking_mode(source) if not self.fallback_reason else None

    @property
    def is_fallback(self) -> bool:
        return self.fallback_reason is not None

    @property
    def label(self) -> str:
        """What renders the messages: ``"model"`` (its own template), ``"none (plain text)"``
        (it has none: :data:`PLAIN`) or ``"fallback (ChatML)"`` (its template failed)."""
        return LABELS["model" if not self.is_fallback else
                      "plain" if self.source is None else "chatml"]

    @property
    def supports_tools(self) -> bool:
        """Whether the model's own template declares tools (it reads ``tools``)."""
        return not self.is_fallback and "tools" in (self.source or "")

    @property
    def writes_tool_call_tags(self) -> bool:
        """Whether its tool calls are ``<tool_call>…</tool_call>`` blocks (Hermes, Qwen)."""
        return self.supports_tools and "<tool_call>" in (self.source or "")

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Optional[list[dict]] = None, validate: bool = True,
               variables: Mapping[str, Any] = {}) -> str:
        """The prompt text for ``messages`` ending with the assistant's cue; ``tools``
        (OpenAI's shape) go to templates that declare them. ``validate=False``: the messages
        were checked with :func:`validate_messages` already (and may have been prepared for
        the template since). ``variables``: more for the template to read (``enable_thinking``
        …: :func:`edgespec.thinking.template_variables`)."""
        msgs = _as_templates_read_them(validate_messages(messages) if validate else messages)
        size = sum(len(m["content"]) for m in msgs)
        if size > MAX_INPUT_CHARS:
            # Too big for any template's limits (and far beyond any context window): the
            # conversation is at fault, not the template, so do not fall back for good.
            raise PromptTooLargeError(f"the conversation is {size} characters; the most one "
                                      f"prompt may hold is {MAX_INPUT_CHARS}")
        try:
            return self._render(self._template, msgs, add_generation_prompt, tools, variables)
        except (TemplateError, SecurityError, jinja2.TemplateError, TypeError, ValueError,
                AttributeError, KeyError, IndexError, RecursionError, OverflowError) as e:
            if self.is_fallback:
                raise PromptTooLargeError(f"the conversation could not be rendered ({e})") \
                    from None
            log.warning("chat template of this model failed (%s); using the ChatML fallback", e)
            self.fallback_reason = f"its chat template failed to render ({e})"
            self._template = self.env.from_string(CHATML)
            self.thinking = None
            return self._render(self._template, msgs, add_generation_prompt)

    def _render(self, template: jinja2.Template, msgs: list[dict],
                add_generation_prompt: bool, tools: Optional[list[dict]] = None,
                variables: Mapping[str, Any] = {}) -> str:
        self.env.deadline = time.monotonic() + MAX_RENDER_SECONDS
        parts: list[str] = []
        size = 0
        extra = {**variables, **({"tools": tools} if tools else {})}
        try:
            for chunk in template.generate(messages=msgs,
                                           add_generation_prompt=add_generation_prompt,
                                           bos_token=self.bos_token, eos_token=self.eos_token,
                                           **extra):
                size += len(chunk)
                if size > MAX_OUTPUT_CHARS:
                    raise TemplateError("template output is larger than "
                                        f"{MAX_OUTPUT_CHARS} characters")
                self.env._tick()
                parts.append(chunk)
        finally:
            self.env.deadline = float("inf")
        return "".join(parts)
