"""The arguments every `SplitDataModule` (diffusion.data.split) takes, checked when it is built: its counts (batch
size, loading processes, the split's seed, `val_from_train`) as whole numbers, the held-out share as a number, and
the streaming cache's options, each refused in one line naming the argument. A fraction or text got past `<` and
failed at `setup` in torch's or numpy's words (`manual_seed expected a long`, `'<=' not supported ...`).
"""

import re
from pathlib import Path
from typing import Any, NamedTuple

from diffusion.errors import InvalidValue, OutOfRange, WrongType, check_real, check_whole_number, options_of

CACHE_SIZE = re.compile(r"\d+(\.\d+)?\s*[KMGT]?B", re.IGNORECASE)  # litdata's sizes: 500MB, 50GB, 1.5TB

# The share of the data held out for validation unless set (the data modules' default): said as the default where a
# check names it, since no flag or config file need have set it.
DEFAULT_VAL_FRACTION = 0.05

SEED_FIX = "pass a whole number in [0, 2**32) (the seed of the train/val split)"


class SplitOptions(NamedTuple):
    batch_size: int
    num_workers: int
    val_fraction: float
    seed: int
    val_from_train: int | None


def checked_split_options(
    owner: type, batch_size: Any, num_workers: Any, val_fraction: Any, seed: Any, val_from_train: Any
) -> SplitOptions:
    """The split's arguments as ints and a float, refused (`owner`'s options) unless each is of its kind and range."""
    with options_of(owner):
        batch_size = check_whole_number("batch_size", batch_size, fix="pass an int >= 1")
        if batch_size < 1:
            raise OutOfRange("batch_size", batch_size, ">= 1", "pass {--batch_size} 1 or more", owner)
        workers_fix = "pass {--num_workers} 0 (load in the main process) or a count of worker processes"
        num_workers = check_whole_number("num_workers", num_workers, fix=workers_fix)
        if num_workers < 0:
            raise OutOfRange("num_workers", num_workers, ">= 0", workers_fix, owner)
        seed = check_whole_number("seed", seed, fix=SEED_FIX)
        if not 0 <= seed < 2**32:  # numpy's generators take no negative seed
            raise OutOfRange("seed", seed, "in [0, 2**32)", owner=owner)
        fraction_fix = "pass the share of the data to hold out, e.g. {--val_fraction} 0.05 (0: no validation)"
        val_fraction = check_real("val_fraction", val_fraction, fraction_fix)
        if not 0 <= val_fraction < 1:
            raise OutOfRange("val_fraction", val_fraction, "in [0, 1)", fraction_fix, owner)
        if val_from_train is not None:
            count_fix = "pass a count of training samples, or leave {--val_from_train} unset"
            val_from_train = check_whole_number("val_from_train", val_from_train, fix=count_fix)
            if val_from_train < 1:
                raise OutOfRange("val_from_train", val_from_train, ">= 1 (or None)", count_fix, owner)
    if val_from_train is not None and val_fraction > 0:
        raise InvalidValue(
            f"{{--val_from_train}} {val_from_train} validates on training samples and holds nothing out, yet "
            f"{{--val_fraction}} {val_fraction}{' (its default)' if val_fraction == DEFAULT_VAL_FRACTION else ''} "
            "holds some out",
            "set {--val_fraction} 0 with it",
            owner,
        )
    return SplitOptions(batch_size, num_workers, val_fraction, seed, val_from_train)


def check_streaming_options(owner: type, prepared: bool, cache_dir: Any, max_cache_size: Any) -> None:
    """The cache options apply to a prepared set alone; a size is a number of bytes with its unit."""
    fixes = {"cache_dir": "pass the folder's path as a str", "max_cache_size": "pass a size such as '50GB'"}
    for name, value in (("cache_dir", cache_dir), ("max_cache_size", max_cache_size)):
        if value is not None and not prepared:
            raise OutOfRange(name, value, "unset unless the data is a prepared set", "leave it unset", owner)
        if value is not None and not isinstance(value, str):  # a number failed in re's or pathlib's words
            raise WrongType(name, value, "a str", fixes[name])
    if max_cache_size is not None and not CACHE_SIZE.fullmatch(max_cache_size):
        raise OutOfRange("max_cache_size", max_cache_size, "a size such as 50GB or 500MB", owner=owner)
    if cache_dir is not None and Path(cache_dir).expanduser().is_file():
        raise OutOfRange("cache_dir", cache_dir, "a folder (made if missing), not a file", owner=owner)
