"""Which shared samples a sampled diff reads (``--samples N`` / ``--fraction F``), and how it says so."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hsstore.compare.sampling import BOOTSTRAP, Choice, choose, sample_count
from hsstore.core.errors import BadInput
from hsstore.core.schema.diff_report import Sampling
from hsstore.storage.store import VariantReader


@dataclass(frozen=True)
class SamplePlan:
    keys: list[str]  # chosen, in the shared keys' order
    choice: Choice
    record: Sampling


def check_sampling(samples: int | None, fraction: float | None, confidence: float) -> None:
    if samples is not None and fraction is not None:
        raise BadInput("pass --samples N or --fraction F, not both")
    if samples is not None and samples < 1:
        raise BadInput(f"--samples {samples}: must be 1 or more")
    if fraction is not None and not 0 < fraction <= 1:
        raise BadInput(f"--fraction {fraction}: must be in (0, 1], e.g. 0.01 for 1% of the shared samples")
    if not 0 < confidence < 1:
        raise BadInput(f"--confidence {confidence}: must be in (0, 1), e.g. 0.95")


def plan_samples(a: VariantReader, b: VariantReader, c: VariantReader | None, keys: Sequence[str],
                 samples: int | None, fraction: float | None, seed: int, confidence: float) -> SamplePlan | None:
    """None for a full diff; else the seeded, length-stratified choice among the shared samples (shared
    with the floor too, when there is one: A against B and against C are read on the same samples)."""
    check_sampling(samples, fraction, confidence)
    if samples is None and fraction is None:
        return None
    notes = []
    population = list(keys)
    if c is not None:
        population = [k for k in keys if k in c.refs]
        if len(population) < len(keys):
            notes.append(f"{len(keys) - len(population)} sample(s) shared by A and B are not in the floor and "
                         "were not eligible")
        if not population:
            raise BadInput(f"the floor {c.id} shares no samples with A and B; a sampled diff reads all three on "
                           "the same samples")
    n = sample_count(len(population), samples, fraction)
    choice = choose([a.refs[k].length for k in population], population, n, seed)
    chosen = [population[int(i)] for i in choice.indices]
    if len(chosen) < 10:
        notes.append(f"only {len(chosen)} samples: the intervals are wide and approximate (t with "
                     f"{len(chosen) - len(choice.population)} degree(s) of freedom)")
    notes += ["max_abs and cos_min are over the sampled tokens: they bound the store's from below "
              "(max_abs) and above (cos_min); they have no interval",
              "worst_samples lists the worst of the sampled samples"]
    record = Sampling(
        method=f"length-stratified random choice without replacement ({len(choice.population)} strata of equal "
               "count by sample length, proportional allocation, at least 2 per stratum), stratum-weighted "
               "ratio estimators",
        seed=seed, population=len(population), samples=len(chosen), fraction=len(chosen) / len(population),
        strata=len(choice.population), confidence=confidence,
        interval=f"Rao-Wu rescaling bootstrap over samples within strata, {BOOTSTRAP} replicates, percentile",
        notes=notes)
    return SamplePlan(chosen, choice, record)
