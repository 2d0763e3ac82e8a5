"""Scripts that measure the project, never timed tests (benchmarks/README.md: each script, its flags and results).

In parts: speed/ (throughput and what the framework costs), quality/ (sample quality against real data), gpu/ (what
only a GPU shows, in one device call). Shared by all of them, here: provenance.py (the line naming a results file's
date, commit and machine) and arguments.py (the scripts' own flags). results/ holds what the scripts wrote.
Imported by package path (`from benchmarks.quality.metrics_lib import ...`): a script run as a file puts the
repository root on sys.path first. tests/test_layers.py holds the parts to their order: the shared modules import no
part, speed and quality not each other, gpu may use both and nothing uses gpu.
"""
