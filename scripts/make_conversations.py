"""Writes hsstore/data/conversations.jsonl: the bundled, hand-written conversations of the embedded default.

Deterministic: the same file every run. Mixes ShareGPT and OpenAI message formats, coding prompts,
multi-turn chats with system prompts, and non-ASCII text.
"""

from __future__ import annotations

import json
from pathlib import Path

SYSTEMS = [
    "You are a concise, careful programming assistant.",
    "You are a friendly tutor. Explain step by step.",
    "Réponds en français, brièvement.",
    "あなたは丁寧なアシスタントです。",
    "You answer with short, correct code and one sentence of explanation.",
]

CODING = [
    (
        "Write fizzbuzz in Python.",
        "for i in range(1, 101):\n    out = ('Fizz' if i % 3 == 0 else '') + ('Buzz' if i % 5 == 0 else '')\n    print(out or i)",
    ),
    (
        "Write fizzbuzz in Rust.",
        'fn main() {\n    for i in 1..=100 {\n        match (i % 3, i % 5) {\n            (0, 0) => println!("FizzBuzz"),\n            (0, _) => println!("Fizz"),\n            (_, 0) => println!("Buzz"),\n            _ => println!("{}", i),\n        }\n    }\n}',
    ),
    ("Reverse a string in JavaScript.", "const reverse = s => [...s].reverse().join('');"),
    (
        "How do I read a file line by line in Go?",
        "f, err := os.Open(path)\nif err != nil { return err }\ndefer f.Close()\nsc := bufio.NewScanner(f)\nfor sc.Scan() { fmt.Println(sc.Text()) }",
    ),
    (
        "Write a binary search in C.",
        "int bsearch_int(const int *a, int n, int x) {\n  int lo = 0, hi = n - 1;\n  while (lo <= hi) {\n    int mid = lo + (hi - lo) / 2;\n    if (a[mid] == x) return mid;\n    if (a[mid] < x) lo = mid + 1; else hi = mid - 1;\n  }\n  return -1;\n}",
    ),
    (
        "What does `git rebase -i HEAD~3` do?",
        "It opens an editor listing the last three commits so you can reorder, squash, edit or drop them; git then replays them in the new order.",
    ),
    (
        "Explain Python list comprehensions with an example.",
        "A list comprehension builds a list from an iterable in one expression: squares = [x * x for x in range(10) if x % 2 == 0].",
    ),
    (
        "Write a SQL query for the top 5 customers by revenue.",
        "SELECT customer_id, SUM(amount) AS revenue\nFROM orders\nGROUP BY customer_id\nORDER BY revenue DESC\nLIMIT 5;",
    ),
    (
        "Memoized fibonacci in Python?",
        "from functools import lru_cache\n\n@lru_cache(maxsize=None)\ndef fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
    ),
    (
        "How do I check if a number is prime in Haskell?",
        "isPrime :: Int -> Bool\nisPrime n = n > 1 && all (\\d -> n `mod` d /= 0) (takeWhile (\\d -> d * d <= n) [2..])",
    ),
    (
        "Write a bash one-liner that counts lines in all .py files.",
        "find . -name '*.py' -print0 | xargs -0 wc -l | tail -n 1",
    ),
    (
        "What is the difference between a process and a thread?",
        "A process has its own address space; threads share the address space of their process, so they communicate cheaply but need synchronization.",
    ),
    (
        "Implement a stack with a Python list.",
        "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n    def __len__(self):\n        return len(self.items)",
    ),
    (
        "Why is my PyTorch tensor on the wrong device?",
        "Tensors are created on the CPU unless you say otherwise; create them with device=x.device or move them with .to(device) before combining.",
    ),
    (
        "Write quicksort in Python.",
        "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    p, *rest = xs\n    return quicksort([x for x in rest if x < p]) + [p] + quicksort([x for x in rest if x >= p])",
    ),
    (
        "Parse JSON in Java with Jackson.",
        "ObjectMapper mapper = new ObjectMapper();\nMyType value = mapper.readValue(jsonString, MyType.class);",
    ),
    (
        "How do I make an HTTP GET request in Python?",
        "import urllib.request\nwith urllib.request.urlopen('http://localhost:8000/') as r:\n    body = r.read().decode()",
    ),
    ("Write a regular expression for an ISO date.", r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$"),
    (
        "Explain big-O of binary search.",
        "Each step halves the remaining range, so it needs about log2(n) steps: O(log n).",
    ),
    (
        "Write FizzBuzz in C++ without the modulo operator.",
        '#include <iostream>\nint main() {\n  for (int i = 1, f = 1, b = 1; i <= 100; ++i, ++f, ++b) {\n    bool F = f == 3, B = b == 5;\n    if (F) f = 0;\n    if (B) b = 0;\n    if (F || B) std::cout << (F ? "Fizz" : "") << (B ? "Buzz" : "") << \'\\n\';\n    else std::cout << i << \'\\n\';\n  }\n}',
    ),
]

MULTI = [
    [
        (
            "What is a hidden state in a transformer?",
            "It is the vector each layer produces for each token: the residual stream that the next layer reads.",
        ),
        (
            "And why would a drafter model want several layers of it?",
            "Shallow layers carry token identity, deep ones carry the prediction; mixing them gives a small drafter more to work with.",
        ),
        (
            "Which layer should be the target?",
            "Usually one near the top, before the final norm, so the drafter learns what the model is about to predict.",
        ),
    ],
    [
        (
            "Plan a three-day trip to Kyoto.",
            "Day 1: Fushimi Inari early, then Gion. Day 2: Arashiyama bamboo grove and Tenryū-ji. Day 3: Kinkaku-ji and Nishiki market.",
        ),
        (
            "Make day 2 rain-friendly.",
            "Swap Arashiyama for the Kyoto National Museum and an afternoon in the covered Teramachi arcade.",
        ),
    ],
    [
        ("Give me a haiku about compilers.", "Tokens fall like rain /\nthe parser gathers each drop /\nbinaries bloom"),
        ("Now one about caches.", "Warm lines close at hand /\nthe far memory is slow /\nkeep what you will need"),
    ],
    [
        (
            "Explique la récursivité.",
            "Une fonction récursive s'appelle elle-même sur un problème plus petit, jusqu'à un cas de base.",
        ),
        ("Un exemple ?", "def fact(n):\n    return 1 if n == 0 else n * fact(n - 1)"),
    ],
    [
        ("日本語で自己紹介してください。", "こんにちは。私はプログラミングを手伝うアシスタントです。"),
        ("好きな言語は？", "Python が好きです。読みやすくて、ライブラリが豊富だからです。"),
    ],
    [
        (
            "Wie spät ist es in Zürich, wenn es in New York 9 Uhr ist?",
            "In Zürich ist es dann 15 Uhr (sechs Stunden später).",
        ),
        ("Und in Tokio?", "In Tokio ist es 23 Uhr."),
    ],
    [
        ("Привет! Как сказать 'thank you' по-испански?", "«Gracias». А «большое спасибо» — «muchas gracias»."),
        ("А по-итальянски?", "«Grazie», и «grazie mille» — большое спасибо."),
    ],
    [("What's 17 * 23?", "391."), ("And 391 / 17?", "23."), ("Is 391 prime?", "No: 391 = 17 × 23.")],
    [
        (
            "Summarize the CAP theorem.",
            "A distributed store cannot guarantee consistency, availability and partition tolerance all at once.",
        ),
        (
            "So what do real systems do?",
            "They choose what to give up during a partition: CP systems refuse some requests, AP systems serve possibly stale data.",
        ),
    ],
    [
        (
            "Emoji test: 🚀🔥 what do these mean?",
            "🚀 usually means launch or fast progress, 🔥 means something is hot or going very well.",
        ),
        ("And ✅?", "✅ marks something as done or correct."),
    ],
]


def sharegpt(system: str | None, turns: list[tuple[str, str]]) -> dict:
    conv = [{"from": "system", "value": system}] if system else []
    for q, a in turns:
        conv += [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
    return {"conversations": conv}


def openai(system: str | None, turns: list[tuple[str, str]]) -> dict:
    msgs = [{"role": "system", "content": system}] if system else []
    for q, a in turns:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return {"messages": msgs}


def rows() -> list[dict]:
    out = []
    for i, (q, a) in enumerate(CODING):  # 20 single-turn coding, both formats, with and without system
        out.append(sharegpt(None, [(q, a)]))
        out.append(openai(SYSTEMS[i % len(SYSTEMS)], [(q, a)]))
        out.append(openai(None, [(q + " Keep it short.", a)]))
    for i, turns in enumerate(MULTI):  # multi-turn with system prompts
        for j, system in enumerate(SYSTEMS):
            fmt = sharegpt if (i + j) % 2 else openai
            out.append(fmt(system, turns))
    for i in range(0, len(CODING) - 1, 2):  # two coding questions in one chat
        out.append(sharegpt(SYSTEMS[0], [CODING[i], CODING[i + 1]]))
    return out


if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "hsstore" / "data" / "conversations.jsonl"
    data = rows()
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data), encoding="utf-8")
    print(f"wrote {len(data)} rows to {path}")
