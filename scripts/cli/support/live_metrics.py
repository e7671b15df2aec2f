"""The run's live figures for `fsdp-eks status`, from the Prometheus that scrapes it.

Where the metrics are: `FSDP_EKS_PROMETHEUS_URL` (any Prometheus HTTP API, e.g. a cluster's
own through `kubectl port-forward`), else the stack's `prometheusEndpoint` output (the Amazon
Managed Prometheus workspace's endpoint, `.../workspaces/<id>/`), queried with SigV4 as the
service `aps` (AMP user guide, "AMP-onboard-query-APIs": the Prometheus-compatible
`api/v1/query` under the workspace endpoint). Only instant queries of the Prometheus HTTP API
(`/api/v1/query`, https://prometheus.io/docs/prometheus/latest/querying/api/) are used.
Any failure becomes one line saying the source was not reachable: status never fails for it.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from infra.job import watch_series as s

URL_ENV = "FSDP_EKS_PROMETHEUS_URL"
ENDPOINT_OUTPUT = "prometheusEndpoint"
TIMEOUT_S = 5.0

Query = Callable[[str], list[dict[str, Any]]]
"""An instant query: PromQL in, the result vector's samples out."""


class MetricsUnreachableError(Exception):
    """The metrics source did not answer or answered with an error."""


@dataclass(frozen=True)
class PlanPace:
    """What the plan expects, to compare the live figures with."""

    tokens_per_second: float | None
    mfu: float | None


@dataclass(frozen=True)
class LiveFigures:
    run: str
    step: int | None
    max_steps: int | None
    last_step_age_s: float | None
    tokens_per_second: float | None
    mfu: float | None
    gpu_utilisation_pct: float | None


def http_query(base_url: str, *, sign: Callable[[str], dict[str, str]] | None = None) -> Query:
    """Instant queries against `base_url` (the part before `api/v1/query`)."""

    def query(expr: str) -> list[dict[str, Any]]:
        url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        headers = sign(url) if sign is not None else {}
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                body = json.load(response)
        except (OSError, ValueError) as error:  # URLError, timeouts, refused, bad JSON
            raise MetricsUnreachableError(f"{base_url}: {error}") from error
        if body.get("status") != "success":
            raise MetricsUnreachableError(f"{base_url}: {body.get('error', body)}")
        result = body["data"]["result"]
        return result if isinstance(result, list) else []

    return query


def sigv4_signer(region: str) -> Callable[[str], dict[str, str]]:
    """Headers that sign a GET of `url` for AMP (`aps`) with the caller's AWS credentials."""
    import botocore.session
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    credentials = botocore.session.get_session().get_credentials()
    if credentials is None:
        raise MetricsUnreachableError("no AWS credentials to sign AMP queries with")

    def sign(url: str) -> dict[str, str]:
        request = AWSRequest(method="GET", url=url)
        SigV4Auth(credentials, "aps", region).add_auth(request)
        return dict(request.headers.items())

    return sign


def metrics_query(outputs: Mapping[str, Any], *, region: str | None) -> Query | None:
    """The run's metrics source, or None when neither the environment nor the stack names one."""
    url = os.environ.get(URL_ENV)
    if url:
        return http_query(url)
    endpoint = outputs.get(ENDPOINT_OUTPUT)
    if isinstance(endpoint, str) and endpoint and region:
        return http_query(endpoint, sign=sigv4_signer(region))
    return None


def _value(samples: list[dict[str, Any]]) -> float | None:
    return float(samples[0]["value"][1]) if samples else None


