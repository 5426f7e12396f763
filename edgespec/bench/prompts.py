"""Built-in prompt sets for ``edgespec bench`` (original texts, written for this project), and
the schema the ``extract`` set's answers are constrained to."""

from __future__ import annotations

_LIGHTHOUSE = """The lighthouse on Gull Point was built in 1871 after three ships were lost on the \
reef in a single winter. Its first keeper, Thomas Hale, lived in the tower with his wife and two \
daughters, and kept a logbook that survives today. The logbook records the weather every four \
hours, the ships that passed, and the oil burned in the lamp each night. In the winter of 1888 \
the keeper recorded a storm that lasted eleven days; the lamp was kept burning the whole time, \
and no ship was lost on the reef. In 1923 the oil lamp was replaced by an electric light, and in \
1961 the light was automated and the last keeper left the point. The keeper's house was turned \
into a small museum in 1990. Visitors can climb the one hundred and twelve steps of the tower, \
read copies of the logbook, and see the original lens, which was made in Paris and weighs almost \
two tons. The museum is open from May to October, and the tower is closed on windy days."""

_COOPERATIVE = """The Riverside Food Cooperative started in 2009 when twelve families decided to \
buy vegetables together directly from farms in the valley. At first the orders were collected \
on paper and the boxes were packed in a garage every Saturday morning. By 2014 the cooperative \
had three hundred members, a small shop on Mill Street, and two part-time employees. Members pay \
a yearly fee of forty dollars and work three hours a month in the shop; in return they pay \
lower prices and vote on which farms the cooperative buys from. The cooperative buys from \
nineteen farms, all within eighty kilometres of the town. In 2021 the members voted to open a \
second shop near the train station and to add bread, cheese and eggs from local producers. The \
cooperative publishes its accounts every year, and any surplus is either returned to members as \
a discount or spent on the community garden behind the shop."""

_BATTERY = """A lithium-ion battery stores energy by moving lithium ions between two electrodes. \
When the battery charges, ions move from the positive electrode through the electrolyte to the \
negative electrode, where they are stored between layers of graphite. When the battery \
discharges, the ions move back, and electrons flow through the external circuit to power the \
device. The capacity of a battery falls slowly over time, because every charge cycle causes \
small changes in the electrodes. Heat speeds up this ageing, which is why phones and laptops \
should not be left in hot cars. Charging a battery to one hundred percent and leaving it there \
also speeds up ageing, so many devices stop charging at eighty percent when they are plugged in \
for a long time. Batteries that are damaged or overheated can fail, so they should be recycled \
at a collection point rather than thrown away with household waste."""

_PEOPLE = [
    "Maria Lopez, 34, works as a nurse at the city hospital in Valencia. She moved there from "
    "Seville in 2015 and speaks Spanish, English and a little French.",
    "The new head of the chess club is Daniel Okafor, a 27-year-old software engineer from "
    "Lagos who has lived in Toronto since 2019.",
    "Our guest this week is Hannah Berg, aged 61, a retired pilot living in Tromsø. She flew "
    "cargo routes across Norway for thirty years.",
    "Kenji Sato (45) teaches mathematics at a secondary school in Osaka and coaches the "
    "school's baseball team on weekends.",
]

# The JSON-extraction set's output schema: what `edgespec bench --prompts extract` constrains to.
EXTRACT_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "city": {"type": "string"}, "occupation": {"type": "string"}},
    "required": ["name", "age", "city", "occupation"], "additionalProperties": False,
}

PROMPT_SETS: dict[str, list[str]] = {
    "default": [
        "The history of the Roman Empire",
        "def quicksort(arr):",
        "Once upon a time, in a small village by the sea,",
        "The three laws of thermodynamics are",
        "A recipe for a simple tomato soup:",
        "In computer science, a hash table is",
    ],
    "chat": [
        "Explain how a rainbow forms, in a short paragraph.",
        "Give me three tips for learning a new language.",
        "What is the difference between a list and a tuple in Python?",
        "Describe a calm morning at the beach.",
    ],
    "code": [
        "Write a Python function that checks whether a string is a palindrome.",
        "Write a Python class for a stack with push, pop and peek methods.",
        "Write a JavaScript function that returns the largest number in an array.",
        "Write a SQL query that counts the orders per customer in a table called orders.",
    ],
    "extract": [
        "Extract the person's name, age, city and occupation from the text as a JSON object "
        f"with the keys name, age, city and occupation.\n\nText: {t}\n\nJSON:"
        for t in _PEOPLE
    ],
    "summarise": [
        f"Summarise this text in a few sentences, keeping the key facts and numbers:\n\n{t}"
        for t in (_LIGHTHOUSE, _COOPERATIVE, _BATTERY)
    ],
}
