"""The README and the guides in docs/ stay true to the code: every relative link resolves (to a file, and to a
heading where it names one), and every command in their code blocks parses as the command would parse it
(`--print_config` for train.py, the parser alone for the sample, evaluate, export and phema CLIs): no training, no sampling.
tests/test_documented_commands.py runs them (`python_command_lines`)."""

import re
import shlex
import tomllib
from pathlib import Path

import lightning.pytorch
import pytest
from helpers.troubleshooting import PLACEHOLDER, table_messages

from diffusion.cli import evaluate_nll
from diffusion.cli.evaluate import build_parser as evaluate_parser
from diffusion.cli.export import build_parser as export_parser
from diffusion.cli.flag_names import flag_text
from diffusion.cli.phema import build_parser as phema_parser
from diffusion.cli.prepare import build_parser as prepare_parser
from diffusion.cli.sample import build_parser as sample_parser
from diffusion.cli.train import DiffusionCLI
from diffusion.cli.train import main as train
from diffusion.errors import OPTION

REPO = Path(__file__).resolve().parents[1]
PARSERS = {
    "diffusion.sample": sample_parser,
    "diffusion.evaluate": evaluate_parser,
    "diffusion.export": export_parser,
    "diffusion.phema": phema_parser,
    "diffusion.prepare": prepare_parser,
}
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def links() -> list[tuple[Path, str]]:
    return [
        (doc, target) for doc in DOCUMENTS for target in LINK.findall(doc.read_text()) if "://" not in target
    ]


@pytest.mark.parametrize(
    "document, target", links(), ids=[f"{doc.name}: {target}" for doc, target in links()]
)
def test_every_relative_link_resolves(document, target):
    path, _, anchor = target.partition("#")
    resolved = (document.parent / path).resolve() if path else document
    assert resolved.exists(), f"{document.name} links to {target}, which does not exist"
    if anchor and resolved.suffix == ".md":
        headings = {
            slug(line.lstrip("#")) for line in resolved.read_text().splitlines() if line.startswith("#")
        }
        assert anchor in headings, f"{document.name} links to {target}, a heading {resolved.name} lacks"


RELATIVE_PATH = re.compile(r"(?<![\w.])(?:\.\./)+[\w./-]*")  # ../x, ../../x: in a link or in the text


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda doc: doc.name)
def test_no_document_points_outside_the_repository(document):
    """A fresh clone has only the repository: a path to a sibling folder (../shared/...) names nothing there. Every
    ../ path a document prints, in a link or its text, is a file or folder of the repository from the document's
    folder."""
    outside = [
        path
        for path in RELATIVE_PATH.findall(document.read_text())
        if not (resolved := (document.parent / path).resolve()).is_relative_to(REPO) or not resolved.exists()
    ]
    assert not outside, f"{document.name} points outside the repository: {', '.join(outside)}"


