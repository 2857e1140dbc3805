"""Imported by the analysis pool's forkserver at its start (forkserver preload), and by
nothing else: it makes that process, and every worker it forks, ignore the stop signals
(see workers.py). Importing the package loads the pipeline too, so a worker is forked with
it loaded instead of importing it again; and the per-code-point tables the tokenizer builds
on first use (~0.4 s) are built here once, so that every worker (a replacement too) is
forked with them instead of spending its first page on them."""

from .core.tokens import char_classes, fold_table
from .workers import ignore_stop_signals

ignore_stop_signals()
char_classes()
fold_table()
