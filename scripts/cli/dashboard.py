"""`fsdp-eks dashboard`: the run's Grafana dashboard as a file, and opened where it is served.

Rendered from the stack file through the run plan (`infra.job.dashboard`), so the file needs no
cluster; `--open` follows `observability.grafana` (`infra.job.grafana`): a port-forward to the
in-cluster Grafana, the managed workspace's URL, or the file itself.
Each way: docs/design/cli.md#dashboard
"""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING

import click

from scripts.cli.support.errors import CliError, CommandFailedError
from scripts.cli.support.stacks import stack_arguments

if TYPE_CHECKING:
    from infra.job.grafana import GrafanaPlan

DEFAULT_FOLDER = Path(".fsdp-eks") / "dashboards"


def import_steps(path: Path) -> str:
    """What to do with the file, in a few lines."""
    return "\n".join(
        [
            f"dashboard -> {path}",
            "import it: Grafana > Dashboards > New > Import > Upload dashboard JSON file, then",
            "pick the Prometheus data source that reads the run's metrics:",
            "  Amazon Managed Prometheus: a Prometheus data source on the workspace's query URL",
            "    with SigV4 auth (Grafana's Prometheus data source, 'SigV4 auth' on, service aps)",
            "  a cluster's own Prometheus: its URL, e.g. through kubectl port-forward",
        ]
    )


def _show(url: str) -> None:
    """The browser (`webbrowser`, which honours $BROWSER), or the URL to open by hand."""
    if not webbrowser.open(url):
        click.echo("no browser to open here: open the URL above yourself")


@click.command()
@stack_arguments()
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Where to write the JSON (default: {DEFAULT_FOLDER}/<stack>.json).",
)
@click.option(
    "--open",
    "open_it",
    is_flag=True,
    help="Open the dashboard: the stack's in-cluster Grafana (port-forward until Ctrl-C), its "
    "Amazon Managed Grafana workspace, or else the file.",
)
@click.option(
    "--context",
    help="A kubectl context of yours for the port-forward instead of the stack's cluster.",
)
def dashboard(stack: str, out: Path | None, open_it: bool, context: str | None) -> int:
    """Write a run's Grafana dashboard (JSON); with --open, show it where it is served.

    \b
        fsdp-eks dashboard llama31-8b-p5
        fsdp-eks dashboard llama31-8b-p5 --open
        fsdp-eks dashboard llama31-8b-p5 -o run.json
    """
    from infra.config import load_stack_file
    from infra.config.names import stack_name
    from infra.estimates.run_plan import plan_run
    from infra.job.dashboard import stack_dashboard
    from infra.job.grafana import grafana_plan

    name = stack_name(stack)
    plan = plan_run(load_stack_file(stack))
    path = out or DEFAULT_FOLDER / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(stack_dashboard(plan) + "\n")
    where = grafana_plan(plan)
    if open_it and where.mode == "in-cluster":
        click.echo(f"dashboard -> {path}")
        return _open_in_cluster(stack, name, where, context)
    if open_it and where.mode == "managed":
        assert where.workspace_url is not None
        url = where.workspace_url + where.dashboard_path
        click.echo(f"dashboard -> {path} (import it into the workspace once)")
        click.echo(f"open: {url}")
        _show(url)
        return 0
    click.echo(import_steps(path))
    if open_it:
        click.launch(str(path))
    return 0


def _open_in_cluster(stack: str, name: str, where: GrafanaPlan, context: str | None) -> int:
    """Port-forward to the stack's Grafana, open the dashboard, hold until Ctrl-C: through
    `--context`, else the kubeconfig `pulumi up` signs with (the stack's cluster)."""
    if context is not None:
        return _hold(["--context", context], f"kubectl --context {context}", where)
    from scripts.cli.support.kube import stack_cluster_access
    from scripts.cli.support.port_forward import kubeconfig_file
    from scripts.cli.support.pulumi import stack_outputs

    outputs = stack_outputs(name)
    cluster = outputs.get("clusterName")
    if not isinstance(cluster, str) or (outputs.get("grafana") or {}).get("mode") != "in-cluster":
        raise CliError(
            f"stack {name!r} has no in-cluster Grafana deployed: run `pulumi up -s {name}` "
            "first (or pass --context CONTEXT for a cluster of yours)"
        )
    document, _ = stack_cluster_access(stack, cluster)
    update = (outputs.get("kubectl") or {}).get("updateKubeconfig")
    with kubeconfig_file(document) as kubeconfig:
        return _hold(["--kubeconfig", str(kubeconfig)], "kubectl", where, update)


def _hold(
    access: list[str], kubectl: str, where: GrafanaPlan, update_kubeconfig: str | None = None
) -> int:
    from infra.job.grafana import ADMIN_PASSWORD_KEY, ADMIN_USER, RELEASE_NAME, SERVICE_PORT
    from scripts.cli.support.port_forward import free_port, port_forward

    port = free_port()
    with port_forward(
        access,
        namespace=where.namespace,
        service=RELEASE_NAME,
        local_port=port,
        remote_port=SERVICE_PORT,
    ) as process:
        url = f"http://127.0.0.1:{port}{where.dashboard_path}"
        click.echo(
            f"grafana: 127.0.0.1:{port} -> {where.namespace}/{RELEASE_NAME}:{SERVICE_PORT} "
            "(kubectl port-forward; Ctrl-C stops it)"
        )
        click.echo(f"open: {url}")
        click.echo(
            f"sign in as {ADMIN_USER}; the password: {kubectl} -n {where.namespace} get secret "
            f"{RELEASE_NAME} -o jsonpath='{{.data.{ADMIN_PASSWORD_KEY}}}' | base64 -d"
        )
        if update_kubeconfig:
            click.echo(f"  (kubectl on this cluster: {update_kubeconfig})")
        try:  # Ctrl-C while the browser opens is a stop too
            _show(url)
            code = process.wait()
        except KeyboardInterrupt:
            click.echo("port-forward stopped")
            return 0
    raise CommandFailedError(f"kubectl port-forward stopped by itself (exit {code})")
