"""`python -m engine COMMAND ...`: see engine/cli.py."""

import os
import sys
import threading

from engine.cli import main

rc = main()
# A daemon worker (an HTTP fetch that cannot be cancelled) may still be inside torch's C++ code.
# Letting the interpreter finalize would end that thread with pthread_exit, whose forced unwind
# through a noexcept C++ frame aborts the process ("terminate called without an active
# exception", exit 134) after the error was already printed: leave at once instead.
if any(t.daemon and t.is_alive() for t in threading.enumerate()):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
raise SystemExit(rc)
