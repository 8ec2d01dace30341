"""The package's top level holds the roles and the public API (docs/architecture.md, "Layout");
every other module lives in the package named after what it does."""

from __future__ import annotations

from conftest import REPO

ROLES = {"actor", "learner", "replay_server", "param_server", "evaluation"}
PUBLIC = {"__init__", "__main__", "cli", "roles", "api", "policy", "callbacks"}


def test_the_top_level_holds_the_roles_and_the_public_api_only():
    top = {path.stem for path in (REPO / "apexrl").glob("*.py")}
    assert top == ROLES | PUBLIC, (
        f"modules at apexrl's top level that are neither a role nor the public API: "
        f"{sorted(top - ROLES - PUBLIC)}; missing: {sorted(ROLES | PUBLIC - top)}"
    )


def test_the_architecture_page_names_every_package():
    page = (REPO / "docs" / "architecture.md").read_text()
    packages = sorted(path.parent.name for path in (REPO / "apexrl").glob("*/__init__.py"))
    assert packages, "no packages found under apexrl/"
    missing = [name for name in packages if f"apexrl/{name}/" not in page]
    assert not missing, f"docs/architecture.md's layout does not name {missing}"
