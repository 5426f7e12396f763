"""The ``tasks`` prompt set of ``edgespec bench``: seven kinds of request as people send them
(original texts and code, written for this project; no public benchmark's text).

- ``chat``: a conversation of three earlier exchanges, then a new user turn (chat messages);
- ``translation``: a paragraph from French, German or Spanish into English, or English into
  French;
- ``summarisation``: a news-style article of 600-650 words (``data/summarisation-*.txt``);
- ``qa``: short factual questions;
- ``math``: grade-school word problems, answered with steps;
- ``long_passage``: a question about a long text of ~1,800 tokens (an invented incident
  review, a story, a monitoring report: ``data/long_passage-*.txt``), which fits a 4096-token
  context with room for the answer;
- ``code_edit``: a source file of 60-130 lines (Python, JavaScript, Go, shell:
  ``data/code_edit-N.EXT.txt``, stored as text so that no linter or test reads them as the
  project's code) and an edit to make in it (rename, comment every function, change a
  behaviour, add type hints), laid out as an editing tool sends it (:data:`LAYOUTS`: aider's
  file name above the fenced file, Continue's name in the fence, a shell tool's instruction
  first), asking for the whole updated file back. Its answers copy most of their prompt and
  are timed whole: the task bench gives each one a budget of its own
  (:func:`~.task_bench.edit_budget`).

Every prompt but ``chat``'s is one user message (text); in raw mode (``--raw``, or a model
without a chat template) the texts are continued as-is, a code edit with the answer's code
block opened after it, and a conversation is joined as plain text (:func:`as_raw`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import PurePosixPath
from typing import Union

Messages = list[dict]
Prompt = Union[str, Messages]

TASKS = ("chat", "translation", "summarisation", "qa", "math", "long_passage", "code_edit")


def _conversation(*turns: str) -> Messages:
    """Alternating user and assistant messages, starting and ending with the user."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
            for i, t in enumerate(turns)]


