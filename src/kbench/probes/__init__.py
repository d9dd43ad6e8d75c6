"""Direct-elicitation probes (docs/definitions.md, "Direct-elicitation probes"): TOFU-, MUSE-, WMDP- and
LUME-style reads of a model
alone, beside the observer's reading of the deployed agent (docs/probes.md).

- `items`: what every model is asked, from the corpus and the design's queries;
- `run`: one deployed model's raw rows (log-probabilities, greedy continuations);
- `scores`: the pure scoring functions; `summary`: a model's scores and clean verdicts.

The `probes` stage (`kbench.stages.probes`) runs them on every model of the design.
"""

from kbench.probes.items import ProbeBio, ProbeItems, ProbeQuestion, probe_items
from kbench.probes.run import ProbeRunner, run_probes
from kbench.probes.scores import (
    above_chance,
    auc,
    forget_quality,
    harmonic_mean,
    mcq_choice,
    members_higher,
    min_k_percent,
    normalized_probability,
    privleak,
    rouge_l_f1,
    truth_ratio,
    words,
)
from kbench.probes.summary import PROBES, clean_verdicts, scores

__all__ = [
    "PROBES",
    "ProbeBio",
    "ProbeItems",
    "ProbeQuestion",
    "ProbeRunner",
    "above_chance",
    "auc",
    "clean_verdicts",
    "forget_quality",
    "harmonic_mean",
    "mcq_choice",
    "members_higher",
    "min_k_percent",
    "normalized_probability",
    "privleak",
    "probe_items",
    "rouge_l_f1",
    "run_probes",
    "scores",
    "truth_ratio",
    "words",
]
