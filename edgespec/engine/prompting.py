"""What a generation starts from: its prompt in tokens (through the model's chat template, the
tools it may call declared) and its grammar's state. :class:`Prompter` is the Engine's, over
its target model; any thread may use it (a chat template renders one at a time: its sandbox's
deadline is shared state).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..backend import GrammarVocab
from ..chat_template import ChatTemplate, validate_messages
from ..constraints import Constraint, GrammarState, special_tag_id, tokenizer_for
from ..errors import ContextOverflowError, InvalidParameterError
from ..lm import LoadedModel
from .request import GenerationRequest, Prepared, Prompt

if TYPE_CHECKING:
    from .drafting import Speculation
from ..thinking import reads_thinking, separates, template_variables
from ..tools import ToolPlan, plan_request

# The repo-level fill-in-the-middle tokens, by the texts llama.cpp finds them by (its
# fim_rep and fim_sep), and what it writes around other files: its placeholder names of the
# repository and of the gap's file, and the separator of a model without those tokens.
REPO_TOKENS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
FILE_TOKENS = ("<|file_sep|>",)
REPO_NAME, GAP_FILE_NAME = "myproject\n", "filename\n"
SNIPPET = "\n\n--- snippet ---\n\n"


class Prompter:
    """Prompts and constraints of ``target``'s generations. ``life``: a lock held while the
    model is used outside a generation (its owner holds it while it frees the model)."""

    def __init__(self, target: LoadedModel, life: threading.Lock):
        self.target, self._life = target, life

        def special(t: int) -> str:
            return target.token_text(t).decode("utf-8", "replace") if t >= 0 else ""
        self.template = ChatTemplate(target.info.chat_template,
                                     bos_token=special(target.vocab.bos),
                                     eos_token=special(target.vocab.eos))
        self._render = threading.Lock()
        self._repo: Optional[tuple] = None       # the repo-level FIM tokens, once looked up

    def prepare(self, req: GenerationRequest, n_ctx: int,
                speculation: Optional["Speculation"]) -> tuple[Prepared, Any]:
        """``req`` made ready to run: its prompt in tokens (with the tools it may call
        declared, and the grammar their calls follow), within ``n_ctx``; and, for a thinking
        model, what separates its reasoning from its answer (None otherwise)."""
        constraint = req.constraint
        mode = separates(self.template.thinking, req.think,
                         raw=isinstance(req.prompt, str) and (req.raw or req.suffix is not None))
        text, tokens, plan = self.plan(req)
        if plan is not None:
            if constraint is not None and plan.constraint is not None:
                raise InvalidParameterError("constraint", "a Constraint", "None when tools "
                                            "may be called (tool_choice='none' allows one)")
            constraint = plan.constraint or constraint
        if len(tokens) >= n_ctx:
            raise ContextOverflowError(len(tokens), n_ctx)
        thinking, constraint, finish = reads_thinking(
            mode, text, constraint, plan.finish if plan is not None else None,
            self.special_id)
        prepared = Prepared(req, tokens, grammar=self.grammar(constraint), finish=finish,
                            speculation=speculation)
        return prepared, thinking

    def plan(self, req: GenerationRequest) -> tuple[str, list[int], Optional[ToolPlan]]:
        """``req``'s prompt as text and tokens, and how it uses its tools (None: none)."""
        if req.suffix is not None:
            return req.prompt, self.infill(req), None
        plan = plan_request(req.prompt, req.tools, req.tool_choice,
                            parallel=req.parallel_tool_calls,
                            native_template=self.template.writes_tool_call_tags,
                            special_id=self.special_id)
        if plan is None:
            text = self.text(req.prompt, raw=req.raw, think=req.think)
        else:
            text = self.text(plan.messages, tools=plan.template_tools, validated=True,
                             think=req.think)
        return text, self._tokens(text, req.prompt), plan

    def infill(self, req: GenerationRequest) -> list[int]:
        """The tokens of a fill-in-the-middle request: the text before and after the gap in
        the model's FIM tokens, prefix-suffix-middle (as llama.cpp's ``/infill``), the texts
        tokenized without reading special tokens in them. With ``infill_files`` (the server's
        ``/infill``), the other files come first (:meth:`_files`) and the whole is cut to fit
        the context as llama.cpp cuts it (:func:`fit_infill`)."""
        fim = self.target.vocab.fim
        if fim is None:
            raise InvalidParameterError("suffix", req.suffix, "left out: this model does not "
                                        "fill in the middle (its vocabulary has no fill-in-"
                                        "the-middle tokens); use a code model such as "
                                        "Qwen2.5-Coder")
        if not isinstance(req.prompt, str):
            raise InvalidParameterError("prompt", type(req.prompt).__name__, "a text (the "
                                        "code before the gap) when a suffix is given")
        if req.tools is not None or req.think:
            raise InvalidParameterError("suffix", req.suffix, "left out with tools or thinking: "
                                        "filling in the middle writes code, not calls")
        with self._life:
            before, after = (self._plain(t) for t in (req.prompt, req.suffix))
            files = self._files(req.infill_files) if req.infill_files is not None else []
        bos = [self.target.vocab.bos] if self.target.vocab.add_bos else []
        if req.infill_files is not None:
            n_ctx = self.target.n_ctx
            room = n_ctx - min(req.max_tokens, n_ctx // 2) - len(bos) - len(fim)
            before, after, files = fit_infill(before, after, files, room)
        return bos + files + [fim[0], *before, fim[1], *after, fim[2]]

    def _plain(self, text: str) -> list[int]:
        """``text``'s tokens, special tokens read as text (hold ``_life``)."""
        return self.target.tokenize(text, add_special=False, parse_special=False) if text \
            else []

    def _files(self, files: Sequence[tuple[str, str]]) -> list[int]:
        """Other files' tokens, before the gap's file (hold ``_life``): in the repo-level
        format where the model has its tokens (Qwen2.5-Coder's ``<|repo_name|>`` and
        ``<|file_sep|>``: ``REPO myproject, SEP name, text, …, SEP filename``, with llama.cpp's
        placeholder names), else each text after a ``--- snippet ---`` line, as llama.cpp."""
        if self._repo is None:
            self._repo = tuple(self._special(texts) for texts in (REPO_TOKENS, FILE_TOKENS))
        repo, sep = self._repo
        out = [repo, *self._plain(REPO_NAME)] if repo is not None else []
        for name, text in files:
            out += [sep, *self._plain(name + "\n")] if sep is not None else self._plain(SNIPPET)
            out += self._plain(text)
        return out + ([sep, *self._plain(GAP_FILE_NAME)] if sep is not None else [])

    def _special(self, texts: Sequence[str]) -> Optional[int]:
        """The id of the first of ``texts`` that is one special token of the model (found by
        its text, as llama.cpp finds its FIM tokens), or None (hold ``_life``)."""
        for text in texts:
            ids = self.target.tokenize(text, add_special=False, parse_special=True)
            if len(ids) == 1 and self._plain(text) != ids:
                return ids[0]
        return None

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        with self._life:
            return self.target.tokenize(text, add_special=add_special, parse_special=True)

    def text(self, prompt: Prompt, raw: bool = False, tools: Optional[list[dict]] = None,
             validated: bool = False, think: Any = None) -> str:
        """The text :meth:`tokens` tokenizes: ``prompt`` as-is (``raw``), else in the model's
        chat template (``tools`` declared to a template that reads them; ``think``: its
        thinking mode on or off, :mod:`edgespec.thinking`; ``validated``: messages already
        checked)."""
        if isinstance(prompt, str) and raw:
            return prompt
        messages = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                    else prompt if validated else validate_messages(prompt))
        with self._render:
            return self.template.render(messages, add_generation_prompt=True, tools=tools,
                                        validate=False, variables=template_variables(think))

    def tokens(self, prompt: Prompt, raw: bool = False, tools: Optional[list[dict]] = None,
               validated: bool = False, think: Any = None) -> list[int]:
        """The exact tokens both models will see for ``prompt`` (as :meth:`text`)."""
        return self._tokens(self.text(prompt, raw, tools, validated, think), prompt)

    def _tokens(self, text: str, prompt: Prompt) -> list[int]:
        tokens = self.tokenize(text)
        bos = self.target.vocab.bos
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
            tokens = tokens[1:]  # the template wrote BOS itself; do not double it
        if not tokens:
            raise InvalidParameterError("prompt", prompt, "a non-empty text")
        return tokens

    def special_id(self, tag: str) -> Optional[int]:
        """The id of ``tag`` where it is one token that the grammar engine reads as special
        (a control token, or a user-defined one such as Qwen's ``<tool_call>``): grammars
        name such a token by id, since its text is not its bytes. None: ``tag`` is text."""
        with self._life:
            ids = self.target.tokenize(tag, add_special=False, parse_special=True)
        return special_tag_id(self._grammar_tokenizer(), ids)

    def _grammar_tokenizer(self):
        path = self.target.path
        return tokenizer_for(path, lambda: GrammarVocab(path))

    def grammar(self, constraint: Optional[Constraint]) -> Optional[GrammarState]:
        """A constraint's state over the target's vocabulary, for one generation (the grammar
        engine's tokenizer is built on first use of a model file, then kept)."""
        if constraint is None:
            return None
        if not isinstance(constraint, Constraint):
            raise InvalidParameterError("constraint", type(constraint).__name__,
                                        "a Constraint: Constraint.json_schema(schema), "
                                        ".json(), .regex(pattern) or .grammar(text)")
        return GrammarState(constraint, self._grammar_tokenizer(), self.target.n_vocab)


def fit_infill(before: list[int], after: list[int], files: list[int],
               room: int) -> tuple[list[int], list[int], list[int]]:
    """The prefix, suffix and other files' tokens cut to ``room`` as llama.cpp's ``/infill``
    cuts them: the prefix's end and the suffix's start first (the suffix a quarter at most
    when both do not fit), then as much of the files as is left, from their end (the files
    nearest the gap come last)."""
    room = max(room, 0)
    if len(before) + len(after) > room:
        after = after[:min(len(after), room // 4)]
        before = before[max(0, len(before) - (room - len(after))):]
    take = min(len(files), room - len(before) - len(after))
    return before, after, files[len(files) - take:]
