"""A minimal desktop chat window over edgespec, with Tkinter from the standard library.

    python examples/tk_chat.py [--pair NAME | --target T.gguf --draft D.gguf] [--temperature T]

How it embeds the Engine:

* A worker thread owns the Engine: it loads the models, then runs one reply at a time from a
  request queue and puts each streamed piece of text on an event queue. Tk may only be touched
  from its own thread, so the window polls that queue with ``after()`` instead of being called
  from the worker.
* Stop (or Escape) calls ``stream.cancel()``, which is thread-safe and never blocks: the reply
  ends within one decoding step and the Engine is ready for the next message.
* Closing the window (or Ctrl+Q) cancels the reply in progress, lets the worker close the
  Engine, and waits for it, so the models are freed before the program exits.

The window title shows the state ("loading", "ready", "answering"), so tools that can only see
the window from outside (the test drives it with xdotool) can follow along too.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import tkinter as tk
from pathlib import Path
from typing import Callable, Optional

try:
    from edgespec import EdgespecError, Engine, SamplingParams
except ImportError:   # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from edgespec import EdgespecError, Engine, SamplingParams

TITLE = "edgespec chat"
POLL_MS = 30


class ChatWindow:
    """The window and its worker thread. ``load`` is called in the worker to make the Engine."""

    def __init__(self, root: tk.Tk, load: Callable[[], Engine], *,
                 sampling: Optional[SamplingParams] = None, max_tokens: int = 512):
        self.root = root
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.history: list[dict] = []
        self.requests: queue.Queue = queue.Queue()
        self.events: queue.Queue = queue.Queue()
        self.stream = None               # the reply in progress (set by the worker)
        self.ready = self.answering = False
        self._build()
        self.worker = threading.Thread(target=self._work, args=(load,), name="edgespec-chat",
                                       daemon=True)
        self.worker.start()
        self._set_state("loading", "loading the models…")
        root.after(POLL_MS, self._poll)

    # -- the window -----------------------------------------------------------------------

    def _build(self) -> None:
        root = self.root
        root.title(TITLE)
        root.geometry("640x480")
        self.transcript = tk.Text(root, wrap="word", state="disabled", height=20)
        self.transcript.tag_configure("you", foreground="#1f5fbf")
        self.transcript.pack(fill="both", expand=True, padx=6, pady=(6, 0))
        bar = tk.Frame(root)
        bar.pack(fill="x", padx=6, pady=6)
        self.entry = tk.Entry(bar)
        self.entry.pack(side="left", fill="x", expand=True)
        self.send_button = tk.Button(bar, text="Send", command=self.send)
        self.send_button.pack(side="left", padx=(6, 0))
        self.stop_button = tk.Button(bar, text="Stop", command=self.stop, state="disabled")
        self.stop_button.pack(side="left", padx=(6, 0))
        self.status = tk.Label(root, anchor="w")
        self.status.pack(fill="x", padx=6, pady=(0, 6))
        self.entry.bind("<Return>", lambda e: self.send())
        root.bind("<Escape>", lambda e: self.stop())
        root.bind("<Control-q>", lambda e: self.close())
        root.protocol("WM_DELETE_WINDOW", self.close)
        self.entry.focus_set()

    def _append(self, text: str, tag: str = "") -> None:
        self.transcript.configure(state="normal")
        self.transcript.insert("end", text, tag)
        self.transcript.configure(state="disabled")
        self.transcript.see("end")

    def _set_state(self, state: str, status: str) -> None:
        self.root.title(f"{TITLE} — {state}")
        self.status.configure(text=status)
        busy = state == "answering"
        self.send_button.configure(state="disabled" if busy or not self.ready else "normal")
        self.stop_button.configure(state="normal" if busy else "disabled")

    def transcript_text(self) -> str:
        return self.transcript.get("1.0", "end-1c")

    # -- actions (Tk thread) --------------------------------------------------------------

    def send(self) -> None:
        text = self.entry.get().strip()
        if not text or not self.ready or self.answering:
            return
        self.entry.delete(0, "end")
        self._append(f"You: {text}\n", "you")
        self._append("Assistant: ")
        self.history.append({"role": "user", "content": text})
        self.answering = True
        self._set_state("answering", "answering…")
        self.requests.put(list(self.history))

    def stop(self) -> None:
        stream = self.stream
        if stream is not None:
            stream.cancel()

    def close(self) -> None:
        self.stop()
        self.requests.put(None)
        self.worker.join(timeout=30)   # the worker closes the Engine
        self.root.destroy()

    def _poll(self) -> None:
        try:
            while True:
                kind, value = self.events.get_nowait()
                if kind == "text":
                    self._append(value)
                elif kind == "done":
                    self._finished(value)
                elif kind == "ready":
                    self.ready = True
                    self._set_state("ready", value)
                elif kind == "error":
                    self.answering = False
                    self._set_state("error", f"error: {value}")
        except queue.Empty:
            pass
        self.root.after(POLL_MS, self._poll)

    def _finished(self, result) -> None:
        self.answering = False
        self.history.append({"role": "assistant", "content": result.text})
        line = f"{result.stats.completion_tokens} tokens · {result.stats.summary()}"
        stopped = result.finish_reason == "cancelled"
        self._append(" [stopped]\n\n" if stopped else "\n\n")
        self._set_state("ready", ("stopped · " if stopped else "") + line)

    # -- the worker thread ----------------------------------------------------------------

    def _work(self, load: Callable[[], Engine]) -> None:
        try:
            engine = load()
        except EdgespecError as e:
            self.events.put(("error", str(e)))
            return
        with engine:
            info = engine.info()
            self.events.put(("ready", f"ready: {Path(info['target']['path']).name}"
                             + (f" drafted by {Path(info['draft']['path']).name}"
                                if info["draft"] else "")))
            while (messages := self.requests.get()) is not None:
                try:
                    self.stream = engine.stream(messages, max_tokens=self.max_tokens,
                                                sampling=self.sampling)
                    for event in self.stream:
                        if event.text:
                            self.events.put(("text", event.text))
                    self.events.put(("done", self.stream.result))
                except EdgespecError as e:
                    self.events.put(("error", str(e)))
                finally:
                    self.stream = None


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="A minimal desktop chat window over edgespec.")
    ap.add_argument("--pair", help="a registry pair (default: smollm2-135m)")
    ap.add_argument("--target", help="target GGUF (instead of --pair)")
    ap.add_argument("--draft", help="draft GGUF")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=512)
    args = ap.parse_args(argv)
    try:
        sampling = SamplingParams(temperature=args.temperature)
    except EdgespecError as e:
        ap.error(str(e))

    def load() -> Engine:
        if args.target:
            return Engine.load(target=args.target, draft=args.draft)
        return Engine.load(pair=args.pair or "smollm2-135m")

    root = tk.Tk()
    ChatWindow(root, load, sampling=sampling, max_tokens=args.max_tokens)
    root.mainloop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
