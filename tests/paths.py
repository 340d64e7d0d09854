"""Where the tests find the repository and their recorded fixtures, in one place (test files
live one folder down, in tests/console/, tests/engine/ and tests/project/)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
