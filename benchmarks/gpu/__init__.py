"""GPU: what only a GPU shows, in one device call of at most 8 minutes (gpu_suite.sh): NCCL training, resuming and
the sample CLI (gpu_checks.py), speed's and quality's scripts on the GPU, and the report of the call (gpu_report.py)."""
