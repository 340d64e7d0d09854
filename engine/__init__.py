"""eagle3 engine: the PyTorch side that runs on the GPU server (`python -m engine ...`).

This package's top level stays light (no torch, no textual, no asyncssh): the console imports
`engine.events` for the event-stream contract, and `python -m engine doctor` must work on a
host that has no torch yet.
"""

__version__ = "0.1.0"
