"""`fsdp-eks dashboard`: the run's Grafana dashboard as a file, and how to open it.

The dashboard is rendered from the stack file through the run plan (`infra.job.dashboard`,
the same JSON the program exports as the `dashboard` output), so it needs no cluster and no
deployed stack. It is written to a file and imported into a Grafana that can read the run's
Prometheus: no Grafana is installed and no Amazon Managed Grafana workspace is made, because
AMG signs users in only through IAM Identity Center or SAML (AMG user guide,
"authentication-in-AMG"), single sign-on this project must not require.
"""

from __future__ import annotations

from pathlib import Path

import click

from scripts.cli.support.stacks import stack_arguments

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


@click.command()
@stack_arguments()
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Where to write the JSON (default: {DEFAULT_FOLDER}/<stack>.json).",
)
@click.option("--open", "open_file", is_flag=True, help="Open the file once written.")
def dashboard(stack: str, out: Path | None, open_file: bool) -> int:
    """Write a run's Grafana dashboard (JSON) and say how to import it.

    \b
        fsdp-eks dashboard llama31-8b-p5
        fsdp-eks dashboard llama31-8b-p5 -o run.json --open
    """
    from infra.config import load_stack_file
    from infra.config.names import stack_name
    from infra.estimates.run_plan import plan_run
    from infra.job.dashboard import stack_dashboard

    name = stack_name(stack)
    document = stack_dashboard(plan_run(load_stack_file(stack)))
    path = out or DEFAULT_FOLDER / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document + "\n")
    click.echo(import_steps(path))
    if open_file:
        click.launch(str(path))
    return 0
