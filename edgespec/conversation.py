"""One conversation's state, for any shell: a system prompt kept apart, user/assistant turns,
answers that were interrupted, dropping the oldest turns when the context is full, and saving
to / loading from JSON."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable, Mapping

from .chat_template import ROLES
from .errors import ContextOverflowError, ConversationFileError

CONVERSATION_FORMAT = "edgespec-conversation"


class Conversation:
    """The messages of one chat: a system prompt kept apart, then user/assistant turns.

    An answer stopped by the user stays in the conversation with ``"interrupted": True``; the
    model sees its text as it was produced. A turn is a user message and the messages after it
    up to the next user message. When the context would overflow, :meth:`make_room` drops
    whole turns from the oldest; the system prompt is never dropped.
    """

    def __init__(self, system: str | None = None, messages: Iterable[Mapping] = ()):
        self.system = system or None
        self.messages: list[dict] = [dict(m) for m in messages]

    # -- editing --------------------------------------------------------------------------

    def add_turn(self, user: str, answer: str, interrupted: bool = False) -> None:
        self.messages.append({"role": "user", "content": user})
        reply = {"role": "assistant", "content": answer}
        if interrupted:
            reply["interrupted"] = True
        self.messages.append(reply)

    def reset(self) -> None:
        """Forget every turn; keep the system prompt."""
        self.messages.clear()

    @property
    def n_turns(self) -> int:
        return sum(m["role"] == "user" for m in self.messages)

    def drop_oldest_turn(self) -> None:
        if self.messages:
            del self.messages[0]
        while self.messages and self.messages[0]["role"] != "user":
            del self.messages[0]

    # -- what the model sees --------------------------------------------------------------

    def for_model(self, pending: str | None = None) -> list[dict[str, str]]:
        """``{"role", "content"}`` messages: system prompt, turns, then ``pending`` (user)."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        out += [{"role": m["role"], "content": m["content"]} for m in self.messages]
        if pending is not None:
            out.append({"role": "user", "content": pending})
        return out

    def make_room(self, pending: str, count: Callable[[list[dict]], int], budget: int,
                  limit: int) -> int:
        """Drop the oldest turns until the conversation with ``pending`` counts at most
        ``budget`` tokens (``count`` gives the exact prompt length); return how many turns
        were dropped. If every turn is dropped and it still exceeds ``budget``, it is enough
        to stay below ``limit`` (the context size). A ``pending`` message that cannot fit
        even alone raises :class:`ContextOverflowError` and leaves the conversation as is.
        """
        n = count(self.for_model(pending))
        if n <= budget:
            return 0
        trial = Conversation(self.system, self.messages)
        dropped = 0
        while trial.messages and n > budget:
            trial.drop_oldest_turn()
            dropped += 1
            n = count(trial.for_model(pending))
        if n >= limit:
            raise ContextOverflowError(n, limit)
        self.messages = trial.messages
        return dropped

    # -- files ----------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"format": CONVERSATION_FORMAT, "version": 1, "system": self.system,
                "messages": [dict(m) for m in self.messages]}

    @classmethod
    def from_dict(cls, data: Any) -> "Conversation":
        """A conversation from :meth:`to_dict`'s shape, or from a plain list of messages."""
        if isinstance(data, list):
            data = {"messages": data}
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            raise ValueError("expected an object with a 'messages' list, or a list of messages")
        system = data.get("system")
        if system is not None and not isinstance(system, str):
            raise ValueError("'system' must be a string")
        messages = []
        for i, m in enumerate(data["messages"]):
            if not isinstance(m, dict) or m.get("role") not in ROLES or \
                    not isinstance(m.get("content"), str):
                raise ValueError(f"message {i + 1} needs a role ({', '.join(ROLES)}) and a "
                                 "text content")
            if m["role"] == "system":
                system = system if system is not None else m["content"]
                continue
            msg = {"role": m["role"], "content": m["content"]}
            if m.get("interrupted") is True:
                msg["interrupted"] = True
            messages.append(msg)
        return cls(system, messages)

    def save(self, path: str | os.PathLike) -> None:
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(self.to_dict(), f, ensure_ascii=False, indent=1)
                f.write("\n")
        except OSError as e:
            raise ConversationFileError(f"cannot write {path}: {e.strerror or e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Conversation":
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise ConversationFileError(f"cannot read {path}: {e.strerror or e}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConversationFileError(f"{path}: not a JSON conversation ({e})") from None
        try:
            return cls.from_dict(data)
        except ValueError as e:
            raise ConversationFileError(f"{path}: not a conversation ({e})") from None
