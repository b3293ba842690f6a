"""The transaction coordinator against a reference model of sessions (eos_models)."""

from __future__ import annotations

from eos_models import CoordinatorModel
from hypothesis import settings

CoordinatorModel.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestEpochsIncreaseFencedEpochsNeverDecideAndEveryDecisionListsItsMarkers = CoordinatorModel.TestCase
