"""`dev.py test --fast` leaves out `slow` tests (multi-process runs: one started unmarked fails
here, by name, as tests/conftest.py records each test's marks) and `long` ones (LONG_TESTS)."""

from __future__ import annotations

import os

TIER_ENV = "FSDP_EKS_TEST_SLOW"
"""Set by tests/conftest.py before each test's setup: 1 when it is marked `slow`, else 0."""


_LONG_BY_FILE: dict[str, tuple[str, ...]] = {
    "tests/cli/test_dashboard.py": (
        "test_open_port_forwards_to_the_stacks_grafana_until_ctrl_c",
        "test_open_reaches_the_stacks_own_cluster_as_pulumi_up_does",
    ),
    "tests/cli/test_docs_commands.py": (
        "test_a_documented_offline_command_runs[fsdp-eks plan --time --all --repeats 5]",
        "test_a_documented_offline_command_runs[fsdp-eks plan dev]",
    ),
    "tests/cli/test_live_metrics.py": (
        "test_a_stack_without_series_says_so",
        "test_status_prints_one_line_against_the_plan",
        "test_the_live_figures_are_the_runs_as_prometheus_sees_them",
    ),
    "tests/cli/test_local_truth.py": ("test_plot_s_default_figure_is_not_the_rehearsal_s",),
    "tests/cli/test_ls_down_doctor.py": (
        "test_ls_reads_deployed_runs_from_their_outputs_and_metrics",
    ),
    "tests/cli/test_main.py": (
        "test_an_aws_refusal_is_a_failure",
        "test_checkpoints_list_and_a_parallel_download",
        "test_logs_need_no_kubectl",
        "test_plan_all_plans_every_stack",
        "test_plot_of_a_local_metrics_file",
        "test_status_and_logs_through_the_stack_selected_in_pulumi",
        "test_tensorboard_fetches_the_events_and_names_the_missing_server",
        "test_validate_reaches_the_stacks_cluster_and_its_failure_is_one_line",
    ),
    "tests/cli/test_ops.py": (
        "test_checkpoints_command_list_and_download",
        "test_ops_commands_reach_the_stacks_cluster_not_the_current_context",
        "test_plot_command_reads_the_metrics_file_from_s3",
    ),
    "tests/cli/test_plan.py": (
        "test_plan_of_a_stack_breaking_a_guardrail_names_it_and_fails",
        "test_plan_of_every_stack",
    ),
    "tests/cli/test_plan_cache.py": (
        "test_a_kept_plan_shows_the_path_it_was_asked_by",
        "test_an_unchanged_stack_is_shown_again_without_evaluating",
    ),
    "tests/cli/test_plan_truth.py": (
        "test_a_checkpoint_cadence_beyond_the_last_step_is_said",
        "test_fp32_is_timed_at_the_fp32_peak",
        "test_gpus_left_idle_on_a_node_are_said_with_the_bill",
        "test_offline_placeholders_are_labelled_in_the_verbose_plan",
        "test_the_dev_plan_s_figures_read_as_short_lines",
    ),
    "tests/cli/test_stack_file_mistakes.py": ("test_the_offline_plan_follows_the_stacks_region",),
    "tests/infra/test_alert_rules.py": ("test_each_alert_fires_on_its_series_and_only_there",),
    "tests/infra/test_autoscaler.py": (
        "test_a_warm_group_keeps_its_nodes_and_pulumi_owns_its_size",
        "test_the_autoscaler_may_scale_the_gpu_group_and_nothing_else",
    ),
    "tests/infra/test_capacity_block.py": (
        "test_the_program_looks_the_block_up_before_registering_anything",
    ),
    "tests/infra/test_cluster.py": (
        "test_no_profile_no_profile_flag_and_the_admin_role_is_not_assumed_by_itself",
    ),
    "tests/infra/test_config.py": (
        "test_program_reads_every_key_the_language_host_passes_in_the_environment",
        "test_secret_token_is_accepted_and_never_plaintext_in_the_job",
        "test_the_spy_sees_registrations_of_a_valid_config",
        "test_valid_base_config_evaluates",
    ),
    "tests/infra/test_engine_layout.py": (
        "test_the_entry_point_reports_a_bad_stack_as_one_run_error",
        "test_the_provider_process_unpickles_the_image_build_provider",
    ),
    "tests/infra/test_flag_table.py": (
        "test_a_new_flag_with_a_stack_key_needs_only_its_row_in_the_trainer",
    ),
    "tests/infra/test_grafana.py": ("test_a_managed_workspace_installs_nothing_and_is_the_output",),
    "tests/infra/test_hardening.py": (
        "test_every_shipped_stack_that_creates_a_cluster_says_who_reaches_its_endpoint[llama32-1b-g5-trainjob]",
    ),
    "tests/infra/test_image.py": ("test_tag_changes_with_build_settings_only",),
    "tests/infra/test_image_build.py": (
        "test_a_failure_in_our_own_commands_is_not_retried",
        "test_a_running_build_of_the_same_tag_is_awaited_not_duplicated[src-another-image-2]",
        "test_every_unsuccessful_end_state_fails[TIMED_OUT]",
        "test_log_tail_without_a_stream_says_so",
        "test_provider_create_fails_with_the_log_tail",
        "test_provider_create_then_update_rebuilds_only_for_a_new_tag",
        "test_provider_delete_leaves_images_alone",
        "test_start_build_sends_the_source_and_the_content_tag",
        "test_start_poll_success_reports_the_registry_digest",
        "test_success_without_the_pushed_tag_is_an_error",
    ),
    "tests/infra/test_job_watch.py": ("test_the_provider_process_unpickles_the_watch_provider",),
    "tests/infra/test_kueue.py": ("test_the_program_installs_kueue_before_the_job",),
    "tests/infra/test_manifest_scanners.py": (
        "test_a_root_container_outside_the_allow_list_is_reported",
        "test_checkov_finds_nothing_outside_the_allow_list",
        "test_checkov_scanned_every_stack_and_the_trainer_pods",
        "test_every_allow_list_entry_still_fires",
        "test_every_object_is_valid_for_its_cluster_version_in_strict_mode",
    ),
    "tests/infra/test_network.py": ("test_a_reservations_az_is_used_without_an_offerings_check",),
    "tests/infra/test_policy.py": (
        "test_every_experiment_program_passes_the_guardrails[Pulumi.dev]",
        "test_every_experiment_program_passes_the_guardrails[Pulumi.llama2-7b-p4d]",
        "test_every_experiment_program_passes_the_guardrails[Pulumi.llama31-8b-p5]",
        "test_every_experiment_program_passes_the_guardrails[Pulumi.llama32-1b-g5-trainjob]",
        "test_every_experiment_program_passes_the_guardrails[Pulumi.llama32-1b-g5]",
        "test_every_experiment_program_passes_the_guardrails[Pulumi.mixtral-8x7b-p5]",
        "test_the_compliant_stack_passes_every_guardrail",
        "test_the_guardrails_see_the_programs_gpu_nodes_and_job[Pulumi.mixtral-8x7b-p5]",
        "test_the_pack_as_the_readme_runs_it_passes_every_experiment[Pulumi.dev]",
        "test_the_pack_as_the_readme_runs_it_passes_every_experiment[Pulumi.llama2-7b-p4d]",
        "test_the_pack_as_the_readme_runs_it_passes_every_experiment[Pulumi.llama31-8b-p5]",
        "test_the_pack_as_the_readme_runs_it_passes_every_experiment[Pulumi.llama32-1b-g5-trainjob]",
        "test_the_pack_as_the_readme_runs_it_passes_every_experiment[Pulumi.llama32-1b-g5]",
        "test_the_pack_as_the_readme_runs_it_passes_every_experiment[Pulumi.mixtral-8x7b-p5]",
        "test_the_pack_as_the_readme_runs_it_passes_every_experiment[Pulumi.team-cluster]",
    ),
    "tests/infra/test_precision.py": ("test_the_plan_shows_the_precision",),
    "tests/infra/test_stacks.py": (
        "test_a_gated_tokenizer_without_hf_token_stops_the_program_naming_hf_token",
        "test_stack_job_is_valid_for_the_operator[dev]",
        "test_stack_job_is_valid_for_the_operator[llama2-7b-p4d]",
        "test_stack_job_is_valid_for_the_operator[llama31-8b-p5]",
        "test_stack_job_matches_its_config[dev]",
        "test_stack_job_matches_its_config[llama2-7b-p4d]",
        "test_stack_job_matches_its_config[llama31-8b-p5]",
        "test_stack_job_matches_its_config[llama32-1b-g5]",
    ),
    "tests/infra/test_stop_start_ssa.py": (
        "test_an_unchanged_up_leaves_a_stopped_run_stopped[False]",
    ),
    "tests/infra/test_trainjob_manifest.py": (
        "test_a_wrong_field_fails_the_schema",
        "test_the_objects_validate_against_trainer_v2_3_crds",
    ),
    "tests/infra/test_trainjob_stack.py": ("test_its_objects_validate_against_the_pinned_crds",),
    "tests/infra/test_validate_cluster.py": (
        "test_gpu_check_collects_every_pods_log",
        "test_nccl_check_reads_worker_0_and_fails_a_failed_job",
    ),
    "tests/infra/test_validate_trainjob.py": (
        "test_the_nccl_check_is_a_trainjob_valid_for_the_pinned_crds",
    ),
    "tests/test_architecture.py": (
        "test_no_module_imports_itself_back",
        "test_pure_wings_pull_in_no_pulumi_and_no_ml_framework_when_imported",
    ),
    "tests/test_comment_length.py": (
        "test_docstrings_and_comment_blocks_stay_short_where_essays_moved_to_docs",
    ),
    "tests/test_crd_schema_tool.py": (
        "test_every_stored_schema_is_reduced_and_has_its_source_listed",
    ),
    "tests/trainer/test_bench_trainer.py": (
        "test_bench_plain_loop_and_emulated_fp8_on_cpu",
        "test_bench_tiny_on_cpu_reports_consistent_figures",
    ),
    "tests/trainer/test_checkpoint.py": (
        "test_a_full_disk_is_one_error_naming_the_file_and_the_cause",
        "test_a_hang_exits_only_once_the_upload_in_flight_is_durable",
        "test_round_trip_fsdp2_gloo_world_of_one_continues_identically[upload-process]",
        "test_staging_buffers_are_made_once_and_shards_written_by_another_process",
        "test_tied_llama_saved_with_activation_checkpointing_resumes_without_it",
    ),
    "tests/trainer/test_checkpoint_s3.py": (
        "test_a_failed_upload_is_one_error_naming_the_object_and_the_cause",
        "test_an_unreadable_checkpoint_is_set_aside_by_copy_not_deleted",
        "test_asynchronous_save_fsdp2_gloo_holds_the_step_it_was_given",
        "test_crash_mid_save_leaves_the_previous_checkpoint_as_latest",
        "test_keep_last_prunes_oldest_and_crashed_saves",
    ),
    "tests/trainer/test_config.py": ("test_entry_point_rejects_a_bad_flag_before_loading_torch",),
    "tests/trainer/test_data.py": (
        "test_epochs_are_reshuffled_from_the_seed",
        "test_every_document_is_whole_and_followed_by_eos",
        "test_held_out_validation_is_disjoint_from_training",
        "test_read_ahead_gives_the_same_batches_and_exact_states",
        "test_resume_continues_with_the_next_batch_across_epochs",
        "test_resume_of_a_save_to_disk_dataset_with_held_out_data",
        "test_validation_is_deterministic_and_equally_long_on_every_rank",
    ),
    "tests/trainer/test_garbage.py": (
        "test_the_entry_point_imports_torch_with_the_collector_held",
        "test_the_trainer_collects_at_its_due_steps_and_after_a_rollback_only",
    ),
    "tests/trainer/test_host_syncs.py": (
        "test_a_rollback_is_decided_on_the_device_and_read_at_the_next_logging_step",
        "test_a_spike_on_a_checkpoint_step_that_does_not_log_is_judged_before_the_save",
        "test_a_stop_after_a_spiked_step_stops_with_the_last_good_checkpoint",
        "test_only_logging_steps_sync",
    ),
    "tests/trainer/test_loss.py": (
        "test_many_slices_do_not_round_the_head_gradient_more_in_bf16",
        "test_same_loss_and_gradients_as_hugging_face[1]",
        "test_the_chunked_loss_needs_a_sixth_of_the_memory_at_the_8b_size",
        "test_the_trainer_trains_the_same_with_either_loss",
    ),
    "tests/trainer/test_main.py": ("test_missing_dataset_is_one_line_naming_the_flag",),
    "tests/trainer/test_memory_tracer.py": ("test_tiny_full_sharding_matches_the_tracer",),
    "tests/trainer/test_models.py": (
        "test_compile_wraps_each_decoder_layer_keeping_checkpoint_keys",
    ),
    "tests/trainer/test_quiet_imports.py": ("test_importing_the_trainer_is_silent",),
    "tests/trainer/test_step_ops.py": (
        "test_keeping_gathered_weights_casts_each_parameter_once_per_step",
        "test_the_trainer_does_the_matmul_work_of_the_plain_loop_and_no_more",
    ),
}
LONG_TESTS = frozenset(f"{path}::{name}" for path, names in _LONG_BY_FILE.items() for name in names)
"""Single-process tests of about a second or more in the fast tier on two workers (junit times,
docs/benchmarks.md); a function's id covers its parameters. Every module a test imports keeps
a fast test that imports it (tests/test_tiers.py)."""


