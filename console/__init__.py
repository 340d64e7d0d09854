"""eagle3-console: the workstation half (Textual TUI + asyncssh). Never imports torch."""

import warnings

__version__ = "0.1.0"

# asyncssh still names cryptography's DSA types at import time, and cryptography (>= 48) warns
# about each name: ten lines of a library's deprecation notice before every command's output.
# Only that notice, only when asyncssh triggers it: our own code's warnings still show.
try:
    from cryptography.utils import CryptographyDeprecationWarning
except ImportError:  # pragma: no cover - asyncssh needs cryptography; nothing to silence without it
    pass
else:
    warnings.filterwarnings(
        "ignore", category=CryptographyDeprecationWarning, module=r"asyncssh(\.|$)"
    )