def command_lines(document: Path) -> list[tuple[str, list[str]]]:
    """The shell commands in a document's ```bash blocks, continuation lines joined, comments dropped: each as
    (its text as printed, one space between words; its words as the shell splits them)."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", document.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#") and "$(" not in line:
                for part in re.split(r"\s&&\s", line):
                    words = shlex.split(part, comments=True)
                    if words:
                        found.append((printed_text(part, words), words))
    return found


def printed_text(part: str, words: list[str]) -> str:
    """`part` up to its comment (the first `#` after which the shell's words are all there), spaces collapsed."""
    for comment in re.finditer(r"(?:^|\s)#", part):
        try:
            if shlex.split(part[: comment.start()]) == words:
                return " ".join(part[: comment.start()].split())
        except ValueError:  # the `#` is inside quotes
            continue
    return " ".join(part.split())


def commands(document: Path) -> list[list[str]]:
    """The shell commands in a document's ```bash blocks, continuation lines joined, comments dropped."""
    return [words for _, words in command_lines(document)]


ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")


def python_command_lines() -> list[tuple[Path, str, list[str]]]:
    """(document, text as printed, argv) of every `python train.py`, `python -m diffusion.X` and `torchrun ...
    train.py` line; argv from the program on (`train.py ...`, `diffusion.X ...`)."""
    found = []
    for document in DOCUMENTS:
        for text, words in command_lines(document):
            while words and ASSIGNMENT.fullmatch(words[0]):  # `NAME=value torchrun ...`: its environment
                words = words[1:]
            if "train.py" in words and words[0] in ("python", "torchrun", "srun"):
                found.append((document, text, words[words.index("train.py") :]))
            elif "-m" in words and words[words.index("-m") + 1].startswith("diffusion"):
                found.append((document, text, words[words.index("-m") + 1 :]))
    return found


def python_commands() -> list[tuple[str, list[str]]]:
    """(document, argv) of every `python train.py`, `python -m diffusion.X` and `torchrun ... train.py` line."""
    return [(document.name, argv) for document, _, argv in python_command_lines()]


@pytest.mark.parametrize(
    "document, argv",
    python_commands(),
    ids=[f"{doc}: {' '.join(argv)[:50]}" for doc, argv in python_commands()],
)
def test_every_documented_command_parses(document, argv, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # commands are written for the project's folder (configs/...)
    program, args = argv[0], argv[1:]
    if program == "train.py":
        # The parse alone: the checks of the built run need the files and devices a command names, which this
        # machine lacks (tests/test_documented_commands.py runs those it can).
        monkeypatch.setattr(DiffusionCLI, "before_instantiate_classes", lambda cli: None)
        monkeypatch.setattr(DiffusionCLI, "instantiate_classes", lambda cli: None)
        monkeypatch.setattr(
            DiffusionCLI, "after_instantiate_classes", lambda cli: cli._command_line.print_config_if_asked()
        )
        with pytest.raises(SystemExit) as exit_info:
            train([*args, "--print_config"])
        assert exit_info.value.code == 0, capsys.readouterr().err
    elif program == "diffusion.evaluate" and evaluate_nll.requested(args):  # --nll: a command of its own
        evaluate_nll.build_parser().parse_args(args)
    elif program in PARSERS:
        PARSERS[program]().parse_args(args)
    else:
        pytest.fail(f"{document}: {' '.join(argv)} names no command of this project")


def test_the_readme_set_up_installs_from_the_projects_files():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installs = [words for words in commands(REPO / "README.md") if words[:2] == ["pip", "install"]]
    assert installs, "the README has no set-up command"
    pins = dict(
        line.split("==") for line in (REPO / "constraints.txt").read_text().splitlines() if "==" in line
    )
    for words in installs:
        if {"--index-url", "--extra-index-url"} & set(words):
            # torch alone, before the project: the pinned versions of a CPU-only or another CUDA build
            wanted = [word.split("==") for word in words if "==" in word]
            assert wanted and all(pins[name] == version for name, version in wanted), words
            continue
        assert words[words.index("-c") + 1] == "constraints.txt" and (REPO / "constraints.txt").is_file()
        extra = re.fullmatch(r"\.(?:\[(\w+)\])?", words[-1])  # the project itself, or with an extra
        assert extra and (extra.group(1) is None or extra.group(1) in extras)
    assert ["pytest"] in [words[-1:] for words in commands(REPO / "README.md")]


def test_every_message_of_the_troubleshooting_table_is_in_the_code():
    """docs/troubleshooting.md's table and the code, both ways, cheaply: here every row's message (its runs of three
    or more words between placeholders and punctuation) is text the package (or Lightning) holds, so a message reworded or
    removed in the code takes its row with it; and every line tests/cli/test_every_flag.py sees (each flag of each
    command, given bad values) must match a row, so a new kind of message gets its row (`matches_a_row`)."""
    # Lightning's own words for its Trainer's options are rows too: they are held against its source.
    files = [*(REPO / "diffusion").rglob("*.py"), *Path(lightning.pytorch.__file__).parent.rglob("*.py")]
    source = " ".join(" ".join(path.read_text().split()) for path in files)
    # A placeholder naming its class (`{command:--ckpt_path}`, `{Trainer:--default_root_dir}`) as commands say it.
    source = OPTION.sub(lambda match: flag_text(match[1], match[2]) if match[1] else match[0], source)
    missing = {}
    for message in table_messages():
        parts = PLACEHOLDER.split(message.removeprefix("error: "))
        chunks = [chunk.strip() for part in parts for chunk in re.split(r"[:();—,/]", part)]
        absent = [chunk for chunk in chunks if len(chunk.split()) >= 3 and chunk not in source]
        if absent:
            missing[message] = absent
    assert len(table_messages()) >= 10 and not missing, missing


# ---- the README's figures come from results files -------------------------------------------------------------
RESULTS_LINK = re.compile(r"\]\((benchmarks/results/[\w.-]+\.md)(?:#[\w-]+)?\)")
# A results file names where its figures came from: a date, a commit and the machine (a CPU's cores and vector
# extensions, or the GPU): benchmarks/provenance.py writes the line.
PROVENANCE = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a commit": re.compile(
        r"\bcommit [0-9a-f]{7,40}\b|\| [0-9a-f]{7,40}( \(uncommitted changes\))? \|"
    ),  # or a column
    "a machine": re.compile(r"\d+ cores, (AVX-512|AVX2|no AVX2)|NVIDIA [A-Z]\d+"),
}


def headline_rows() -> list[tuple[str, str]]:
    """(what, figure) of each row of the README's "Headline figures" table."""
    section = (REPO / "README.md").read_text().split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    return [(cells[0].removeprefix("| "), cells[1].removesuffix(" |")) for cells in rows[1:]]


@pytest.mark.parametrize("what, figure", headline_rows(), ids=[what[:40] for what, _ in headline_rows()])
def test_every_headline_figure_is_in_the_results_file_it_cites(what, figure):
    """Each row links the results file(s) its numbers come from; every number the row prints appears in them,
    and each file says when, at which commit and on which machine it was measured."""
    files = RESULTS_LINK.findall(what + " " + figure)
    assert files, f"the README's figure '{what}' cites no benchmarks/results/*.md file"
    texts = [(REPO / name).read_text() for name in files]
    for name, text in zip(files, texts, strict=True):
        for kind, pattern in PROVENANCE.items():
            assert pattern.search(text), f"{name} does not say {kind} (benchmarks/provenance.py writes it)"
    printed = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", what + " " + figure)  # links' targets are not figures
    for number in re.findall(r"\d+(?:,\d{3})*(?:\.\d+)?", printed):
        assert any(number in text for text in texts), (
            f"the README's {number} ('{what}') is in none of {files}"
        )