_CHATS = [
    _conversation(
        "I just moved into a flat with a small south-facing balcony, about 2 by 3 metres. "
        "I'd like to grow some of my own food this summer. Where should I start?",
        "A south-facing balcony is a great start: most vegetables want six or more hours of "
        "sun. Begin with a few large containers rather than many small ones, since bigger pots "
        "dry out more slowly. Good first crops are cherry tomatoes, lettuce, radishes, herbs "
        "like basil and parsley, and dwarf beans. Check how much weight your balcony can carry, "
        "because wet soil is heavy, and make sure water can drain without dripping onto the "
        "neighbours below.",
        "How big should the pots be for tomatoes? And what soil do I buy?",
        "For a cherry tomato plant, aim for at least 20 litres per plant; 30 is better if you "
        "have room. Buy a peat-free multipurpose compost or one made for containers, and mix in "
        "a handful of slow-release fertiliser when you plant. Don't use garden soil: in pots it "
        "packs down hard and drains badly. Give each plant a stake or a cage early, before it "
        "gets tall.",
        "OK. I'm away for a week in July though. Will everything die?",
        "Not if you plan for it. Move the pots together into a slightly shadier corner so they "
        "lose less water, water them deeply the evening before you leave, and cover the soil "
        "with a layer of mulch such as straw or bark. A drip system with a timer, or "
        "self-watering pots with a reservoir, can cover a week. The cheapest option is to ask a "
        "neighbour to water twice while you're away; tomatoes in full sun in July can need "
        "water every day.",
        "Which of those would you choose if I only want to spend about 50 euros, and there is "
        "no tap on the balcony?"),
    _conversation(
        "I have a CSV file with sales data, columns date, region, product, amount. How do I "
        "read it in Python and get the total amount per region?",
        "The simplest way is the csv module from the standard library:\n\n```python\n"
        "import csv\nfrom collections import defaultdict\n\ntotals = defaultdict(float)\n"
        "with open(\"sales.csv\", newline=\"\") as f:\n    for row in csv.DictReader(f):\n"
        "        totals[row[\"region\"]] += float(row[\"amount\"])\n\n"
        "for region, total in sorted(totals.items()):\n    print(region, round(total, 2))\n"
        "```\n\nDictReader uses the first line as the column names, so each row is a "
        "dictionary.",
        "I get ValueError: could not convert string to float: '1,250.00'",
        "Some amounts have a thousands separator, and float() does not accept commas. Remove "
        "them before converting:\n\n```python\namount = float(row[\"amount\"].replace(\",\", "
        "\"\"))\n```\n\nIf the file comes from a spreadsheet set to a European locale, the "
        "comma may be the decimal separator instead (1.250,00), and you would swap the two "
        "characters. Check a few rows to see which format it uses.",
        "It's the first format. Now I also want the totals per month, not just per region.",
        "Parse the date and put the year and month in the key:\n\n```python\n"
        "from datetime import date\n\ntotals = defaultdict(float)\n"
        "with open(\"sales.csv\", newline=\"\") as f:\n    for row in csv.DictReader(f):\n"
        "        d = date.fromisoformat(row[\"date\"])\n"
        "        key = (row[\"region\"], d.year, d.month)\n"
        "        totals[key] += float(row[\"amount\"].replace(\",\", \"\"))\n```\n\n"
        "This assumes dates like 2024-03-15. Sorting the keys then lists each region's months "
        "in order.",
        "Can you change it so it writes the result to a new CSV file with the columns region, "
        "month, total, instead of printing it?"),
    _conversation(
        "My partner and I want to travel from Amsterdam to Vienna by train in October. Is that "
        "realistic in one day?",
        "Yes. A day journey takes around eleven to twelve hours, usually with one change in a "
        "German city such as Frankfurt or Cologne, and there is also a night train that leaves "
        "in the evening and arrives the next morning. If you'd like to see something on the "
        "way, you could split the journey with a night in Munich or Würzburg.",
        "The night train sounds fun. What kinds of places can we book on it?",
        "Night trains usually offer three levels. Seats are the cheapest but hard to sleep in. "
        "Couchettes are compartments of four or six bunks with bedding, shared with other "
        "travellers unless you book the whole compartment. Sleepers have one to three proper "
        "beds, a washbasin and sometimes a private shower; breakfast is often included. For "
        "two people, a private couchette or a double sleeper is the most comfortable choice. "
        "Book early, as they sell out on popular dates.",
        "We'd stay in Vienna for four days. What should we not miss?",
        "Four days is a good amount of time. Walk the old town around St. Stephen's Cathedral, "
        "visit Schönbrunn Palace and its gardens, and spend an afternoon in one of the big "
        "museums on the Ringstrasse. Try a traditional coffee house for cake, and if you like "
        "music, standing tickets at the State Opera are cheap if you queue on the day. In "
        "October the wine taverns on the northern edge of the city are lovely on a sunny "
        "afternoon.",
        "Great. Can you turn this into a rough day-by-day plan, including the trains there and "
        "back, and tell me roughly what it might cost for two?"),
    _conversation(
        "The heating in my flat has been broken for two weeks and my landlord isn't answering "
        "my calls. What can I do?",
        "First, put your request in writing. An email or letter creates a dated record, which "
        "matters if you need to take things further. Describe the problem, when it started and "
        "when you reported it before. Keep copies of everything, and take photos of the boiler "
        "if it shows error messages. In many places landlords must repair heating within a "
        "reasonable time, so it's worth checking your local rules or asking a tenants' advice "
        "service.",
        "Can you help me write the email? I want it to be firm but polite.",
        "Of course. Here is a draft:\n\nSubject: Heating not working since 3 November\n\n"
        "Dear Mr Novak,\n\nI am writing about the heating at Flat 4, 12 Elm Road, which has not "
        "worked since 3 November. I reported it by phone on 4 and 8 November but have not had "
        "a reply.\n\nThe flat is now very cold at night, and I would be grateful if you could "
        "arrange a repair within the next five working days. Please let me know when an "
        "engineer can visit.\n\nKind regards,\nSara Lind\n\nChange the dates and names to match "
        "your situation.",
        "Thanks. Should I mention that I might withhold rent?",
        "I would leave that out for now. Withholding rent can put you in breach of your "
        "tenancy in many places, even when the landlord is at fault. A better next step, if "
        "there is still no answer, is a second letter that lists the dates of your earlier "
        "requests and says you will contact the local housing authority. Check the rules where "
        "you live before any step that involves money.",
        "He finally replied and says an engineer can only come in three weeks. Write a short "
        "reply asking him for a portable heater in the meantime."),
]

