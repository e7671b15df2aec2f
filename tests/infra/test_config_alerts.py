"""The `alerts` section: one line naming the key for each mistake, and its defaults."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import StackConfigError, parse_stack_config
from tests.infra.test_config import BASE


def parsed(alerts: dict[str, Any]) -> Any:
    return parse_stack_config({**BASE, "alerts": alerts}, stack_name="exp").alerts


def test_defaults_create_a_topic_with_nobody_on_it() -> None:
    alerts = parse_stack_config(BASE, stack_name="exp").alerts
    assert alerts.enabled and alerts.creates_topic
    assert alerts.email == [] and alerts.sns_topic_arn is None
    assert (alerts.throughput_floor, alerts.spend_warning) == (0.5, 0.8)


def test_an_existing_topic_is_used_not_created() -> None:
    arn = "arn:aws:sns:us-west-2:123456789012:ml-alerts"
    alerts = parsed({"snsTopicArn": arn})
    assert alerts.sns_topic_arn == arn and not alerts.creates_topic


@pytest.mark.parametrize(
    ("alerts", "expected"),
    [
        ({"email": ["ops"]}, "alerts.email 'ops' is not an e-mail address"),
        ({"email": ["a@b.io", "a@b.io"]}, "alerts.email lists 'a@b.io' twice"),
        ({"snsTopicArn": "ml-alerts"}, "alerts.snsTopicArn 'ml-alerts' is not an SNS topic ARN"),
        (
            {"email": ["a@b.io"], "snsTopicArn": "arn:aws:sns:us-west-2:123456789012:t"},
            "alerts.email and alerts.snsTopicArn are both set",
        ),
        ({"throughputFloor": 1.5}, "alerts.throughputFloor = 1.5"),
        ({"spendWarning": 0}, "alerts.spendWarning = 0"),
        ({"emails": ["a@b.io"]}, "alerts.emails: unknown key (did you mean 'email'?)"),
    ],
)
def test_a_mistake_is_one_line_naming_the_key(alerts: dict[str, Any], expected: str) -> None:
    with pytest.raises(StackConfigError) as raised:
        parsed(alerts)
    assert len(raised.value.problems) == 1
    (line,) = raised.value.problems
    assert expected in line and "\n" not in line
