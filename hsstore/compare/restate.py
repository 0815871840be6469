"""What an imported cache's ``--layers``/``--capture`` statement should have been, from the audit's findings
— pure, no I/O.

An import labels each file slot by what the user stated. When the audit finds a slot holding another
capture point than its label (the output of layer i-1 where i is stated: vLLM's input numbering stated as
outputs; the pre-norm last layer stated as ``final_norm``), and every checked sample agrees on what each slot
holds, the states are fine and the statement is wrong: the right one is written in the tool's own numbering
(speculators/vLLM: ``input``; the others: ``output``), so it can be pasted into ``hsstore import`` again.
Under ``--capture unknown`` the same resolution says which numbering the ids were in.
"""

from __future__ import annotations

from collections.abc import Sequence

from hsstore.compare.defects import CLEAN
from hsstore.core.layer_numbering import TOOL_CAPTURE, from_hsstore, to_hsstore
from hsstore.core.schema.diff_report import Finding, Restatement, SampleVerdict
from hsstore.core.schema.imported import ImportSource


def held_points(verdicts: Sequence[SampleVerdict], findings: Sequence[Finding],
                labels: Sequence[int]) -> dict[int, set[int]]:
    """Stored label -> the capture points it held across the checked samples (as labelled where clean; the
    match where a capture point, also beside NaN/zero rows; samples where it shows another defect say nothing)."""
    match = {(f.key, f.layer): f.match for f in findings if f.kind == "capture_point"}
    held: dict[int, set[int]] = {i: set() for i in labels}
    for v in verdicts:
        for i in labels:
            kind = v.layers.get(str(i))
            if kind in CLEAN:
                held[i].add(i)
            elif "capture_point" in str(kind).split("+") and isinstance(match.get((v.key, i)), int):
                held[i].add(int(match[(v.key, i)]))
    return held


def restatement(verdicts: Sequence[SampleVerdict], findings: Sequence[Finding], source: ImportSource,
                n_layers: int) -> Restatement | None:
    """The statement that labels every slot with what it holds, or None when the stated one is right (and
    known), or the samples do not agree on one (then the findings say what is wrong, slot by slot)."""
    labels = [to_hsstore(s, source.capture, n_layers) for s in source.layers]  # hsstore labels, file slot order
    held = held_points(verdicts, findings, labels)
    if any(len(held[i]) != 1 for i in labels):
        return None
    slots = [next(iter(held[i])) for i in labels]
    if len(set(slots)) != len(slots) or (slots == labels and source.capture != "unknown") or min(slots) < 0:
        return None  # two slots hold one point (no statement fixes that), the statement is right, or a slot
        # holds the embeddings (no hsstore layer id names them)
    numbering = TOOL_CAPTURE.get(source.format, "output")
    ids = ",".join(str(from_hsstore(p, numbering, n_layers)) for p in slots)
    other = "output" if numbering == "input" else "input"
    other_ids = ",".join(str(from_hsstore(p, other, n_layers)) for p in slots)
    stated = ",".join(map(str, source.layers))
    flags = f"--layers {ids} --capture {numbering}"
    what = "leaves the numbering unknown" if source.capture == "unknown" else "is wrong"
    words = (f"the file slots hold hsstore layers {slots} (output of decoder layer i; {n_layers} = after the final "
             f"norm): --layers {stated} --capture {source.capture} {what}; import again with {flags} (= --layers "
             f"{other_ids} --capture {other})")
    return Restatement(slots=slots, stated=f"--layers {stated} --capture {source.capture}", flags=flags,
                       words=words)