def live_figures(query: Query, *, stack: str) -> LiveFigures | None:
    """The stack's newest run as Prometheus sees it now; None when it has no series."""
    sel = f'stack="{stack}"'
    newest = query(f"topk(1, max by (run) ({s.LAST_STEP_TIME}{{{sel}}}))")
    if not newest:
        newest = query(f"topk(1, max by (run) ({s.STEP}{{{sel}}}))")
    if not newest:
        return None
    run = newest[0]["metric"].get("run", "")
    of_run = f'{sel}, run="{run}"'
    step = _value(query(f"max({s.STEP}{{{of_run}}})"))
    max_steps = _value(query(f"max({s.MAX_STEPS}{{{of_run}}})"))
    # The GPUs of the nodes the run's ranks are on (the trainer's `node`, DCGM's Hostname).
    nodes = (
        f'label_replace(group by (node) ({s.STEP}{{{of_run}}}), "{s.GPU_NODE_LABEL}", "$1", '
        '"node", "(.*)")'
    )
    return LiveFigures(
        run=run,
        step=int(step) if step is not None else None,
        max_steps=int(max_steps) if max_steps is not None else None,
        last_step_age_s=_value(query(f"time() - max({s.LAST_STEP_TIME}{{{of_run}}})")),
        tokens_per_second=_value(query(f"max({s.TOKENS_PER_SECOND}{{{of_run}}})")),
        mfu=_value(query(f"max({s.MFU}{{{of_run}}})")),
        gpu_utilisation_pct=_value(query(f"avg({s.GPU_UTIL} and on ({s.GPU_NODE_LABEL}) {nodes})")),
    )


def _against(value: float | None, plan: float | None, fmt: str) -> str:
    if value is None:
        return "-"
    text = format(value, fmt)
    return f"{text} (plan {format(plan, fmt)})" if plan else text


def format_live(figures: LiveFigures | None, plan: PlanPace) -> str:
    if figures is None:
        return "  live: no series of this stack in the metrics source yet"
    step = "-" if figures.step is None else f"{figures.step:,}"
    if figures.max_steps:
        step += f"/{figures.max_steps:,}"
    age = "" if figures.last_step_age_s is None else f", {figures.last_step_age_s:.0f} s ago"
    gpu = figures.gpu_utilisation_pct
    return (
        f"  live ({figures.run}): step {step}{age}; tokens/s "
        f"{_against(figures.tokens_per_second, plan.tokens_per_second, ',.0f')}; MFU "
        f"{_against(figures.mfu, plan.mfu, '.1%')}; GPU utilisation "
        f"{'-' if gpu is None else f'{gpu:.0f}%'}"
    )


def live_text(outputs: Mapping[str, Any], *, stack: str | None, region: str | None,
              plan: PlanPace) -> str:  # fmt: skip
    """The live line(s) for `status`: the figures, or one line saying why there are none."""
    if stack is None:
        return "  live: no stack named, so no series to look for"
    try:
        query = metrics_query(outputs, region=region)
        if query is None:
            return (
                f"  live: no metrics source (set {URL_ENV}, or deploy with observability "
                f"for the {ENDPOINT_OUTPUT} output)"
            )
        return format_live(live_figures(query, stack=stack), plan)
    except MetricsUnreachableError as error:
        return f"  live: metrics source not reachable ({error})"


def stack_live_text(outputs: Mapping[str, Any], stack_file: str | None) -> str:
    """`live_text` for a stack named by its file: the plan's pace and region read from it."""
    if stack_file is None:
        return live_text(outputs, stack=None, region=None, plan=PlanPace(None, None))
    from infra.config import load_stack_file, read_stack_file
    from infra.estimates.run_plan import plan_run
    from infra.job.alert_rules import alert_thresholds

    raw = read_stack_file(stack_file)
    plan = plan_run(load_stack_file(stack_file))
    thresholds = alert_thresholds(plan)
    pace = PlanPace(
        tokens_per_second=thresholds.expected_tokens_per_second,
        mfu=plan.duration.mfu.expected if plan.duration is not None else None,
    )
    region = raw.config.get("aws:region")
    return live_text(
        outputs,
        stack=thresholds.stack,
        region=region if isinstance(region, str) else None,
        plan=pace,
    )