FIRST_FILES: tuple[str, ...] = (
    "tests/trainer/test_train_faults_torchrun.py",
    "tests/trainer/test_train_torchrun.py",
    "tests/trainer/test_float8_torchrun.py",
    "tests/test_local_run.py",
    "tests/trainer/test_memory_tracer.py",
    "tests/trainer/test_launch.py",
    "tests/trainer/test_bench_trainer.py",
    "tests/infra/test_rendezvous.py",
)
"""The files of the most worker-seconds in the whole suite, longest first (docs/benchmarks.md
"Test suite"): handed to pytest-xdist's workers before the rest, so that no worker is still in
one of them when the others have run out of files (longest-first scheduling). The faults file
opens with tests that do not read the shared reference run, which the second file makes."""


def first_files_first(nodeids: list[str]) -> list[int]:
    """The order to run tests in: FIRST_FILES' tests in that order, then the others as
    collected. A stable sort, so each file's tests keep their own order."""
    rank = {path: i for i, path in enumerate(FIRST_FILES)}
    return sorted(
        range(len(nodeids)),
        key=lambda i: rank.get(nodeids[i].split("::", 1)[0], len(FIRST_FILES)),
    )


def is_long(nodeid: str) -> bool:
    """Listed in LONG_TESTS by its own id or by its function's (the id without parameters)."""
    return nodeid in LONG_TESTS or nodeid.split("[", 1)[0] in LONG_TESTS


def require_slow_tier(what: str) -> None:
    """Called where a test starts a multi-process run (torchrun, a local rehearsal)."""
    if os.environ.get(TIER_ENV) == "0":
        test = os.environ.get("PYTEST_CURRENT_TEST", "this test").rsplit(" (", 1)[0]
        raise AssertionError(
            f"{test} starts {what}: mark it @pytest.mark.slow (the fast tier leaves those out)"
        )
