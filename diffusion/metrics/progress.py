"""Progress bars for long evaluations (feature extraction, metrics that run a model over many images)."""

from tqdm import tqdm


def progress_bar(total: int, description: str, unit: str = "img") -> tqdm:
    """A tqdm bar on stderr that shows itself only on a terminal (``disable=None``): a log file, a pipe or a
    batch job's output gets no carriage-return clutter."""
    return tqdm(total=total, desc=description, unit=unit, disable=None, dynamic_ncols=True)
