"""benchmarks/quality/first_run.py times `python train.py` as the README prints it and scores its checkpoint: its quick
mode runs end to end, and its results file keeps one row per CPU kind."""

import sys

import pytest
from helpers import warm


@pytest.fixture
def first_run():
    from benchmarks.quality import first_run

    return first_run


@pytest.mark.slow
def test_the_quick_mode_trains_scores_and_writes_a_row_per_cpu_kind(first_run, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    other = "| Some Other CPU, 8 cores, AVX-512 | 2026-01-01 | abc1234 | 100 s | 17.00 (16.34) | 1.040x | PASS | PASS |"
    stale = (
        f"| {first_run.cpu_kind()} | 2026-01-01 | abc1234 | 9999 s | 99.00 (16.34) | 6.059x | MISS | MISS |"
    )
    (out / "first_run.md").write_text("\n".join(["# old", "", *first_run.HEADER, other, stale]) + "\n")
    # Its `sys.executable train.py` forked warm (helpers/warm.py): the quick mode's wiring, not an interpreter's start.
    monkeypatch.setattr(sys, "executable", warm.python())
    text = first_run.main(["--quick", "--out", str(out)])
    assert text == (out / "first_run.md").read_text().rstrip("\n") and "QUICK MODE" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")][2:]
    assert rows[0] == other and len(rows) == 2  # another CPU's row kept; this one's replaced, not added
    cells = [cell.strip() for cell in rows[1].split("|")[1:-1]]
    assert cells[0] == first_run.cpu_kind() and cells[3].endswith(" s") and float(cells[3][:-2]) < 9999
    fd, floor = (float(x) for x in cells[4].replace("(", "").replace(")", "").split())
    assert floor == pytest.approx(16.34, abs=0.1) and fd > 0
    assert float(cells[5].removesuffix("x")) == pytest.approx(fd / floor, rel=1e-3)
    assert cells[6].split()[0] in ("PASS", "MISS") and cells[7] == ("PASS" if fd <= 1.3 * floor else "MISS")


def test_the_cpu_kind_names_the_model_the_cores_and_the_widest_vector_extension(first_run):
    kind = first_run.cpu_kind()
    assert ", " in kind and " cores, " in kind
    assert kind.split(" cores, ")[1].split(" + ")[0] in ("AVX-512", "AVX2", "no AVX2")


def test_the_time_target_is_judged_on_its_own_cpu_kind_only(first_run):
    slow = first_run.row("AMD EPYC, 2 cores, AVX2", 500, 18.0, 16.34)
    assert slow.endswith("| PASS | PASS |")
    fast = first_run.row("Intel Xeon, 2 cores, AVX-512", 500, 25.0, 16.34)
    assert "| PASS (not the target's CPU) | MISS |" in fast
    assert first_run.row("AMD EPYC, 2 cores, AVX2", 601, 21.0, 16.34).endswith("| MISS | PASS |")
