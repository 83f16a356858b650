"""Test configuration: under CI (``CI`` set), hypothesis runs derandomized, so every CI
run explores the same examples (deterministic, as the engines' tests are meant to be);
locally it explores new examples each run."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