_TRANSLATIONS = [
    "Can you translate this into English?\n\nLa bibliothèque municipale rouvrira ses portes le "
    "lundi 4 mars après six mois de travaux. Les salles de lecture ont été agrandies, et un "
    "nouvel espace consacré aux enfants occupe désormais tout le rez-de-chaussée. Les horaires "
    "changent également : la bibliothèque sera ouverte du mardi au samedi, de 9 heures à 19 "
    "heures, ainsi que le dimanche matin. L'inscription reste gratuite pour les habitants de "
    "la commune, mais les lecteurs doivent renouveler leur carte avant la fin du mois. Pour "
    "fêter la réouverture, des auteurs de la région viendront lire des extraits de leurs "
    "livres pendant tout le week-end.",
    "Translate to English please:\n\nLiebe Nachbarinnen und Nachbarn, am Samstag, den 12. "
    "Oktober, findet wieder unser Hoffest statt. Wir beginnen um 14 Uhr mit Kaffee und Kuchen "
    "im Innenhof, und ab 18 Uhr wird gegrillt. Wer möchte, kann gerne einen Salat oder ein "
    "Dessert mitbringen. Für die Kinder gibt es eine kleine Schnitzeljagd. Bitte stellt an "
    "diesem Tag keine Fahrräder in den Hof, damit genug Platz für die Tische bleibt. Falls es "
    "regnet, verschieben wir das Fest auf den folgenden Samstag. Wir freuen uns auf euch! "
    "Eure Hausgemeinschaft aus der Lindenstraße 8",
    "My friend sent me this, what does it say in English?\n\nHola Marta: Te escribo para "
    "contarte que por fin hemos encontrado piso en Granada. Está en el barrio del Realejo, "
    "cerca de la plaza, y tiene dos habitaciones y una terraza pequeña desde la que se ve la "
    "Alhambra. La mudanza será a finales de mes, así que todavía estamos rodeados de cajas. "
    "Cuando estemos instalados, nos encantaría que vinieras a vernos un fin de semana. "
    "Podríamos subir al Albaicín al atardecer y cenar en algún sitio de tapas. Dale un abrazo "
    "a tu hermano de mi parte. Un beso, Lucía",
    "Translate the following into French:\n\nThank you for buying the Aria kettle. Before "
    "using it for the first time, fill it to the maximum line, boil the water and pour it "
    "away; repeat this twice. Never fill the kettle above the maximum line, and always place "
    "it on its base on a flat, dry surface. To remove limescale, boil a mixture of half water "
    "and half white vinegar, leave it for an hour, then rinse the kettle well. The kettle "
    "switches off by itself when the water boils, or if it is switched on while empty.",
]

_SUMMARY_ASKS = [
    "Summarise this article in three or four sentences:\n\n{}",
    "Can you give me a short summary of this news story? Keep the key numbers.\n\n{}",
    "{}\n\nTL;DR of the article above, in a few bullet points please.",
]

_QUESTIONS = [
    "What is the capital of Canada?",
    "Why is the sky blue?",
    "How many bones are there in an adult human body?",
    "Who wrote the novel Pride and Prejudice, and when was it published?",
]

_MATH = [
    "A bakery sells muffins for $2.50 each or in boxes of 6 for $13. Jenna needs 20 muffins. "
    "What is the cheapest way for her to buy them, and how much does it cost? Show your "
    "steps.",
    "A train leaves at 9:40 and the journey is scheduled to take 2 hours 35 minutes. It "
    "arrives 15 minutes late. What time does it arrive? Explain step by step.",
    "Sam has three times as many marbles as Leo. Together they have 48 marbles. How many "
    "marbles does each of them have? Show your working.",
    "A rectangular garden is 12 m long and 7 m wide. Fence posts are put every 2 m along its "
    "edge, with one at each corner. How many posts are needed? Explain your answer.",
]

_PASSAGE_ASKS = [
    "{}\n\nBased on the review above, why did the failover manager not promote a replica when "
    "the primary stopped accepting writes, and what will be changed so that it does next "
    "time?",
    "Read this story and answer the question below.\n\n{}\n\nWhat three faults did Ilse find "
    "in the clock, and how was each of them dealt with?",
    "I need to brief our board on this report:\n\n{}\n\nWhich three problems does the report "
    "say need action in the coming year, and what does it propose for each?",
]


# The kinds of code edit people ask for; each code_edit prompt is one of them.
EDIT_KINDS = ("rename", "docstrings", "behaviour", "type_hints", "extract_helper")

# A fenced block's language, by the file's extension.
LANGUAGES = {".py": "python", ".js": "javascript", ".ts": "typescript", ".go": "go",
             ".sh": "bash", ".sql": "sql", ".rs": "rust", ".java": "java", ".c": "c"}

