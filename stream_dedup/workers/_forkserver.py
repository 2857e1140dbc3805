"""Imported by the analysis pool's forkserver at its start (forkserver preload), and by
nothing else: it makes that process, and every worker it forks, ignore the stop signals
(see pool.py) and keep their heaps (heap.py). Importing the package loads the pipeline
too, so a worker is forked with it loaded instead of importing it again (its tokenizer
tables come from the parent: see AnalysisPool)."""

from stream_dedup.workers.heap import keep_heap
from stream_dedup.workers.pool import ignore_stop_signals

ignore_stop_signals()
keep_heap()
