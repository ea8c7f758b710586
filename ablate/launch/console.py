"""What a run shows where it runs: a progress bar (tqdm) on a terminal, plain lines anywhere else. The run's
log.txt always gets plain lines (the worker writes them); only the terminal view differs.

May import: store.
"""

from __future__ import annotations

import sys
from typing import TextIO

from ablate.store.sweep import describe_progress


class Console:
    """Log lines and progress reports of one run, for stdout. On a terminal the progress reports drive one
    bar per stage (pretraining, then each fine-tuning task and seed) and log lines print above it; elsewhere
    (a submitit or Slurm log file) log lines print as they are and the reports add nothing."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.bar = None
        self.key = None

    def line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def progress(self, report: dict) -> None:
        if not self.tty:
            return
        from tqdm import tqdm

        key = (report.get("stage", "pretrain"), report.get("task"), report.get("seed"))
        if key != self.key:
            self.close()
            self.key = key
            label = f"fine-tuning {report['task']} seed {report['seed']}" if "task" in report else "pretraining"
            self.bar = tqdm(
                total=report.get("total_steps") or None,
                desc=label,
                file=self.stream,
                unit="step",
                dynamic_ncols=True,
                leave=True,
            )
        self.bar.n = report.get("step", 0)
        self.bar.set_postfix_str(describe_progress(report), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar, self.key = None, None
