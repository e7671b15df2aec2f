"""docs/config.md's key table is generated from the config model and must be current."""

from __future__ import annotations

import pytest

from infra.config import StackConfig
from scripts.tooling import config_docs


def test_config_table_in_docs_is_up_to_date() -> None:
    assert config_docs.main(["--check"]) == 0, "run: python scripts/tooling/config_docs.py"


def test_table_lists_every_section_and_nested_key() -> None:
    table = config_docs.render_table()
    for name, field in StackConfig.model_fields.items():
        assert f"### `fsdp-eks:{field.alias or name}`" in table
    assert "| `gpuNodes.instanceType` | str | **required** |" in table
    assert '| `training.shardingStrategy` | "auto" \\| "full" \\| "hybrid"' in table
    assert "| `gpuNodes.capacity.reservationId` |" in table
    assert "| `gpuNodes.taints[].effect` |" in table
    assert "| `job.shmSizeGiB` |" in table


def test_check_fails_on_a_stale_table(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    stale = tmp_path / "config.md"
    stale.write_text(
        config_docs.DOC.read_text().replace("| `training.maxSteps` |", "| `training.steps` |")
    )
    monkeypatch.setattr(config_docs, "DOC", stale)
    monkeypatch.setattr(config_docs, "REPO_ROOT", tmp_path)
    assert config_docs.main(["--check"]) == 1
    assert config_docs.main([]) == 0
    assert config_docs.main(["--check"]) == 0
