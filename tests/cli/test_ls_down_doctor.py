"""`fsdp-eks ls`, `down` and `doctor`, as typed: the stand-in Pulumi CLI answers `stack ls`,
`stack output`, `stack export` and `destroy`; the metrics files are in moto's S3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import (
    RUN_URI,
    assert_one_line_mistake,
    calls,
    run_cli,
    set_answers,
)

STACKS = Path(__file__).resolve().parents[2] / "stacks"
STATE = {
    "version": 3,
    "deployment": {
        "resources": [
            {"urn": "urn:pulumi:dev::fsdp-eks::pulumi:pulumi:Stack::fsdp-eks-dev",
             "type": "pulumi:pulumi:Stack"},
            {"urn": "urn:pulumi:dev::fsdp-eks::aws:eks/cluster:Cluster::platform-eks",
             "type": "aws:eks/cluster:Cluster", "id": "dev-cluster"},
            {"urn": "urn:pulumi:dev::fsdp-eks::aws:s3/bucket:Bucket::storage-bucket",
             "type": "aws:s3/bucket:Bucket", "id": "storage-bucket-e2033bd",
             "outputs": {"bucket": "storage-bucket-e2033bd"}, "retainOnDelete": True},
            {"urn": "urn:pulumi:dev::fsdp-eks::aws:s3/bucketPolicy:BucketPolicy::storage-tls",
             "type": "aws:s3/bucketPolicy:BucketPolicy", "retainOnDelete": True},
        ]
    },
}  # fmt: skip


def metrics(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


def test_ls_without_pulumi_shows_every_stack_from_its_plan(no_pulumi: None) -> None:
    from infra.config import stack_names

    result = run_cli("ls")
    assert result.code == 0, result
    header, *rows = result.lines
    assert header.split()[:3] == ["STACK", "DEPLOYED", "JOB"]
    assert [row.split()[0] for row in rows] == stack_names()
    dev = next(row for row in rows if row.startswith("dev "))
    assert "unknown" in dev and "(plan)" in dev and "no Pulumi CLI here" in dev


def test_ls_reads_deployed_runs_from_their_outputs_and_metrics(
    fake_cli: Path, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama31-8b-p5 is deployed and training (its metrics file in S3), dev was never
    deployed, team-cluster has no stack: a row each, the deployed one measured."""
    bucket, prefix = RUN_URI.removeprefix("s3://").split("/", 1)
    now = 1_780_000_000.0
    s3.put_object(
        Bucket=bucket,
        Key=f"{prefix}/metrics.jsonl",
        Body=metrics(
            [
                {"time": now - 7200, "kind": "run", "step": 0, "start": {"attempt": 1},
                 "config": {"optim": {"max_steps": 3500}}},
                {"time": now - 1800, "kind": "train", "step": 700, "loss": 2.1, "eta_s": 36000},
            ]
        ),
    )  # fmt: skip
    monkeypatch.setattr("scripts.cli.support.progress.datetime", _FrozenNow(now))
    set_answers(
        fake_cli,
        stacks=[
            {"name": "llama31-8b-p5", "resourceCount": 118},
            {"name": "dev", "resourceCount": 0},
        ],
        outputs={"jobName": "llama31-8b-p5", "checkpointS3Uri": RUN_URI,
                 "estimatedUsdPerHour": 220.16},
    )  # fmt: skip
    result = run_cli("ls", "llama31-8b-p5", "dev", "team-cluster")
    assert result.code == 0, result
    rows = {line.split()[0]: line for line in result.lines[1:]}
    deployed = rows["llama31-8b-p5"].split()
    assert deployed[1:4] == ["yes", "running", "700/3500"]
    assert "9.5 h" in rows["llama31-8b-p5"]  # 10 h ETA at its last record, half an hour ago
    # Trained 1.5 h (first record to last) at $220.16/h.
    assert "220.16" in rows["llama31-8b-p5"] and "~330.24" in rows["llama31-8b-p5"]
    assert rows["dev"].split()[1:3] == ["no", "not"] and "(plan)" in rows["dev"]
    assert "pulumi stack init" in rows["team-cluster"]
    assert ["pulumi", "stack", "ls", "--json"] in calls(fake_cli)
    as_json = run_cli("ls", "llama31-8b-p5", "--json")
    assert json.loads(as_json.out)["step"] == "700/3500"


class _FrozenNow:
    """`datetime` whose `now` is fixed (the ETA counts down from the last record's time)."""

    def __init__(self, stamp: float) -> None:
        from datetime import UTC, datetime

        self._datetime = datetime
        self._now = datetime.fromtimestamp(stamp, UTC)

    def now(self, tz: Any = None) -> Any:
        return self._now

    def fromtimestamp(self, *args: Any, **kwargs: Any) -> Any:
        return self._datetime.fromtimestamp(*args, **kwargs)

    def fromisoformat(self, text: str) -> Any:
        return self._datetime.fromisoformat(text)


