"""The last stable offset, against a reference model (eos_models)."""

from __future__ import annotations

from eos_models import LsoModel
from hypothesis import settings

LsoModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLsoNeverExceedsAnOpenTransactionsFirstOffsetAndNeverGoesBack = LsoModel.TestCase
