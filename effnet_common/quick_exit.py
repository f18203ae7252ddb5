"""Ending a program that imported TensorFlow without its slow last garbage collection.

As it exits, the interpreter runs the cycle collector over every object still alive. A process that imported
TensorFlow (TFX and Beam the more so) holds millions of them, and that last pass is most of its exit: 2.8 s of
a bare ``import tensorflow`` process's exit on this project's 2-core machine, 0.4 s without it (measured
2026-11-28). Every trainer, trial, pipeline step and runner pays it, and the test suite starts hundreds.

``exit_with(status)`` moves what is alive into the collector's permanent generation (``gc.freeze``) and exits as
``sys.exit`` does: ``atexit`` handlers run (TensorFlow's removal of its generated autograph sources among them),
files are flushed and closed, and whatever reference counting frees is finalized. Only garbage cycles among
the frozen objects are left uncollected: at exit, their memory goes back to the system with the process.
Writers in this project close or flush their files themselves, never in a finalizer left to the collector.
"""

from __future__ import annotations

import gc
import sys


def exit_with(status: int | None) -> None:
    """``sys.exit(status)`` after freezing what is alive (see the module's docstring)."""
    gc.freeze()
    sys.exit(status)