# How editing tools lay out one file and an instruction in a user message: aider (the file's
# path on the line above its fenced block), Continue (the path in the fence's info string),
# a shell tool piping a file to a model (the instruction first).
LAYOUTS = {
    "aider": "{path}\n```{lang}\n{code}\n```\n\n{ask}\n\n{reply}",
    "continue": "```{lang} {path}\n{code}\n```\n\n{ask} {reply}",
    "shell": "{ask}\n\n{path}:\n```{lang}\n{code}\n```\n\n{reply}",
}


@dataclass(frozen=True)
class CodeEdit:
    """One ``code_edit`` prompt: the packaged source ``data/{source}.txt``, shown as ``path``,
    with an instruction (``ask``) of one of :data:`EDIT_KINDS`, laid out as :data:`LAYOUTS`'
    ``layout``, ending with ``reply``: the whole file back."""

    source: str
    path: str
    kind: str
    ask: str
    layout: str = "aider"
    reply: str = "Reply with the whole updated file in one code block, nothing else."

    def __post_init__(self):
        if self.kind not in EDIT_KINDS or self.layout not in LAYOUTS:
            raise ValueError(f"{self.source}: kind {self.kind!r} must be one of {EDIT_KINDS}, "
                             f"layout {self.layout!r} one of {tuple(LAYOUTS)}")

    @property
    def language(self) -> str:
        suffix = PurePosixPath(self.path).suffix
        return LANGUAGES.get(suffix, suffix.lstrip("."))

    def code(self) -> str:
        return document(self.source)

    def prompt(self) -> str:
        return LAYOUTS[self.layout].format(path=self.path, lang=self.language, code=self.code(),
                                           ask=self.ask, reply=self.reply)


CODE_EDITS = [
    CodeEdit("code_edit-1.py", "app/cache.py", "type_hints",
             "Add type hints to every function and method in this file, in modern syntax "
             "(built-in generics, `X | None`, `from __future__ import annotations` at the "
             "top). Don't change any behaviour."),
    CodeEdit("code_edit-2.js", "src/notes.js", "behaviour",
             "Add a `maxBodyBytes` option to `createHandler`, defaulting to 64 KiB, and pass it "
             "to `readJson`. When a request body is larger than that, stop reading and answer "
             "413 with `{ error: 'request body too large (limit N bytes)' }`, N being the "
             "limit.", layout="continue",
             reply="Give me the whole updated file in one code block and nothing else."),
    CodeEdit("code_edit-3.go", "cmd/logstat/main.go", "rename",
             "Rename the type `tally` to `levelCounts` and `newTally` to `newLevelCounts` "
             "everywhere in this file.", layout="shell",
             reply="Output the complete updated file in a single code block, with no "
                   "explanation."),
    CodeEdit("code_edit-4.sh", "scripts/backup.sh", "docstrings",
             "Add a short comment above every function saying what it does and which "
             "arguments it takes. Leave the code itself as it is."),
]


def document(name: str) -> str:
    """A packaged text (``edgespec/bench/data/NAME.txt``)."""
    return (resources.files(__package__) / "data" / f"{name}.txt").read_text("utf-8").strip()


def task_prompts() -> dict[str, list[Prompt]]:
    """Every task's prompts, in :data:`TASKS`' order: ``chat``'s are message lists (user and
    assistant alternating, a user's last), the others' are text (one user message)."""
    return {
        "chat": [list(c) for c in _CHATS],
        "translation": list(_TRANSLATIONS),
        "summarisation": [ask.format(document(f"summarisation-{i + 1}"))
                          for i, ask in enumerate(_SUMMARY_ASKS)],
        "qa": list(_QUESTIONS),
        "math": list(_MATH),
        "long_passage": [ask.format(document(f"long_passage-{i + 1}"))
                         for i, ask in enumerate(_PASSAGE_ASKS)],
        "code_edit": [edit.prompt() for edit in CODE_EDITS],
    }


_FENCE = re.compile(r"^```[^\n`]*$", re.M)


def as_raw(prompt: Prompt, task: str = "") -> str:
    """A prompt as plain text to continue: text as-is; a ``code_edit`` prompt followed by the
    answer's code block opened as the file's was (its first fence line), so that the
    continuation is the updated file; a conversation as its turns, each under its speaker's
    name, ending where the assistant's answer starts."""
    if isinstance(prompt, str):
        fence = _FENCE.search(prompt) if task == "code_edit" else None
        return f"{prompt}\n\n{fence.group(0)}\n" if fence else prompt
    names = {"user": "User", "assistant": "Assistant", "system": "System"}
    turns = [f"{names.get(m['role'], m['role'])}: {m['content']}" for m in prompt]
    return "\n\n".join(turns + ["Assistant:"])
