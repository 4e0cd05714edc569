"""Eight fake CPU devices, set before JAX is imported anywhere in the test process."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The suite is compile-bound (a few steps of tiny models): XLA:CPU's cheaper code generation
# cuts a smoke run's CPU time by ~40% (measured: 18.7 s vs 31.3 s user for a 24-step run
# from a cold compile cache). It changes the machine code, not the HLO the tests inspect;
# results move in the 8th digit (the golden values hold at 1e-6). Child processes get the
# same flags through `subprocess_env`. XLA:CPU's older fusion emitters and one codegen
# thread (the two test workers already fill the two cores) compile faster again: measured
# beside other jobs, tests/test_ensemble.py 56.7 -> 39.4 s of CPU, a 4-step tiny run
# 9.8-11.3 -> 5.3-7.0 s from a cold compile cache, the golden values as close as before.
COMPILE_LIGHT_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
                       " --xla_cpu_use_fusion_emitters=false"
                       " --xla_cpu_parallel_codegen_split_count=1")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {COMPILE_LIGHT_FLAGS}"
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture
def tiny_config():
  from experiments.configs import fashion_mnist

  return fashion_mnist.get_config("tiny")


# Identical programs recur across tests (the smoke model in several methods and runs):
# a persistent compilation cache turns their repeat compiles into cache reads, every one
# of them (tests/test_resume.py from a cold cache: 157 s of CPU with programs over 0.5 s
# cached, 145 s with all).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(REPO, ".pytest_cache", "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def subprocess_env(devices: int, **extra: str) -> dict:
  """The environment of a test's child process: this one's, the compile-light flags, and
  `devices` fake CPU devices (the only device-count flag, so a failure message is plain)."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  flags.append(f"--xla_force_host_platform_device_count={devices}")
  return {**os.environ, "XLA_FLAGS": " ".join(flags), **extra}


def makefile_recipe(target: str) -> str:
  """The recipe of the Makefile's `target`, as written: the lines after its rule up to the
  next blank line, continuation lines joined."""
  with open(os.path.join(REPO, "Makefile")) as f:
    text = f.read().replace("\\\n", " ")
  rule = text[text.index(f"\n{target}:") + 1:]
  return rule[rule.index("\n") + 1:].split("\n\n", 1)[0]


def untimed(tree):
  """A results tree without its host timings (keys ending in time_s or steps_per_s), which
  differ run to run: what two runs of one config must agree on."""
  if isinstance(tree, dict):
    return {k: untimed(v) for k, v in tree.items()
            if not str(k).endswith(("time_s", "steps_per_s"))}
  return [untimed(v) for v in tree] if isinstance(tree, list) else tree


def documented_results_fields() -> set[str]:
  """The top-level results.json fields docs/results_json.md's table documents (its first
  column)."""
  import re

  with open(os.path.join(REPO, "docs", "results_json.md")) as f:
    text = f.read()
  section = text[text.index("## results.json"):]
  section = section[:section.index("\n## ", 1)]
  rows = [line for line in section.splitlines() if line.strip().startswith("| `")]
  return {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}


def assert_documented(results: dict) -> None:
  missing = set(results) - documented_results_fields()
  assert not missing, f"results.json fields missing from docs/results_json.md's table: {sorted(missing)}"


