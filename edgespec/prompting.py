"""What a generation starts from: its prompt in tokens (through the model's chat template, the
tools it may call declared) and its grammar's state. :class:`Prompter` is the Engine's, over
its target model; any thread may use it (a chat template renders one at a time: its sandbox's
deadline is shared state).
"""

from __future__ import annotations

import threading
from typing import Optional

from .backend import GrammarVocab
from .chat_template import ChatTemplate, validate_messages
from .config import SamplingParams
from .constraints import Constraint, GrammarState, tokenizer_for
from .errors import ContextOverflowError, InvalidParameterError
from .lm import LoadedModel
from .request import GenerationRequest, Prompt, Request, Speculation, check_limits
from .tools import ToolPlan, plan_request


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

    def request(self, req: GenerationRequest, sampling: SamplingParams, n_ctx: int,
                speculation: Optional[Speculation]) -> Request:
        """``req`` checked and made ready to run: its prompt in tokens (with the tools it may
        call declared, and the grammar their calls follow), within ``n_ctx``."""
        stop = check_limits(req.max_tokens, req.stop, req.logprobs)
        constraint = req.constraint
        tokens, plan = self.plan(req)
        if plan is not None:
            if constraint is not None and plan.constraint is not None:
                raise InvalidParameterError("constraint", "a Constraint", "None when tools "
                                            "may be called (tool_choice='none' allows one)")
            constraint = plan.constraint or constraint
        if len(tokens) >= n_ctx:
            raise ContextOverflowError(len(tokens), n_ctx)
        return Request(tokens, req.max_tokens, sampling, stop=stop,
                       grammar=self.grammar(constraint), logprobs=req.logprobs,
                       finish=plan.finish if plan is not None else None,
                       speculation=speculation)

    def plan(self, req: GenerationRequest) -> tuple[list[int], Optional[ToolPlan]]:
        """``req``'s prompt tokens, and how it uses its tools (None: it has none)."""
        plan = plan_request(req.prompt, req.tools, req.tool_choice,
                            parallel=req.parallel_tool_calls,
                            native_template=self.template.writes_tool_call_tags)
        if plan is None:
            return self.tokens(req.prompt, raw=req.raw), None
        return self.tokens(plan.messages, tools=plan.template_tools, validated=True), plan

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        with self._life:
            return self.target.tokenize(text, add_special=add_special, parse_special=True)

    def tokens(self, prompt: Prompt, raw: bool = False, tools: Optional[list[dict]] = None,
               validated: bool = False) -> list[int]:
        """The exact tokens both models will see for ``prompt`` (``tools``: declared to a
        template that reads them; ``validated``: chat messages already checked)."""
        if isinstance(prompt, str) and raw:
            text = prompt
        else:
            messages = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                        else prompt if validated else validate_messages(prompt))
            with self._render:
                text = self.template.render(messages, add_generation_prompt=True, tools=tools,
                                            validate=False)
        tokens = self.tokenize(text)
        bos = self.target.vocab.bos
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
            tokens = tokens[1:]  # the template wrote BOS itself; do not double it
        if not tokens:
            raise InvalidParameterError("prompt", prompt, "a non-empty text")
        return tokens

    def grammar(self, constraint: Optional[Constraint]) -> Optional[GrammarState]:
        """A constraint's state over the target's vocabulary, for one generation (the grammar
        engine's tokenizer is built on first use of a model file, then kept)."""
        if constraint is None:
            return None
        if not isinstance(constraint, Constraint):
            raise InvalidParameterError("constraint", type(constraint).__name__,
                                        "a Constraint: Constraint.json_schema(schema), "
                                        ".json(), .regex(pattern) or .grammar(text)")
        path = self.target.path
        tokenizer = tokenizer_for(path, lambda: GrammarVocab(path))
        return GrammarState(constraint, tokenizer, self.target.n_vocab)
