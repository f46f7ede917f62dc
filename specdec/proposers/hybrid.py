"""The hybrid step: per step, the longest prompt-lookup or suffix match where one is long enough to pay, the draft
model elsewhere -- whichever the step controller expects to commit more tokens per unit of time (policy/decide.py:
StepController, the machinery `auto` runs a request with once it chose the draft). Its proposer is the engine's
step-choice proposer (proposers/step_choice.py), which drafts through the draft model's, prompt lookup's and suffix
decoding's proposers as the controller picks; the declaration builds none of its own."""
from __future__ import annotations

from .method import Method

METHOD = Method("hybrid", 4, "model", prior_alpha=0.8, needs="draft_model", build=lambda ctx: None,
                combines=("draft", "ngram", "suffix"), auto_candidate=False,
                summary="per step, the longest prompt-lookup or suffix match where it is expected to pay more "
                        "than the draft model, the draft model's k tokens elsewhere")