def test_down_says_what_is_kept_asks_and_destroys(fake_cli: Path) -> None:
    set_answers(
        fake_cli,
        state=STATE,
        outputs={"bucketName": "storage-bucket-e2033bd", "jobName": "dev",
                 "estimatedUsdPerHour": 1.006, "standingUsdPerDay": 6.07},
    )  # fmt: skip
    declined = run_cli("down", "dev", stdin="n\n")
    assert declined.code == 1 and "nothing destroyed" in declined.err
    assert not any(call[:2] == ["pulumi", "destroy"] for call in calls(fake_cli))
    lines = declined.out.splitlines()
    assert lines[0] == "pulumi destroy -s dev deletes 3 resources."
    assert "Kept in the account (retained: storage.dataPolicy retain):" in declined.out
    assert "aws:s3/bucket:Bucket storage-bucket (storage-bucket-e2033bd)" in declined.out
    assert "GPU nodes at $1.01/h while any run; the platform at ~$6.07/day." in declined.out
    # The dev stack does not name its bucket: how to find the kept one again.
    assert "storage.bucket.name: storage-bucket-e2033bd" in declined.out
    done = run_cli("down", "dev", "--yes")
    assert done.code == 0, done
    assert calls(fake_cli)[-1] == ["pulumi", "destroy", "--yes", "--stack", "dev"]  # no --remove


def test_down_of_a_stack_whose_file_was_edited_since_still_destroys(
    fake_cli: Path, tmp_path: Path
) -> None:
    """The file only tells whether the bucket is named: a file that no longer validates makes
    that unknown (said so), never a refusal to take down what is deployed."""
    edited = tmp_path / "Pulumi.dev.yaml"
    edited.write_text((STACKS / "Pulumi.dev.yaml").read_text() + "  fsdp-eks:nonsense: 1\n")
    set_answers(fake_cli, state=STATE, outputs={"bucketName": "storage-bucket-e2033bd"})
    done = run_cli("down", str(edited), "--yes")
    assert done.code == 0, done
    assert "whether it names its bucket is unknown" in done.out
    assert "storage.bucket.name: storage-bucket-e2033bd" in done.out
    assert calls(fake_cli)[-1] == ["pulumi", "destroy", "--yes", "--stack", "dev"]


def test_down_of_a_stack_with_nothing_deployed_destroys_nothing(fake_cli: Path) -> None:
    set_answers(fake_cli, state={"deployment": {"resources": []}}, outputs={})
    result = run_cli("down", "dev", "--yes")
    assert result.code == 0 and "nothing to destroy" in result.out
    assert not any(call[:2] == ["pulumi", "destroy"] for call in calls(fake_cli))


def test_down_needs_the_pulumi_cli(no_pulumi: None) -> None:
    assert_one_line_mistake(run_cli("down", "dev"), "pulumi is not installed")


def test_doctor_reports_each_tool_and_what_it_is_for(
    fake_cli: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_answers(fake_cli, selected="dev")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    result = run_cli("doctor")
    lines = {line.split()[1]: line for line in result.lines if line[:2] in ("ok", "--")}
    assert lines["pulumi"].startswith("ok") and "v3.200.0" in lines["pulumi"]
    assert lines["kubectl"].startswith("ok")  # optional: only the printed hints use it
    assert lines["kubernetes"].startswith("ok") and "Python client" in lines["kubernetes"]
    assert lines["selected"].startswith("ok") and lines["selected"].endswith("dev")
    assert lines[".venv-dev"].startswith("ok") and "dev" in lines[".venv-dev"]
    assert lines["AWS"].startswith("--") and "no AWS credentials" in lines["AWS"]
    assert result.code == 1  # something is missing (credentials), and the line says what for


def test_down_of_a_queued_trainjob_stack_destroys_it_as_any_other(fake_cli: Path) -> None:
    """`down` is the job API's business only through `pulumi destroy`: the TrainJob goes
    before the Trainer and Kueue releases it depends on (reverse dependency order)."""
    stack = "llama32-1b-g5-trainjob"
    set_answers(
        fake_cli,
        state=STATE,
        outputs={"bucketName": "storage-bucket-e2033bd", "jobName": stack, "jobApi": "trainjob"},
    )
    done = run_cli("down", stack, "--yes")
    assert done.code == 0, done
    assert f"The job {stack} is deleted with its pods" in done.out
    assert calls(fake_cli)[-1] == ["pulumi", "destroy", "--yes", "--stack", stack]
