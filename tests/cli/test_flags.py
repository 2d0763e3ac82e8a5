"""The flags several commands take are declared once (`diffusion.cli.flags.FLAGS`): no command adds one of them by
hand, a command's change to one (a default, the help) stays its own, and a change to a flag it does not add is
refused. An --out folder that refuses writes is said truly."""

import ast
from pathlib import Path

import pytest
from helpers.full_disk import immutable

from diffusion.cli import evaluate, flags, phema, sample
from diffusion.cli.flags import FLAGS, add_flags, check_writable_folder, command_parser
from diffusion.errors import UserError

CLI = Path(flags.__file__).parent


def flags_added_by_hand(path: Path) -> list[str]:
    """The `FLAGS` names a module passes to an `add_argument` call of its own."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and str(first.value).removeprefix("--") in FLAGS:
                found.append(first.value)
    return found


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda path: path.name)
def test_no_command_declares_a_shared_flag_by_hand(path):
    if path.name != "flags.py":
        assert flags_added_by_hand(path) == [], f"{path.name}: add these with add_flags"


def test_the_check_sees_a_shared_flag_added_by_hand(tmp_path):
    source = tmp_path / "command.py"
    source.write_text('def build(parser):\n    parser.add_argument("--seed", type=int, default=0)\n')
    assert flags_added_by_hand(source) == ["--seed"]


def test_a_commands_change_to_a_shared_flag_is_its_own():
    assert evaluate.build_parser().parse_args([]).batch_size == 250  # images per feature batch
    assert (
        sample.build_parser().parse_args(["--ckpt", "x"]).batch_size == FLAGS["batch_size"]["default"] == 256
    )
    assert phema.build_parser().parse_args(["--run", "r"]).ckpt is None  # optional there, required elsewhere


def test_a_change_to_a_flag_not_added_is_refused():
    with pytest.raises(ValueError, match=r"changes to flags not added: \['sed'\]"):
        add_flags(command_parser("prog", ""), "seed", sed={"help": "a typo"})


def test_an_immutable_out_folder_is_said_immutable(tmp_path):
    """sample's, export's and phema's --out of a `chattr +i` folder said "(Operation not permitted) — pick a folder
    you can write to", though its mode bits let the user write (tester round 14b: Q1)."""
    folder = tmp_path / "out"
    folder.mkdir()
    with immutable(folder), pytest.raises(UserError) as refused:
        check_writable_folder(folder, "--out")
    assert str(refused.value) == (
        f"--out {folder}: cannot write into {folder} (it is immutable) — check its attributes (lsattr -d {folder}; "
        "chattr -i clears an immutable flag), or pick another folder"
    )


def test_a_folder_refusing_writes_for_its_mode_says_the_systems_reason(tmp_path, monkeypatch):
    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(flags.tempfile, "TemporaryFile", refused)
    with pytest.raises(UserError, match=r"\(Permission denied\) — pick a folder you can write to$"):
        check_writable_folder(tmp_path, "--out")
