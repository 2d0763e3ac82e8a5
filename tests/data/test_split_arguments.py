"""The data modules' counts are refused by name when built unless whole numbers (tester round 18b, M6): seed=1.5 was
taken and ended setup in torch's or numpy's words (`manual_seed expected a long, but got float`, `SeedSequence
expects int`), seed='3' in `'<=' not supported between instances of 'int' and 'str'`; num_workers=1.5 and
val_from_train=True were taken without a word. Each count, with a fraction, a text and a bool; and the share held
out, with a text and a bool (`diffusion.data.split_options`)."""

import pytest

from diffusion import ImageDataModule, VectorDataModule
from diffusion.cli.flag_names import flag_text
from diffusion.data.split_options import check_streaming_options
from diffusion.errors import OutOfRange, WrongType

VECTORS = {"dataset": "gaussian", "num_samples": 40}
IMAGE_COUNTS = ["seed", "batch_size", "num_workers", "val_from_train", "image_size", "channels"]
VECTOR_COUNTS = ["seed", "batch_size", "num_workers", "num_samples", "dim"]
CASES = [(ImageDataModule, {}, name) for name in IMAGE_COUNTS] + [
    (VectorDataModule, VECTORS, name) for name in VECTOR_COUNTS
]


def build(cls, base, name, value):
    held_out = {"val_fraction": 0} if name == "val_from_train" else {}  # it validates on training samples
    module = cls(**{**base, **held_out, name: value})
    module.setup("fit")  # where seed=1.5 failed
    return module


@pytest.mark.parametrize(("cls", "base", "name"), CASES, ids=[f"{c.__name__}-{n}" for c, _, n in CASES])
def test_a_count_given_as_a_fraction_text_or_bool_is_refused_when_built(cls, base, name):
    with pytest.raises(OutOfRange, match=rf"^{name}=1.5 must be a whole number") as fraction:
        build(cls, base, name, 1.5)
    with pytest.raises(WrongType, match=rf"^{name}='3' is a str, not a whole number") as text:
        build(cls, base, name, "3")
    with pytest.raises(WrongType, match=rf"^{name}=True is a bool, not a whole number"):
        build(cls, base, name, True)
    assert " — pass " in str(fraction.value) and " — pass " in str(text.value)


def test_the_seed_is_said_as_the_tester_wrote_it_and_as_its_flag():
    with pytest.raises(OutOfRange) as fraction:
        ImageDataModule(seed=1.5)
    assert str(fraction.value) == (
        "seed=1.5 must be a whole number — pass a whole number in [0, 2**32) (the seed of the train/val split)"
    )
    assert flag_text(fraction.value.owner, fraction.value.name) == "--data.seed"
    with pytest.raises(WrongType, match=r"^seed='3' is a str, not a whole number — pass a whole number in"):
        VectorDataModule(seed="3", num_samples=40)
    with pytest.raises(OutOfRange, match=r"^seed=-1 must be in \[0, 2\*\*32\)"):  # as before
        ImageDataModule(seed=-1)


@pytest.mark.parametrize("cls", [ImageDataModule, VectorDataModule])
def test_the_share_held_out_given_as_text_or_a_bool_is_refused_by_name(cls):
    # val_fraction='0.1' ended in "'<=' not supported"; True was said to be out of [0, 1)
    base = VECTORS if cls is VectorDataModule else {}
    for value, kind in (("0.1", "str"), (True, "bool")):
        with pytest.raises(
            WrongType, match=rf"^val_fraction={value!r} is a {kind}, not a number — pass the share"
        ):
            cls(**base, val_fraction=value)


def test_counts_of_numpy_integers_are_taken_as_ints():
    np = pytest.importorskip("numpy")
    data = ImageDataModule(seed=np.int64(3), batch_size=np.int32(8), num_workers=np.int64(0))
    assert (data.seed, data.batch_size, data.num_workers) == (3, 8, 0)
    assert all(type(value) is int for value in (data.seed, data.batch_size, data.num_workers))
    assert ImageDataModule(val_fraction=0, val_from_train=np.int64(5)).val_from_train == 5


def test_a_cache_option_of_a_prepared_set_given_as_a_number_is_refused_by_name():
    # max_cache_size=50 reached re's "expected string", cache_dir=5 pathlib's "not int"
    with pytest.raises(
        WrongType, match=r"^max_cache_size=50 is an int, not a str — pass a size such as '50GB'"
    ):
        check_streaming_options(ImageDataModule, True, None, 50)
    with pytest.raises(
        WrongType, match=r"^cache_dir=5 is an int, not a str — pass the folder's path as a str"
    ):
        check_streaming_options(VectorDataModule, True, 5, None)
    with pytest.raises(
        OutOfRange, match=r"^max_cache_size=5 must be unset unless the data is a prepared set"
    ):
        ImageDataModule(max_cache_size=5)  # elsewhere unused, as before
    check_streaming_options(ImageDataModule, True, "cache", "50GB")
