"""Direct-elicitation probes (SPEC §12): TOFU-, MUSE-, WMDP- and LUME-style reads of a model
alone, beside the observer's reading of the deployed agent. `scores` holds the pure scoring
functions; the stage that runs the probes on every model of the design is issue 17's next step."""

from kbench.probes.scores import (
    auc,
    forget_quality,
    harmonic_mean,
    mcq_choice,
    min_k_percent,
    normalized_probability,
    privleak,
    rouge_l_f1,
    truth_ratio,
    words,
)

__all__ = [
    "auc",
    "forget_quality",
    "harmonic_mean",
    "mcq_choice",
    "min_k_percent",
    "normalized_probability",
    "privleak",
    "rouge_l_f1",
    "truth_ratio",
    "words",
]
