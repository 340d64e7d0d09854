"""Where the tests find the repository and their recorded fixtures, in one place (test files
live one or two folders down, in tests/project/ and in tests/console/ and tests/engine/ and their
folders per subpackage)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
