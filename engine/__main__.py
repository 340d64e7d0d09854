"""`python -m engine COMMAND ...`: see engine/cli.py."""

import os
import sys

from engine.cli import main

rc = main()
# A daemon worker (an HTTP fetch that cannot be cancelled) may still be inside torch's C++ code.
# Letting the interpreter finalize would end that thread with pthread_exit, whose forced unwind
# through a noexcept C++ frame aborts the process ("terminate called without an active
# exception", exit 134) after the error was already printed: leave at once instead.
# (Only our own fetch workers count: multiprocessing's queue feeders are daemon threads too, and
# skipping the interpreter's cleanup for them would leak their semaphores.)
client = sys.modules.get("engine.capture.vllm_client")
if client is not None and client.DaemonPool.any_alive():
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
raise SystemExit(rc)
