"""`stream-dedup report`: a run's decisions (and, given them, the crawled pages) as one
self-contained HTML page a person reads in a browser. Pure: `model.py` counts and samples
the decisions, `texts.py` extracts and compares two pages' visible texts, `charts.py` draws
SVG, `page.py` writes the HTML (`style.py`: its style and script). Reading the files is the
command line's (cli/report.py)."""