# Test tiers, the markers pytest.ini lists. `make test-fast` runs `unit and not slow`; `make
# test` every tier but `slurm`, which `make test-slurm` runs (CI: both). Each file has a tier;
# EXCEPTIONS names its tests that belong to another.
# A unit test takes a few seconds at most; one that compiles whole sharded steps is integration.
TIERS = {
    "test_communication.py": "integration", "test_config.py": "unit", "test_costs.py": "unit",
    "test_critical_batch.py": "unit", "test_data.py": "unit", "test_data_parallel.py": "integration",
    "test_diloco.py": "integration", "test_distill.py": "unit", "test_divergence.py": "e2e",
    "test_docs.py": "docs", "test_ensemble.py": "integration", "test_eval_cadence.py": "unit",
    "test_fetch.py": "unit", "test_flops.py": "integration", "test_golden.py": "e2e",
    "test_gpt2.py": "unit", "test_hlo.py": "unit", "test_layers.py": "unit", "test_lm.py": "integration",
    "test_microbatches.py": "integration", "test_multihost.py": "subprocess",
    "test_noise_scale.py": "integration", "test_notebooks.py": "docs", "test_optim.py": "unit",
    "test_pools.py": "unit", "test_projection.py": "unit", "test_readme.py": "docs",
    "test_readme_commands.py": "docs", "test_report.py": "unit", "test_resnet.py": "unit",
    "test_resume.py": "e2e", "test_routing.py": "unit", "test_samplers_sweep.py": "e2e",
    "test_sparse.py": "e2e", "test_sweep.py": "e2e", "test_text.py": "unit",
    "test_train.py": "e2e", "test_tuning.py": "unit",
    "test_workload_study.py": "e2e",
    "test_input_pipeline.py": "e2e", "test_demo.py": "unit", "test_balanced_assign.py": "unit", "test_kmeans_balance.py": "unit",
    "test_clusters_build.py": "unit", "test_pools_multihost.py": "subprocess",
    "test_slurm.py": "slurm", "test_launcher.py": "unit",
}
EXCEPTIONS = {  # file -> {test function: tier}
    "test_communication.py": {
        "test_a_child_process_reads_the_same_collectives_as_this_one": "subprocess"},
    "test_config.py": {
        "test_cli_exits_2_on_bad_override": "subprocess",
        "test_cli_reports_a_config_files_syntax_error_as_file_and_line": "subprocess",
        "test_bad_input_on_the_command_line_is_one_line_exit_2_and_no_workdir": "subprocess",
        "test_help_names_the_config_files_their_variants_and_the_schema": "subprocess"},
    "test_critical_batch.py": {"test_smoke_sweep_tunes_on_seed0_then_skips_finished_runs": "e2e"},
    "test_diloco.py": {"test_diloco_needs_a_sync_period": "unit"},
    "test_ensemble.py": {"test_hlo_parser_reads_both_replica_group_formats": "unit",
                         "test_logit_mean_matches_numpy_and_excludes_nan_workers": "unit",
                         "test_soup_without_shared_init_is_refused": "unit",
                         "test_n_not_a_multiple_of_the_worker_axis_is_refused": "unit",
                         "test_ece_of_a_perfectly_calibrated_batch_is_zero": "unit"},
    "test_gpt2.py": {"test_logits_match_hugging_face_reference": "integration",
                     "test_remat_gives_same_loss_and_gradients": "integration",
                     "test_fused_attention_matches_einsum_attention": "integration"},
    "test_data.py": {"test_train_and_evaluate_on_tfds_mock": "e2e",
                     "test_own_images_in_class_folders_train_end_to_end": "e2e"},
    "test_eval_cadence.py": {
        "test_a_jump_past_the_window_is_replayed_to_the_crossing_a_fine_cadence_finds": "e2e"},
    "test_fetch.py": {"test_real_fetch_fashion_mnist": "subprocess"},  # apt-get download
    "test_lm.py": {"test_data_parallel_lm_few_steps": "e2e",
                   "test_ensemble_lm_reports_both_aggregations": "e2e"},
    "test_microbatches.py": {"test_microbatch_sizes_are_checked_before_compiling": "unit",
                             "test_resnet_trains_with_microbatches_through_the_loop": "e2e",
                             "test_gpt2_through_the_loop_equals_the_unsplit_run": "e2e"},
    "test_notebooks.py": {"test_notebook_runs_in_smoke_mode": "subprocess"},
    "test_pools.py": {  # building a pool trains its proxy
        "test_pool_is_built_costed_cached_and_invalidated": "e2e",
        "test_kmeans_pool_trains_routed_experts": "e2e",
        "test_coreset_pools_are_weighted_and_split_disjointly": "e2e",
        "test_pixel_pca_pools_are_routed_clusters_without_a_proxy": "e2e",
        "test_text_pools_are_tfidf_clusters_routed_at_eval": "e2e",
        "test_a_pool_built_before_training_is_read_by_runs_at_other_rates": "e2e",
        "test_a_pool_built_again_by_newer_code_is_retimed_only_if_it_is_the_same": "e2e",
        "test_snip_mask_is_data_driven_and_stays_fixed": "integration",
        "test_soup_averages_weights_and_reestimates_its_own_batchnorm_statistics": "integration",
        "test_weights_enter_the_loss": "integration",
        "test_routed_combine_uses_per_example_weights": "integration"},
    "test_noise_scale.py": {"test_moving_average_is_bias_corrected_and_restorable": "unit"},
    "test_readme_commands.py": {
        "test_readme_command_runs": "subprocess",
        "test_the_smoke_run_learns_and_prints_nothing_it_cannot_act_on": "subprocess"},
    "test_report.py": {"test_tables_and_pngs_from_json": "e2e"},  # every table and figure
    "test_resnet.py": {"test_resnet18_small_stem_fashion_mnist_forward": "integration"},
    "test_resume.py": {"test_kill_9_at_random_steps_then_resume_is_bit_identical": "subprocess",
                       "test_a_stop_request_checkpoints_exits_then_resumes_identically":
                           "subprocess"},
    "test_routing.py": {
        "test_per_position_routing_falls_back_per_position": "integration",
        "test_excluded_routed_experts_fall_back_to_the_healthy_workers": "integration"},
    "test_sweep.py": {
        "test_the_study_on_two_processes_matches_one": "subprocess",
        "test_program_fingerprint_ignores_source_locations_and_scalar_constants": "unit",
        "test_the_many_worker_grid_uses_what_the_committed_grid_tuned_at_n8": "unit",
        "test_sweeps_keep_compiled_programs_unless_the_environment_names_a_cache": "unit"},
    "test_workload_study.py": {
        "test_every_grid_point_and_variant_is_a_valid_config": "unit",
        "test_plan_has_a_quiet_phase_one_line_per_point_and_the_report": "unit",
        "test_make_without_its_data_exits_2_naming_what_it_needs": "subprocess"},
    "test_train.py": {"test_metric_writer_does_not_import_torch": "subprocess"},
    "test_launcher.py": {"test_a_local_study_does_not_import_submitit": "subprocess"},
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
  for item in items:
    file = item.path.name
    if file not in TIERS:
      raise pytest.UsageError(f"{file} has no tier: add it to TIERS in tests/conftest.py")
    stale = [name for name in EXCEPTIONS.get(file, {}) if not hasattr(item.module, name)]
    if stale:
      raise pytest.UsageError(f"EXCEPTIONS in tests/conftest.py names tests {file} lacks: {stale}")
    tier = EXCEPTIONS.get(file, {}).get(item.originalname, TIERS[file])
    item.add_marker(getattr(pytest.mark, tier))
  # Heaviest files first (a stable sort: each file's tests keep their order).
  items.sort(key=lambda item: HEAVIEST_FIRST.get(item.path.name, len(HEAVIEST_FIRST)))


# `make test` hands whole files to its two workers (--dist loadfile), the next file to the
# first worker nearly done with its own. Longest first, the two end close together; in
# xdist's default order (most tests first) a long file drawn last ran alone for minutes.
# The order: each file's measured time (the heaviest first), as of the 8-minute goal.
HEAVIEST_FIRST = {name: rank for rank, name in enumerate([
    "test_resume.py", "test_sweep.py", "test_readme_commands.py", "test_microbatches.py",
    "test_pools.py", "test_workload_study.py", "test_ensemble.py", "test_config.py",
    "test_train.py", "test_notebooks.py", "test_critical_batch.py", "test_multihost.py",
    "test_pools_multihost.py",
    "test_lm.py", "test_samplers_sweep.py", "test_data.py", "test_communication.py",
    "test_eval_cadence.py", "test_diloco.py", "test_gpt2.py", "test_flops.py",
    "test_golden.py"])}


def pytest_configure(config):
  if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order above
    config.option.loadscopereorder = False


def free_port() -> int:
  """A localhost port nothing listens on, for a test's JAX coordinator."""
  import socket

  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def run_processes(commands: list[list[str]], env: dict, log_prefix: str,
                  timeout_s: float) -> None:
  """Runs one command per process of a multi-controller job, to its end; fails the test
  with each process's log tail if any fails or the job outlasts `timeout_s`. Logs go to
  files (`<log_prefix>.<i>.log`), not pipes: gloo and XLA log a lot."""
  import subprocess

  logs = [open(f"{log_prefix}.{i}.log", "w") for i in range(len(commands))]
  procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
           for cmd, log in zip(commands, logs)]
  try:
    codes = [p.wait(timeout=timeout_s) for p in procs]
  except subprocess.TimeoutExpired:
    codes = None
  finally:
    for p in procs:  # one dead process leaves the others waiting on the coordinator
      if p.poll() is None:
        p.kill()
        p.wait()
    for log in logs:
      log.close()
  if codes is None or any(codes):
    tails = "\n".join(f"--- process {i} (exit {p.returncode}) ---\n"
                      + open(f"{log_prefix}.{i}.log").read()[-3000:]
                      for i, p in enumerate(procs))
    pytest.fail(f"{' '.join(commands[0])} failed or timed out after {timeout_s}s:\n{tails}")


def pca_routed_config(**distill):
  """Tiny Fashion-MNIST PCA-routed experts (4 workers, 3,000 images), `distill` overrides."""
  from experiments.configs import fashion_mnist

  c = fashion_mnist.get_config("ensemble,tiny")
  c.method.num_workers = 4
  c.method.aggregation = "routed,logits"
  c.data.train_examples = 3000
  c.eval.num_examples = 300
  c.distill.method, c.distill.embedding, c.distill.pca_dim = "kmeans", "pca", 16
  for k, v in distill.items():
    c.distill[k] = v
  return c
