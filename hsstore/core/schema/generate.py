"""``[generate]``: the manifest's table of regeneration (the target rewrites the replies before capture), its
keys, types, defaults and value rules (hsstore.capture.generate runs it)."""

from __future__ import annotations

from hsstore.core.errors import BadInput
from hsstore.core.schema.record import Record

# template kwargs: scalars, or lists of them
TemplateValue = int | float | str | bool | list[int | float | str | bool]
ENGINES = ("model", "openai")
TURNS = ("last", "all")
REASONING = ("keep", "drop")


class GenerateTable(Record):
    """``[generate]``: the target regenerates the replies before their states are captured
    (hsstore.capture.generate). ``engine = "model"``: the target itself, in this process, through transformers
    ``generate``; ``"openai"``: an OpenAI-compatible server at ``url`` serving the same model. ``turns``: the
    last assistant turn (rows without one are prompts) or every assistant turn in order. ``temperature`` 0
    is greedy. ``reasoning = "drop"``: a reply's leading <think>...</think> stays in the sequence but out of
    the loss mask. ``drop_cut``: drop replies cut at ``max_new_tokens`` (kept, and counted, by default)."""

    engine: str = "model"
    url: str | None = None
    turns: str = "last"
    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    n: int = 1
    stop: list[str] = []
    chat_template_kwargs: dict[str, TemplateValue] = {}
    reasoning: str = "keep"
    drop_cut: bool = False
    concurrency: int = 8  # openai: requests in flight
    timeout_s: float = 300.0  # openai: per request
    retries: int = 3  # openai: attempts after the first, per request


def check_generate(g: GenerateTable) -> None:
    """The value rules of ``[generate]`` (one line naming the key and what it takes)."""
    if g.engine not in ENGINES:
        raise BadInput(f"[generate] engine = {g.engine!r}; choose one of {', '.join(ENGINES)}")
    if g.engine == "openai" and not (g.url or "").startswith(("http://", "https://")):
        raise BadInput("[generate] engine = \"openai\" needs url, the server's base URL, e.g. "
                       "url = \"http://127.0.0.1:8000/v1\"")
    if g.engine == "model" and g.url is not None:
        raise BadInput("[generate] url is for engine = \"openai\"; the in-process engine (\"model\") takes none")
    if g.turns not in TURNS:
        raise BadInput(f"[generate] turns = {g.turns!r}; choose last or all")
    if g.reasoning not in REASONING:
        raise BadInput(f"[generate] reasoning = {g.reasoning!r}; choose keep or drop")
    for key, value, low in (("max_new_tokens", g.max_new_tokens, 1), ("n", g.n, 1), ("concurrency", g.concurrency, 1),
                            ("top_k", g.top_k, 0), ("retries", g.retries, 0), ("seed", g.seed, 0)):
        if value < low:
            raise BadInput(f"[generate] {key} = {value}; it must be at least {low}")
    if not 0 <= g.temperature <= 10 or not 0 < g.top_p <= 1 or not g.timeout_s > 0:
        raise BadInput(f"[generate] temperature ({g.temperature}) must be in [0, 10], top_p ({g.top_p}) in (0, 1] "
                       f"and timeout_s ({g.timeout_s}) above 0")
    if g.n > 1 and g.temperature == 0:
        raise BadInput(f"[generate] n = {g.n} with temperature = 0 (greedy) gives {g.n} identical replies; set a "
                       "temperature above 0, or n = 1")
    if any(not isinstance(x, str) or not x for x in g.stop):
        raise BadInput("[generate] stop must be a list of non-empty strings")
