"""Round 3's F7: ``model.close()`` from a signal handler that interrupted the main thread's
own ``execute`` used to hang for good (close waited for the very call it interrupted). It
now returns at once; the interrupted call finishes, then the executor and the model close.
Run in a subprocess with a timeout: a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import signal, sys, threading, time
    import numpy as np
    import gear_runtime as gr
    from gear_runtime.examples import causal_lm
    from gear_runtime.tools import generate
    prefill, gear, decode = generate.build_pair(sys.argv[1], causal_lm.SMALL)
    model = gr.load(str(decode))
    ex = model.create_executor(state=causal_lm.STATE)
    fired = []

    class Slow:
        # an input whose conversion gives the signal a moment inside execute
        def __array__(self, dtype=None, copy=None):
            time.sleep(0.3)
            return np.array([[1]], dtype=np.int64)

    def handler(signum, frame):
        model.close()  # inside ex.execute on this very thread
        fired.append(ex.closed)

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    out = ex.execute({"input_ids": Slow(), "position": np.array([0])})
    assert fired == [True], fired
    assert out[0].shape == (1, 1, causal_lm.SMALL.vocab)
    assert ex.closed and not ex.close_deferred and model.closed
    try:
        ex.execute({"input_ids": np.array([[1]]), "position": np.array([0])})
    except gr.ClosedError:
        print("ok")
""")


def test_close_from_a_signal_handler_inside_execute_does_not_hang(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")
