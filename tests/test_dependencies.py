"""What a fresh machine installs: pyproject.toml's ranges admit the lent GPU machines' stack, and
constraints.txt pins every package the project and its dev extra need to a version inside those ranges (without a
pin, pip would fetch the newest torch, several GB)."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
REQUIREMENTS = [Requirement(line) for line in PROJECT["dependencies"] + EXTRAS["dev"]]


def pinned() -> dict[str, Version]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = Version(version)
    return pins


def test_every_requirement_is_pinned_inside_its_range():
    pins = pinned()
    for requirement in REQUIREMENTS:
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{requirement.name} has no pin in constraints.txt"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside {requirement}"


def test_every_extra_is_pinned_inside_its_range():
    # pip install -c constraints.txt -e ".[notebook]" must not fetch what nobody tested either.
    pins = pinned()
    for extra, lines in EXTRAS.items():
        for requirement in map(Requirement, lines):
            name = requirement.name.lower().replace("_", "-")
            assert name in pins, f"{requirement.name} (extra {extra}) has no pin in constraints.txt"
            assert requirement.specifier.contains(pins[name]), (
                f"{name}=={pins[name]} is outside {requirement}"
            )


def test_the_ranges_admit_the_gpu_machines_stack():
    ranges = {requirement.name: requirement.specifier for requirement in REQUIREMENTS}
    for name, version in {"torch": "2.11.0", "torchvision": "0.26.0", "lightning": "2.6.0"}.items():
        assert ranges[name].contains(version), (
            f"{name} {version} (the lent GPU machines') is outside {ranges[name]}"
        )


def test_the_python_floor_is_the_oldest_python_the_code_runs_on():
    # The package uses hashlib.file_digest (exported.py) and the tests tomllib and contextlib.chdir: 3.11's. CI
    # runs 3.11, so a lower floor would promise a Python nobody tested; ruff reads the code as of the floor.
    floor = SpecifierSet(PROJECT["requires-python"])
    assert not floor.contains("3.10") and floor.contains("3.11")
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["target-version"]
    assert target == "py311"


def installed_closure(requirements: list[Requirement]) -> dict[str, Version]:
    """Every distribution `requirements` pull in, transitively, as installed here (name -> version): what the
    project and its dev extra really run with, markers and extras followed as pip follows them."""
    from importlib.metadata import PackageNotFoundError, distribution

    found, seen, queue = {}, set(), [(requirement, "") for requirement in requirements]
    while queue:
        requirement, extra = queue.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = requirement.name.lower().replace("_", "-")
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        try:
            dist = distribution(name)
        except PackageNotFoundError:  # an optional dependency's own extra that nothing here installs
            continue
        found[name] = Version(dist.version)
        for line in dist.requires or []:
            queue += [(Requirement(line), chosen) for chosen in ["", *requirement.extras]]
    return found


def test_everything_the_dev_install_pulls_in_is_pinned_at_the_version_installed():
    # The packages' own dependencies too (mlflow-skinny's fastapi, wandb's gitpython, ...): unpinned, a fresh
    # machine gets whatever is newest that day. The notebook, fid and loggers extras resolve from the same file.
    pins, closure = pinned(), installed_closure(REQUIREMENTS)
    assert len(closure) > 100
    unpinned = sorted(f"{name}=={version}" for name, version in closure.items() if name not in pins)
    assert not unpinned, f"not in constraints.txt: {' '.join(unpinned)}"
    other = sorted(f"{name} {pins[name]} pinned, {version} installed" for name, version in closure.items()
                   if pins[name] != version)  # fmt: skip
    assert not other, other
