"""The rules that tie `job.api` to the cluster: what a TrainJob needs, refused at plan time.

A TrainJob runs only where Kubeflow Trainer v2 (its CRDs, its controller and JobSet) runs: a
created cluster gets it from the stack (`infra.platform.kubeflow_trainer`), an existing one must
say it has it (`cluster.trainerV2`), since the stack installs nothing there. Keys that only mean
something for one API are refused with the other, so a stack never carries a setting that is
silently ignored.
"""

from __future__ import annotations

from infra.config.addons import AddonsConfig
from infra.config.cluster import ClusterConfig
from infra.config.job import JobConfig

TRAINER_V2_CHECK = "kubectl get crd trainjobs.trainer.kubeflow.org"
"""How a person checks that a cluster serves TrainJobs (the CRD Trainer v2's chart installs)."""


POD_NAME_MAX_LENGTH = 63
JOBSET_POD_SUFFIX = len("-node-0-") + len("-abcde")
"""What JobSet adds to the job's name in a pod's name, beside the node index: jobset v0.12.0
`pkg/webhooks/jobset_webhook.go` refuses a JobSet whose longest pod name would pass 63."""


def job_api_problems(
    job: JobConfig, cluster: ClusterConfig, addons: AddonsConfig, *, nodes: int = 1
) -> list[str]:
    """One line per key that cannot work with `job.api`, each naming the key."""
    problems: list[str] = []
    trainjob = job.api == "trainjob"
    name = job.name or ""
    longest = POD_NAME_MAX_LENGTH - JOBSET_POD_SUFFIX - len(str(max(nodes - 1, 0)))
    if trainjob and len(name) > longest:
        problems.append(
            f"job.name {name!r} ({len(name)} characters) is too long for a TrainJob of "
            f"{nodes} nodes: JobSet's pod names `<name>-node-0-<index>-<5>` must stay within "
            f"{POD_NAME_MAX_LENGTH} characters, so at most {longest}; set a shorter job.name"
        )
    if trainjob and cluster.mode == "existing" and cluster.trainer_v2 is not True:
        problems.append(
            "job.api 'trainjob' on an existing cluster needs Kubeflow Trainer v2 there (the "
            "stack installs nothing on it): check with "
            f"`{TRAINER_V2_CHECK}` (and that the trainer and jobset controllers run), then "
            "set cluster.trainerV2: true; or use job.api: pytorchjob"
        )
    if cluster.trainer_v2 is not None and cluster.mode == "create":
        problems.append(
            "cluster.trainerV2 is only read in cluster.mode 'existing'; in create mode the stack "
            "installs Trainer v2 itself when job.api is 'trainjob': remove it"
        )
    elif cluster.trainer_v2 is not None and not trainjob:
        problems.append(
            f"cluster.trainerV2 is only read with job.api 'trainjob' (here {job.api!r}): "
            "remove it, or set job.api: trainjob"
        )
    if trainjob and job.clean_pod_policy != "Running":
        # JobSet deletes a finished JobSet's active Jobs, and their pods with them (jobset
        # v0.12.0 `pkg/controllers/jobset_controller.go` `reconcile`): `Running`, fixed.
        problems.append(
            f"job.cleanPodPolicy {job.clean_pod_policy!r} has no TrainJob counterpart: JobSet "
            "deletes a finished run's running pods and keeps the rest; allowed with job.api "
            "'trainjob': Running (or leave it out)"
        )
    if trainjob and "ttl_hours_after_finished" in job.model_fields_set:
        problems.append(
            "job.ttlHoursAfterFinished is not used with job.api 'trainjob': Kubeflow Trainer "
            "v2.3.0 would start a failed run again once its JobSet is deleted (kubeflow/trainer"
            "#3779), so the finished JobSet stays until `pulumi destroy`: remove it"
        )
    if trainjob and addons.training_operator.model_fields_set:
        problems.append(
            "addons.trainingOperator is not used with job.api 'trainjob' (a TrainJob runs on "
            "Kubeflow Trainer v2, not the v1 training operator): remove it"
        )
    return problems
