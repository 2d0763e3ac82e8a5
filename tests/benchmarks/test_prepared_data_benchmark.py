"""benchmarks/speed/prepared_data.py on a tiny input: every path (the image folder as PNG and JPEG files, prepare, the
prepared set streamed in the training process and by a loading process, held on the device, its png and jpeg sets) is
measured on the images asked for, through the path it names, and reaches the table; the targets are judged from the
rows; its flags refuse a run too small to time."""

import pytest

from benchmarks.speed import prepared_data

IMAGES, BATCH, SIZE = 8, 4, 16


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    plan = prepared_data.Plan(
        sizes=[SIZE], images=IMAGES, batch_size=BATCH, passes=1, min_seconds=0, workers=[1],
        prepare_workers=1, all_encodings_from=SIZE, small_source=(24, 20),
    )  # fmt: skip
    return prepared_data.run(plan, tmp_path_factory.mktemp("prepared_data"), log=lambda line: None)


@pytest.mark.slow
def test_every_path_is_measured_on_the_images_asked_for(rows):
    measured = {(row["path"], row["encoding"], row["workers"]) for row in rows}
    assert measured == {
        ("folder", "png", 0), ("folder", "jpeg", 0), ("prepare", "raw", 1), ("streamed", "raw", 0),
        ("streamed", "raw", 1), ("held", "raw", 0), ("prepare", "png", 1), ("streamed", "png", 0),
        ("prepare", "jpeg", 1), ("streamed", "jpeg", 0),
    }  # fmt: skip
    assert len(rows) == len(measured)
    for row in rows:
        # Every epoch is the whole set (drop_last: whole batches; 8 images in batches of 4 leave none out).
        assert row["epoch_images"] == [IMAGES // BATCH * BATCH], row
        assert row["images_per_s"] > 0 and row["per_process"] > 0, row
        if row["path"] != "prepare":
            assert row["shape"] == (3, SIZE, SIZE) and len(row["per_pass"]) == 1, row


@pytest.mark.slow
def test_each_loader_took_the_path_it_names(rows):
    said = {"folder": "per-item DataLoader", "streamed": "streamed by litdata", "held": "held on cpu"}
    for row in rows:
        if row["path"] != "prepare":
            assert row["data_path"].startswith(said[row["path"]]), row


@pytest.mark.slow
def test_the_table_has_a_row_per_path_with_its_figures(rows):
    plan = prepared_data.Plan(sizes=[SIZE])
    text = prepared_data.report(rows, plan, "python benchmarks/speed/prepared_data.py", (0.0, 0.0))
    body = [line for line in text.splitlines() if line.startswith(f"| {SIZE} |")]
    assert len(body) == len(rows)
    for line, row in zip(body, rows, strict=True):
        assert f"| {row['path']} |" in line and f"| {row['images_per_s']:,.0f} |" in line
    # Ratios against the folder loader's own rate are 1.00x on its rows; prepare's rows have none.
    assert body[0].endswith("| 1.00x | " + f"{rows[0]['per_process'] / rows[1]['per_process']:.2f}x |")
    assert "AVX" in text and "load average" in text


def test_the_targets_are_judged_where_their_sizes_were_measured():
    def row(size, path, workers, rate, encoding="raw"):
        return {"size": size, "path": path, "encoding": encoding, "workers": workers, "images_per_s": rate}

    rows = [
        row(32, "streamed", 0, 9_000), row(32, "streamed", 2, 17_000), row(32, "streamed", 4, 15_000),
        row(32, "streamed", 8, 40_000),
        row(64, "folder", 0, 1_000, "png"), row(64, "folder", 0, 2_000, "jpeg"), row(64, "streamed", 0, 15_000),
    ]  # fmt: skip
    total, ratio = prepared_data.targets(rows)
    # Each way at its best within the target's 4 processes (8 are past it), against 16,000 images/s.
    assert total.endswith(
        "in the training process MISSED (9,000: 0.56x); in loading processes MET (17,000: 1.06x, 2 processes)"
    )
    assert ratio.endswith("MET against PNG files (15.0x), MISSED against JPEG files (7.5x)")
    assert prepared_data.targets(rows[4:6]) == []


@pytest.mark.parametrize(
    "flags", [["--images", "100", "--batch_size", "64"], ["--sizes", "32,", "x"], ["--passes", "0"]]
)
def test_a_run_too_small_to_time_is_refused_before_any_time_is_spent(flags, capsys):
    with pytest.raises(SystemExit) as exit_info:
        prepared_data.parse_args(flags)
    assert exit_info.value.code == 2 and "error: " in capsys.readouterr().err
