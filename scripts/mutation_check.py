"""Break one guarded behaviour at a time and confirm the tests that guard it fail.

Each mutation is a one-line change to the package, applied on a scratch copy of the
work tree (the checkout itself is never touched); the tests named for it then run
against that copy. A mutation is *caught* when those tests fail, *missed* when they
pass (the tests guard nothing). The unmutated copy runs the same tests first
(``--baseline``, on by default) so a test that fails anyway is not mistaken for a
catch.

    python scripts/mutation_check.py                 # every mutation
    python scripts/mutation_check.py --only resume    # names containing "resume"
    python scripts/mutation_check.py --list
    python scripts/mutation_check.py --jobs 2         # two mutations at a time
    python scripts/mutation_check.py --rotation       # this commit's third, plus the touched ones (CI)

Exit code 0 when every mutation is caught, 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest node ids / paths, relative to the repository root
    why: str


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "milo-resume-off", "milo_ray/milo/loop.py",
        "resumed = self.ctx.resumed and await self.replay()", "resumed = False",
        ("tests/milo/test_resume.py",),
        "a resumed MILO run starts over instead of replaying its events",
    ),
    Mutation(
        "ssr-resume-off", "milo_ray/ssr/loop.py",
        "self.out = StoreWriter(self.store, resumed=bool(ctx.resumed))",
        "self.out = StoreWriter(self.store, resumed=False)",
        ("tests/ssr/test_ssr_resume.py",),
        "a resumed SSR run writes its rows again",
    ),
    Mutation(
        "ssr-events-written-twice", "milo_ray/ssr/loop.py",
        "write_once=bool(ctx.resumed))", "write_once=False)",
        ("tests/ssr/test_ssr_resume.py",),
        "a resumed SSR run stores its re-walked decisions a second time",
    ),
    Mutation(
        "event-int-keys-lost", "milo_ray/search/events.py",
        "    if tp is int:\n        return int(k)", "    if False:\n        return int(k)",
        ("tests/search/test_events_before_the_shared_log.py", "tests/milo/test_state.py"),
        "stored events decode int-keyed dicts (islands, assignments) with string keys",
    ),
    Mutation(
        "milo-harness-rows-unkeyed", "milo_ray/milo/loop.py",
        "HarnessRecorder(self.store, key=node_row_key, resumed=bool(ctx.resumed))",
        "HarnessRecorder(self.store, key=node_row_key, resumed=False)",
        ("tests/milo/test_resume.py::test_a_resumed_run_keeps_one_harness_row_per_node_and_unplaced_seed",),
        "a resumed MILO run writes the harnesses rows of its recorded nodes again",
    ),
    Mutation(
        "solver-calls-unrecorded", "milo_ray/execution/scheduler.py",
        "                    self.agent_calls.record_rollout_calls(res)", "                    pass",
        ("tests/execution/test_agent_executor.py::test_scheduler_records_tokens_in_rollouts_and_agent_calls_and_survives_a_dead_endpoint",),
        "a real rollout's model calls never reach the agent_calls table",
    ),
    Mutation(
        "agent-time-cap-off", "milo_ray/boundary/harness_process/host.py",
        "done, _ = await asyncio.wait({reader, stop}, timeout=agent_cap_s,",
        "done, _ = await asyncio.wait({reader, stop}, timeout=None,",
        ("tests/execution/test_agent_executor.py::test_model_slower_than_the_agent_cap_times_out_and_the_workspace_is_graded",),
        "a real agent run is not stopped at the task's agent timeout",
    ),
    Mutation(
        "sandbox-network-shared", "milo_ray/boundary/sandbox/bwrap_mounts.py",
        "            if self.spec.allow_internet:\n                argv.remove(\"--unshare-net\")",
        "            if True:\n                argv.remove(\"--unshare-net\")",
        ("tests/boundary/sandbox/test_bwrap.py::test_the_hosts_loopback_is_unreachable_with_or_without_internet",),
        "the bwrap sandbox lets agent commands reach the network",
    ),
    # The trust boundary (tests/security): each guard of the harness process and the gateway.
    Mutation(
        "harness-env-leaks-keys", "milo_ray/boundary/harness_process/host.py",
        '"model": model, "workdir": self.sandbox.spec.workdir, "env": self.sandbox.env,',
        '"model": model, "workdir": self.sandbox.spec.workdir, "env": {**os.environ, **self.sandbox.env},',
        ("tests/security/test_harness_boundary.py::test_no_key_in_the_environment_or_the_chat_model",),
        "the harness process's commands get the worker's environment, keys included",
    ),
    Mutation(
        "sandbox-runs-as-root", "milo_ray/boundary/sandbox/bwrap.py",
        "        self.owner = self._lease.owner if self._lease is not None else None",
        "        self.owner = None",
        ("tests/security/test_harness_boundary.py::test_root_only_host_files_are_unreadable",),
        "the sandbox runs the harness as root, which reads root-only host files",
    ),
    Mutation(
        "grading-in-the-agents-sandbox", "milo_ray/execution/agent_executor.py",
        '        workspace = getattr(sandbox, "workspace_dir", None)',
        "        workspace = None",
        ("tests/security/test_harness_boundary.py::test_reward_tampering_does_not_reach_the_verifier",),
        "the verifier runs in the agent's sandbox, where the agent planted hooks",
    ),
    Mutation(
        "gateway-token-outlives-rollout", "milo_ray/boundary/gateway/ledger.py",
        "            if self.ended:\n", "            if False:\n",
        ("tests/security/test_gateway.py::test_an_ended_grant_admits_no_call_whatever_socket_the_call_came_on",
         "tests/security/test_harness_boundary.py::test_a_token_used_after_its_rollout_is_refused"),
        "the gateway forwards calls of a rollout that has ended",
    ),
    Mutation(
        "gateway-call-cap-off", "milo_ray/boundary/gateway/ledger.py",
        "            if self.call_cap is not None and len(self.calls) + self.in_flight >= self.call_cap:",
        "            if False:",
        ("tests/security/test_harness_boundary.py::test_a_harness_looping_on_the_model_stops_at_the_call_cap",),
        "a harness looping on the model is bounded by nothing but the time cap",
    ),
    Mutation(
        "harness-tokens-trusted", "milo_ray/execution/agent_executor.py",
        "        calls = list(grant.calls)",
        "        calls = [{'model': None, 'started_at': 0.0, 'finished_at': 0.0, 'input_tokens': s['usage']['input_tokens'], "
        "'output_tokens': s['usage']['output_tokens'], 'cost_usd': 0.0, 'seconds': 0.0, 'retries': 0, 'error': None} "
        "for s in run.steps if s.get('usage')]",
        ("tests/security/test_harness_boundary.py::test_tokens_come_from_the_gateway_not_from_the_harness",),
        "a rollout's tokens are what the harness reports, not what the gateway metered",
    ),
    Mutation(
        "gateway-echoes-the-key", "milo_ray/boundary/gateway/server.py",
        '            text = text.replace(value, "[key]") if value else text',
        "            pass",
        ("tests/security/test_gateway.py",),
        "a provider error quoting the key reaches the harness",
    ),
    Mutation(
        "worker-key-in-runtime-env", "milo_ray/execution/workers.py",
        "    if pin_node is not None:\n        opts[\"scheduling_strategy\"]",
        "    opts[\"runtime_env\"] = {\"env_vars\": dict(os.environ)}\n    if pin_node is not None:\n        opts[\"scheduling_strategy\"]",
        ("tests/security/test_keys_in_ray.py",),
        "the driver's environment, provider key included, reaches the rollout workers through runtime_env, which Ray logs",
    ),
    Mutation(
        "budget-ledger-check-off", "milo_ray/execution/budget.py",
        "            if n > remaining:", "            if False:",
        ("tests/execution/test_budget_ledger.py",),
        "the execution budget admits rollouts past the cap",
    ),
    # The run's budget at the gateway (tests/security/test_run_budget.py).
    Mutation(
        "gateway-run-budget-off", "milo_ray/boundary/gateway/server.py",
        "            if spent is not None:\n                return _error(web, grant.refuse_for_run_budget(spent, admission))",
        "            if False:\n                return _error(web, grant.refuse_for_run_budget(spent, admission))",
        ("tests/security/test_run_budget.py::test_two_gateways_share_the_run_budget_and_stop_paying_within_the_bound",),
        "a rollout goes on paying for model calls after the run's USD budget is spent",
    ),
    Mutation(
        "run-budget-resumes-from-zero", "milo_ray/execution/budget.py",
        "            self._push_locked(self._tokens_used, self._cost_used)", "            pass",
        ("tests/security/test_run_budget.py::test_the_ledger_pushes_only_the_spend_the_gateways_did_not_meter",),
        "a resumed run's gateways count its budget from zero, not from the stored spend",
    ),
    Mutation(
        "final-evaluation-budgeted", "milo_ray/execution/workers.py",
        "if self.run_budget is not None and item[0] not in skip else None",
        "if self.run_budget is not None else None",
        ("tests/security/test_run_budget.py::test_only_budgeted_rollouts_carry_the_run_budget_and_their_metered_spend_comes_back",),
        "a final evaluation's model calls are refused once the search spent the budget",
    ),
    Mutation(
        "racing-budget-gate-off", "milo_ray/ssr/racing.py",
        "if remaining_budget is not None and need > remaining_budget:", "if False:",
        ("tests/ssr/test_racing.py", "tests/ssr/test_racing_rules.py", "tests/ssr/test_loop_budget.py"),
        "a racing stage starts although the budget cannot cover it",
    ),
    Mutation(
        "parent-protection-off", "milo_ray/ssr/racing.py",
        "replaced = b > p", "replaced = True",
        ("tests/ssr/test_racing.py", "tests/ssr/test_racing_rules.py"),
        "the best child replaces the parent without a strictly higher score",
    ),
    Mutation(
        "elimination-off", "milo_ray/ssr/racing_rules.py",
        "        return keep_count(generated, stages, stage)", "        return active",
        ("tests/ssr/test_racing.py",),
        "successive halving keeps every child after an intermediate stage",
    ),
    Mutation(
        "paired-budget-gate-off", "milo_ray/ssr/racing.py",
        "if remaining_budget is not None and need > remaining_budget:", "if False:",
        ("tests/ssr/test_racing_rules.py::test_paired_leaves_a_race_stopped_by_the_budget_on_its_last_stage",),
        "the paired rule runs a further block the remaining budget cannot cover",
    ),
    Mutation(
        "paired-never-eliminates", "milo_ray/ssr/racing_rules.py",
        "worse = t < -t_critical(self.alpha, n)", "worse = t < -np.inf",
        ("tests/ssr/test_racing_rules.py",),
        "the paired rule keeps a clearly dominated child",
    ),
    Mutation(
        "paired-never-settles", "milo_ray/ssr/racing_rules.py",
        "return RuleDecision(keep, stop=len(keep) == 1)", "return RuleDecision(keep, stop=False)",
        ("tests/ssr/test_racing_rules.py",),
        "the paired rule keeps racing one child against the parent after the others are out",
    ),
    Mutation(
        "halving-keeps-all", "milo_ray/ssr/racing_rules.py",
        "return max(1, -(-generated // (2 ** stage)))", "return generated",
        ("tests/ssr/test_racing_rules.py",),
        "the K-stage halving schedule eliminates no one",
    ),
    Mutation(
        "replacement-gate-off", "milo_ray/ssr/racing.py",
        "replaced = len(d) >= 2 and bool(paired_t(d) > t_critical(self.config.replace_alpha, len(d)))",
        "replaced = True",
        ("tests/ssr/test_racing_rules.py",),
        "the parent-replacement gate lets an insignificant advantage replace the parent",
    ),
    Mutation(
        "audit-replay-budget-gate-off", "milo_ray/ssr/audit_replay.py",
        "run = alive & (need <= left)", "run = alive.copy()",
        ("tests/ssr/test_audit.py",),
        "the audit's vectorized replay runs stages the budget cannot cover",
    ),
    Mutation(
        "audit-scores-in-sample", "milo_ray/ssr/audit_table.py",
        "regret = 100 * (best - truth[sel])", "regret = 100 * (in_best - q_in[sel])",
        ("tests/ssr/test_audit.py",),
        "the audit scores selections on the cells that chose them instead of by true quality",
    ),
    Mutation(
        "held-out-uses-selection-cells", "milo_ray/ssr/audit.py",
        "            and (r[\"harness_id\"], r[\"task_id\"], int(r[\"rollout_idx\"])) not in picked]", "            ]",
        ("tests/ssr/test_audit.py",),
        "held-out scoring counts the executions the selection saw",
    ),
    Mutation(
        "dominance-flipped", "milo_ray/kernels/pareto.py",
        "    if d > eps:\n        return True", "    if d < -eps:\n        return True",
        ("tests/kernels/test_pareto.py", "tests/milo/test_island.py"),
        "the less accurate harness dominates",
    ),
    Mutation(
        "eval-deadline-off", "milo_ray/evaluation.py",
        "            if ctx.out_of_time():\n                stop = \"time limit\"\n                break", "            pass",
        ("tests/entry/test_cli_runs.py::test_eval_starts_no_rollout_wave_past_the_runs_deadline_and_reports_the_completed_k",),
        "method=eval ignores the run's time limit",
    ),
    Mutation(
        "split-check-off", "milo_ray/benchmarks/base.py",
        "        if requested not in names:", "        if False:",
        ("tests/entry/test_cli_runs.py::test_a_method_benchmark_mismatch_is_refused_in_one_line_before_anything_is_written",),
        "a method is handed a split the benchmark lacks",
    ),
    Mutation(
        "duplicate-redraw-off", "milo_ray/ssr/children.py",
        "for attempt in range(1, self.cfg.duplicate_retries + 1):", "for attempt in range(1, 1):",
        ("tests/ssr/test_duplicate_redraw.py",),
        "duplicate SSR children are dropped instead of re-drawn",
    ),
    Mutation(
        "model-prices-off", "milo_ray/execution/outcomes.py",
        "if usd_per_mtok is not None and not result.cost_usd:", "if False:",
        ("tests/execution/test_rollout_scheduler.py::test_model_prices_cost_unpriced_results_and_the_usd_cap_stops_new_rollouts",),
        "model prices never reach a rollout's cost, so the USD cap is never reached",
    ),
    Mutation(
        "mutation-cap-off", "milo_ray/search/mutation.py",
        "            return self.started + self.cap + GRACE_S", "            return float('inf')",
        ("tests/search/test_mutation_runner.py::test_hung_optimizer_is_stopped_at_the_cap_in_ray_tasks",),
        "a hung mutator or optimizer on Ray is never stopped",
    ),
    Mutation(
        "agent-cache-off", "milo_ray/search/agent_cache.py",
        "    return json.dumps(spec, sort_keys=True, default=str) if isinstance(spec, dict) else None",
        "    return json.dumps(spec, sort_keys=True, default=str) + str(id(object())) if isinstance(spec, dict) else None",
        ("tests/search/test_mutation_runner.py::test_agent_is_built_once_per_process_however_many_mutations_it_serves",),
        "every mutation builds its agent again (an LLM agent's client and rate limiter are thrown away)",
    ),
    Mutation(
        "agent-spend-uncharged", "milo_ray/search/agent_calls.py",
        "        if self.budget is not None and role != \"solver\":", "        if False:",
        ("tests/search/test_agent_calls.py",),
        "agent calls do not count against the run's token and USD budget",
    ),
    Mutation(
        "role-caps-off", "milo_ray/search/agent_calls.py",
        "            spent, cap = self._spend[role], self.caps.get(role)", "            spent, cap = self._spend[role], None",
        ("tests/search/test_agent_calls.py", "tests/ssr/test_fast_forward.py"),
        "run.budget.roles.<role> caps never stop their role",
    ),
    Mutation(
        "ssr-fast-forward-off", "milo_ray/ssr/children.py",
        "        missing = [(i, d) for i, d in wanted if (i, d) not in rec.draws]", "        missing = list(wanted)",
        ("tests/ssr/test_fast_forward.py",),
        "a resumed SSR run asks its optimizer again for candidates already recorded",
    ),
    Mutation(
        "mutator-write-guard-off", "milo_ray/agents/mutators/deepagents.py",
        "        if p.startswith(self.writable + \"/\"):", "        if True:",
        ("tests/agents/test_deepagents_mutator.py::test_the_file_tools_refuse_writes_outside_the_output",),
        "a coding agent's file tools may write anywhere in its workspace, not only the output",
    ),
    Mutation(
        "orchestrator-reask-off", "milo_ray/milo/orchestrator.py",
        "        raw, error = await _ask(run, orch, md, reask, seed, call_id=f\"decide:{did}:reask\", island=j, round=r)",
        "        pass",
        ("tests/milo/test_orchestrator_reask.py::test_an_invalid_answer_is_reasked_once_and_the_corrected_decision_is_applied",),
        "an orchestrator decision that fails validation is dropped without the one re-ask",
    ),
    Mutation(
        "judge-reask-blind", "milo_ray/ssr/evidence.py",
        "        feedback = item.feedback if attempt == 0 else {**item.feedback, \"reask\": {\"error\": last, \"previous\": previous}}",
        "        feedback = item.feedback",
        ("tests/agents/test_llm_judge.py::test_an_out_of_range_answer_is_reasked_with_the_error_and_the_previous_answer",),
        "a judge is re-asked without being told what was wrong with its answer",
    ),
    Mutation(
        "einstein-agent-graded-in-workspace", "milo_ray/benchmarks/einstein/agent_tasks.py",
        "run = run_program(sandbox, GRADE_DIR,", "run = run_program(sandbox, WORKDIR,",
        ("tests/benchmarks/test_einstein_agent_tasks.py",),
        "an agent's program is graded among the files it left behind (a planted best.npy counts)",
    ),
    Mutation(
        "splits-follow-listing-order", "milo_ray/benchmarks/splits.py",
        "    sizes = {k: sizes[k] for k in canonical_order(sizes)}", "    sizes = dict(sizes)",
        ("tests/benchmarks/test_splits.py",),
        "a run resumed from its manifest (keys stored sorted) draws other splits than it drew",
    ),
    # --- the trust boundary: validation, secrets, user harnesses, suite checks, CLI mutators
    Mutation(
        "validation-unsandboxed", "milo_ray/harness/validate.py",
        "    if why is None:\n        return bwrap\n", "    if False:\n        return bwrap\n",
        ("tests/harness/test_validate_sandbox.py",),
        "a child's import check runs as a host process that can read the caller's home and run directory",
    ),
    Mutation(
        "validation-network", "milo_ray/harness/validate.py",
        "workdir=_WORKDIR, allow_internet=False,", "workdir=_WORKDIR, allow_internet=True,",
        ("tests/harness/test_validate_sandbox.py::test_a_hostile_child_gets_nothing_from_the_callers_environment_files_or_network",),
        "a hostile child's import check gets a network (public egress, the next step to a listener)",
    ),
    Mutation(
        "store-blobs-unredacted", "milo_ray/store/core.py",
        "blobs.encode(redaction.redact_obj(data))", "blobs.encode(data)",
        ("tests/store/test_contract.py::TestRunStoreContract::test_registered_secrets_are_redacted_from_every_write",),
        "a key value in a trace or harness source is stored in a blob",
    ),
    Mutation(
        "store-rows-unredacted", "milo_ray/store/core.py",
        "rows = storable(redaction.redact_obj(rows))", "rows = storable(rows)",
        ("tests/store/test_contract.py::TestRunStoreContract::test_registered_secrets_are_redacted_from_every_write",),
        "a key value in an error text or an event payload is stored in a table",
    ),
    Mutation(
        "secrets-not-registered", "milo_ray/run.py",
        "    _register_secrets(plan)\n", "\n",
        ("tests/entry/test_no_secret_persists.py::test_a_litellm_run_of_every_method_persists_no_key[eval]",),
        "the entry point never tells the store which values are secret",
    ),
    Mutation(
        "run-dir-unscrubbed", "milo_ray/run.py",
        "        _scrub_run_dir(run_dir)\n", "\n",
        ("tests/entry/test_no_secret_persists.py::test_a_litellm_run_of_every_method_persists_no_key[milo]",),
        "key values a run's processes wrote into harness copies, evidence or transcripts stay in the run directory",
    ),
    Mutation(
        "user-seeds-unvalidated", "milo_ray/run.py",
        "    check_seed_harnesses(benchmark, cfg.get(\"sandbox\"))\n", "\n",
        ("tests/entry/test_suite_checks_cli.py::test_benchmark_seeds_takes_a_harness_directory_validated_before_the_run",),
        "a user's invalid harness directory in benchmark.seeds starts a run",
    ),
    Mutation(
        "oracle-per-seed", "milo_ray/evaluation.py",
        "        if oracle_mode(ctx.scheduler):", "        if False:",
        ("tests/entry/test_suite_checks_cli.py::test_oracle_eval_validates_every_task_of_every_split_once",),
        "executor.agent=oracle runs the test split once per seed harness instead of every task once",
    ),
    Mutation(
        "errors-first-line-only", "milo_ray/run.py",
        "            raise UserError(f\"{section}: {str(cause).strip()}\") from None",
        "            raise UserError(f\"{section}: {str(cause).strip().splitlines()[0]}\") from None",
        ("tests/entry/test_suite_checks_cli.py::test_an_input_error_with_several_problems_prints_every_one",),
        "a suite with several broken tasks prints only how many there are",
    ),
    Mutation(
        "cli-mutator-network", "milo_ray/agents/mutators/cli_sandbox.py",
        'workdir="/workspace", allow_internet=False,', 'workdir="/workspace", allow_internet=True,',
        ("tests/agents/test_cli_mutator_sandbox.py",),
        "a sandboxed CLI mutator reaches the host's network besides the gateway",
    ),
    Mutation(
        "responses-unmetered", "milo_ray/boundary/gateway/responses.py",
        "    return Answer(answer, tin, tout, retries)", "    return Answer(answer, 0, 0, retries)",
        ("tests/security/test_gateway_responses.py",
         "tests/agents/test_cli_mutator_codex.py::test_codex_runs_sandboxed_against_the_gateway_keyless_and_is_charged_what_the_gateway_metered"),
        "a Responses-API call (Codex's) is forwarded but not metered: the mutation looks free",
    ),
    Mutation(
        "cli-token-not-revoked", "milo_ray/agents/mutators/cli.py",
        "                gateway.revoke_token(token)", "                pass",
        ("tests/agents/test_cli_mutator_sandbox.py",),
        "a CLI mutator's per-call gateway token stays valid after its call",
    ),
    Mutation(
        "search-agent-model-direct", "milo_ray/llm/role_llm.py",
        'model = gateway_chat_model(llm.model_config(), base_url=gateway.local_url("openai"), token=token)',
        "from milo_ray.llm.client import build_chat_model; model = build_chat_model(llm.model_config())",
        ("tests/agents/test_search_agents_gateway.py",),
        "the search's coding agents (mutator, graft, SSR optimizer) call the provider with the key, unmetered",
    ),
    Mutation(
        "store-part-hash-unchecked", "milo_ray/store/integrity.py",
        "        actual = file_sha256(path)\n",
        "        actual = recorded\n",
        ("tests/store/test_store_damage.py",),
        "a part rewritten after it was written is read as if it were the run's",
    ),
    Mutation(
        "store-disk-full-crashes", "milo_ray/run.py",
        "        full = disk_full(exc)\n",
        "        full = None\n",
        ("tests/entry/test_run_dir_damage.py::test_a_run_whose_disk_fills_stops_with_exit_3_and_resumes_once_space_is_back",),
        "a full disk crashes the run (exit 1, a traceback) instead of stopping it for a resume",
    ),
    Mutation(
        "retry-after-ignored", "milo_ray/llm/client.py",
        "            return min(asked, self.max_s)\n", "            return float(self._backoff(retry_state))\n",
        ("tests/llm/test_retry_after_and_stream_tpm.py",),
        "a 429's Retry-After is ignored: the retry comes after the jittered backoff and meets the limit again",
    ),
    Mutation(
        "stream-tokens-not-counted", "milo_ray/llm/client.py",
        "                return _counted_stream(response, report)\n", "                return response\n",
        ("tests/llm/test_retry_after_and_stream_tpm.py",),
        "a streamed answer's tokens never count toward the model's tpm",
    ),
    Mutation(
        "journal-call-not-begun", "milo_ray/boundary/gateway/ledger.py",
        "        began = None if self.journal is None else self.journal.began(started_at)\n", "        began = None\n",
        ("tests/reliability/test_call_journal.py",),
        "a forwarded call is never journaled, so one in flight at a kill is not known on resume",
    ),
    Mutation(
        "journaled-calls-not-charged", "milo_ray/search/agent_calls.py",
        "            if c.counted and self.budget is not None and (usage.tokens or usage.cost_usd):\n",
        "            if False:\n",
        ("tests/reliability/test_call_journal.py",),
        "the calls of an attempt that never reported are recorded from the journal but never charged to the budget",
    ),
    Mutation(
        "idle-islands-never-stop", "milo_ray/milo/loop.py",
        "        return self.cfg.max_idle_rounds is not None and idle >= self.cfg.max_idle_rounds\n",
        "        return False\n",
        ("tests/milo/test_loop.py::test_a_run_whose_mutator_reaches_nothing_new_stops_as_converged",),
        "a MILO run whose mutators reach only harnesses already evaluated spins on zero-cost rounds until max_rounds",
    ),
    Mutation(
        "transport-5xx-not-retried", "milo_ray/llm/client.py",
        "        return status == 429 or status >= 500\n", "        return status == 429\n",
        ("tests/reliability/test_faulty_endpoint.py::test_solver_retries_a_transport_fault_and_records_the_retry",),
        "a 5xx, a dropped body or an empty/truncated answer fails the call instead of being retried",
    ),
    Mutation(
        "resume-forgets-failed-attempt-calls", "milo_ray/search/agent_calls.py",
        "    if prefix.endswith((\":\" + FAILED_MARK, \":\" + INTERRUPTED_MARK)):\n        return True\n",
        "    if prefix.endswith((\":\" + FAILED_MARK, \":\" + INTERRUPTED_MARK)):\n        return False\n",
        ("tests/search/test_agent_calls.py",),
        "a resumed run no longer charges the solver calls of failed attempts it restored",
    ),
    Mutation(
        "agent-calls-not-journaled", "milo_ray/boundary/gateway/mutation.py",
        'f"{role}:{caller}", current_role_call.get()', 'f"{role}:{caller}", None',
        ("tests/reliability/test_role_journal.py::test_a_mutation_past_its_time_cap_has_its_paid_calls_recorded_once_and_charged_once",),
        "a search agent's model calls are not journaled: a mutation past its time cap is never charged",
    ),
    Mutation(
        "agent-call-covered-by-its-id", "milo_ray/boundary/gateway/role_journal.py",
        "        if attempt in covered and call_id in stored:\n", "        if call_id in stored:\n",
        ("tests/reliability/test_role_journal.py",),
        "an agent call's stored row is taken to hold every attempt of its id: a killed or timed-out attempt goes unpaid",
    ),
    Mutation(
        "run-spend-admits-after-exhaustion", "milo_ray/boundary/gateway/run_budget.py",
        "                self.refused += 1\n            return self.exhausted\n",
        "                self.refused += 1\n            return None\n",
        ("tests/reliability/test_exact_spend.py",),
        "the gateways' counter keeps paying for calls once the run's token/USD budget is spent",
    ),
    Mutation(
        "failed-attempt-charged-twice", "milo_ray/execution/budget.py",
        "            self._push_locked(int(tokens) - int(metered[0]), float(cost_usd or 0.0) - float(metered[1]))\n",
        "            self._push_locked(int(tokens), float(cost_usd or 0.0))\n",
        ("tests/reliability/test_exact_spend.py",),
        "a failed attempt's calls, already charged at the gateway, are pushed into the counter again",
    ),
    Mutation(
        "executions-reserved-over-cap", "milo_ray/execution/budget.py",
        "            if n > remaining:\n", "            if False:\n",
        ("tests/reliability/test_exact_spend.py",),
        "concurrent rollouts reserve more executions than the cap",
    ),
    Mutation(
        "closing-record-written-twice", "milo_ray/search/events.py",
        "        if once and already_stored(self.store, kind, event.to_payload(), **cols):\n",
        "        if False:\n",
        ("tests/search/test_event_log.py",),
        "a resumed run stores its stop and summary again after a kill that came once they were written",
    ),
    Mutation(
        "constructor-bug-as-bad-input", "milo_ray/run.py",
        "        if isinstance(cause, (ValueError, BenchmarkDataMissing)):\n",
        "        if isinstance(cause, (ValueError, TypeError, BenchmarkDataMissing)):\n",
        ("tests/entry/test_cli_runs.py::test_a_constructor_bug_is_a_crash_while_an_argument_it_does_not_take_is_bad_input",),
        "a TypeError inside a constructor (its own bug) is reported as bad input, exit 2",
    ),
    Mutation(
        "settings-first-problem-only", "milo_ray/config/validate.py",
        "    problems += settings_problems(cfg)\n", "    problems += settings_problems(cfg)[:1]\n",
        ("tests/entry/test_bad_input_exhaustive.py::test_several_problems_are_all_listed_at_once",),
        "a config with several bad values reports only the first",
    ),
    Mutation(
        "endpoint-rule-per-role", "milo_ray/llm/role_llm.py",
        "        problems = llm.endpoint_problems(where)\n", "        problems = []\n",
        ("tests/core/test_llm_endpoint.py",),
        "a search role's model settings are no longer checked by the solver's endpoint rule",
    ),
    Mutation(
        "spec-values-untyped", "milo_ray/config/targets.py",
        "        if kinds and not any(_accepts(k, value) for k in kinds):\n", "        if False:\n",
        ("tests/entry/test_composition_checks.py::test_a_spec_value_must_fit_its_parameter_type_and_declared_bounds",),
        "a mistyped value for a constructor parameter reaches the constructor",
    ),
    Mutation(
        "compose-stops-at-first-problem", "milo_ray/config/validate.py",
        "    for _ in range(len(argv) + 1):\n", "    for _ in range(1):\n",
        ("tests/entry/test_every_problem_at_once.py",),
        "a command line with several misspelt keys or mistyped values reports only the first",
    ),
    Mutation(
        "composition-first-problem-only", "milo_ray/config/targets.py",
        "        except CompositionError as exc:\n            found.extend(str(exc).splitlines())\n",
        "        except CompositionError as exc:\n            raise\n",
        ("tests/entry/test_every_problem_at_once.py",),
        "a missing path, a missing key and a bad spec value are reported one per attempt",
    ),
    Mutation(
        "zero-budget-accepted", "milo_ray/config/validate.py",
        "        if value is not None and value <= 0:", "        if value is not None and value < 0:",
        ("tests/entry/test_every_problem_at_once.py",),
        "run.budget.executions=0 starts a run that finishes having done nothing",
    ),
    Mutation(
        "oracle-scored-as-a-seed", "milo_ray/evaluation.py",
        "        summary[SPEC_KEY] = final_test_record(ORACLE_SPLIT, 1, list(tasks), results)\n", "",
        ("tests/entry/test_suite_checks_cli.py::test_oracle_eval_validates_every_task_of_every_split_once",),
        "an oracle run's report and comparison score the seed harness at method.k on the test split only",
    ),
    Mutation(
        "final-test-called-held-out", "milo_ray/report/__init__.py",
        "    shared = len(tasks) - len(held)\n", "    shared = 0\n",
        ("tests/report/test_final_test_lead.py",),
        "the report calls a final test on the search's own tasks held out",
    ),
    Mutation(
        "final-test-reuses-search-rollouts", "milo_ray/search/final_test.py",
        "        self.seed = final_test_seed(seed)\n", "        self.seed = seed\n",
        ("tests/search/test_final_test_and_recording.py::test_final_test_rollouts_never_have_a_search_rollouts_cache_key",
         "tests/test_results.py::test_a_search_final_test_shares_no_rollout_with_the_search"),
        "the final test reuses the search's rollouts on test tasks it ran (the draws that chose the harness)",
    ),
    Mutation(
        "held-out-includes-searched-tasks", "milo_ray/search/final_test.py",
        "        self.held_out_ids = [t for t in self.task_ids if t not in searched]\n",
        "        self.held_out_ids = list(self.task_ids)\n",
        ("tests/search/test_final_test_and_recording.py::"
         "test_a_test_split_the_search_ran_on_also_gets_rows_over_the_held_out_tasks_alone",),
        "the held-out final test counts tasks the search ran",
    ),
    Mutation(
        "ssr-patience-before-budget", "milo_ray/ssr/loop.py",
        "            if outcome.stop_reason == \"budget\" or self.remaining() <= 0:\n",
        "            if stall < cfg.patience and (outcome.stop_reason == \"budget\" or self.remaining() <= 0):\n",
        ("tests/ssr/test_loop_budget.py::test_a_run_whose_last_race_the_budget_cut_short_stops_on_the_budget_as_the_race_says",),
        "an SSR run says it stopped on patience where its last race stopped on the budget",
    ),
    Mutation(
        "client-join-not-retried", "milo_ray/execution/cluster.py",
        "_CLIENT_START_ATTEMPTS = 3\n", "_CLIENT_START_ATTEMPTS = 1\n",
        ("tests/execution/test_cluster_connect.py::test_a_ray_client_server_that_dies_at_start_is_asked_for_again",),
        "a Ray Client server that dies while starting fails the run instead of being asked for again",
    ),
    Mutation(
        "surrogate-ignores-user-seeds", "milo_ray/benchmarks/surrogate.py",
        "        return load_seeds(self.seed_names or list(self.preset.seed_names))\n",
        "        return load_seeds(list(self.preset.seed_names))\n",
        ("tests/benchmarks/test_surrogate.py::test_a_harness_directory_of_ones_own_is_a_seed_graded_by_its_mechanisms",),
        "benchmark.seeds paths are accepted and ignored on the surrogate",
    ),
    Mutation(
        "trajectory-drops-invalid-tool-calls", "milo_ray/boundary/trajectory.py",
        '        out["invalid_tool_calls"] = [invalid_call(c) for c in invalid if isinstance(c, dict)]', "        pass",
        ("tests/boundary/test_trajectory.py::test_an_unparseable_tool_call_keeps_its_tool_raw_text_and_parse_error",),
        "a tool call whose arguments do not parse vanishes from the trajectory",
    ),
    Mutation(
        "diagnosis-ignores-invalid-tool-calls", "milo_ray/agents/mutators/diagnosis.py",
        '    if any(s.get("invalid_tool_calls") for s in ending):', "    if False:",
        ("tests/agents/test_diagnosis.py::test_an_ending_on_an_unparseable_tool_call_is_tool_misuse",),
        "an ending on a malformed tool call is not diagnosed as tool misuse",
    ),
    Mutation(
        "invalid-tool-call-not-echoed", "milo_ray/boundary/inside/model.py",
        '                d["tool_calls"] = [*d.get("tool_calls", []), *echoed]', "                pass",
        ("tests/boundary/test_harness_process_model.py::test_the_next_turn_carries_an_unparseable_tool_call_as_it_was_sent",),
        "the next request answers a tool call it never sent, which a provider refuses",
    ),
    Mutation(
        "ray-processes-inherit-keys", "milo_ray/execution/cluster.py",
        "        removed = {name: os.environ.pop(name) for name in redaction.secret_env_names(os.environ)}",
        "        removed = {}",
        ("tests/security/test_keys_in_ray.py::test_ray_starts_and_joins_without_any_credential_variable",),
        "Ray's GCS, raylet, agents and workers inherit the driver's provider keys",
    ),
    Mutation(
        "store-keeps-unstorable-text", "milo_ray/store/core.py",
        "                r.make_storable()\n", "                pass\n",
        ("tests/store/test_unstorable_results.py::test_untrusted_text_in_a_result_is_stored_sanitised",),
        "a trace's lone surrogates, NULs and oversized strings are stored raw",
    ),
    Mutation(
        "unencodable-result-fails-the-batch", "milo_ray/store/core.py",
        'self.append("rollouts", rows, replace_unencodable=failure_record)', 'self.append("rollouts", rows)',
        ("tests/store/test_unstorable_results.py::test_a_result_that_cannot_be_encoded_is_its_rollouts_harness_failure",),
        "one unencodable result fails the whole batch and the run",
    ),
    Mutation(
        "carried-dirs-not-bound", "milo_ray/execution/agent_executor.py",
        '    return {"readonly_binds": carried.binds} if carried is not None else {}', "    return {}",
        ("tests/benchmarks/test_harbor_phase_contract.py::test_a_solution_that_publishes_to_logs_artifacts_scores_one",),
        "the verifier no longer sees /logs/artifacts: a task whose solution publishes there scores 0",
    ),
    Mutation(
        "probe-counts-as-failed-fetch", "milo_ray/benchmarks/network_evidence.py",
        "        if tool.name not in step_tools if script is not None else tool.name in _PROBES:", "        if False:",
        ("tests/benchmarks/test_network_evidence.py::test_a_curl_probe_is_not_a_fetch_step_but_a_curl_that_keeps_its_download_is",
         "tests/benchmarks/test_network_evidence.py::test_an_installers_report_counts_only_for_a_fetch_step_of_the_script"),
        "a verifier's deliberate curl of a blocked URL is blamed on the network",
    ),
    Mutation(
        "carry-follows-links", "milo_ray/boundary/sandbox/carried.py",
        "                return read_tree_nofollow(root, max_files=max_files, max_bytes=max_bytes)",
        '                return Tree(files={str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()})',
        ("tests/boundary/sandbox/test_carried.py::test_a_planted_symlink_fifo_or_hard_link_carries_no_host_file",),
        "a link the agent planted brings a host file into the verifier",
    ),
    Mutation(
        "gateway-4xx-is-infra", "milo_ray/boundary/gateway/upstream.py",
        'return ("infra" if retryable(exc) else "request"), status', 'return "infra", status',
        ("tests/security/test_gateway_failure_classes.py::"
         "test_a_request_the_provider_refuses_is_the_requests_failure_never_the_endpoints",),
        "a 4xx the harness provoked re-rolls its rollout as an infrastructure failure",
    ),
    Mutation(
        "stream-usage-unknown-is-zero", "milo_ray/boundary/gateway/server.py",
        'reported=bool(usage.get("reported"))', "reported=True",
        ("tests/security/test_gateway_metering.py::test_a_stream_the_provider_cuts_before_its_usage_is_charged_its_reservation",),
        "a stream cut before its usage chunk is charged 0 tokens",
    ),
    Mutation(
        "provider-tools-forwarded", "milo_ray/boundary/gateway/upstream.py",
        "        if kind in CLIENT_TOOL_TYPES or (untyped and kind is None):", "        if True:",
        ("tests/security/test_gateway_provider_tools.py::"
         "test_provider_run_tools_are_refused_on_the_chat_route_before_anything_goes_upstream",),
        "provider-run tools reach the provider, outside the sandbox and the meter",
    ),
    Mutation(
        "child-with-links-accepted", "milo_ray/agents/mutators/workspace.py",
        "        if not tree.ok:\n", "        if False:\n",
        ("tests/security/test_host_never_follows.py::test_a_child_holding_a_link_or_special_file_is_rejected_never_read_through",),
        "a child holding a symlink, fifo, hard link or oversized file is accepted instead of rejected with its reason",
    ),
    Mutation(
        "grading-mount-points-made-through-links", "milo_ray/boundary/sandbox/bwrap_mounts.py",
        "        argv += self._late_binds(late)\n", "        argv += _readonly_args(late)\n",
        ("tests/security/test_host_never_follows.py::test_a_readonly_bind_inside_the_sandboxs_tmp_is_never_made_through_an_agents_link",
         "tests/security/test_host_never_follows.py::test_grading_setup_over_any_link_left_in_the_workspace_changes_no_host_dir"),
        "bwrap makes mount points inside the writable tree and follows an agent's link through its old root onto the host",
    ),
    Mutation(
        "host-walk-follows-directory-links", "milo_ray/boundary/nofollow.py",
        "_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC\n",
        "_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC\n",
        ("tests/security/test_host_never_follows.py::test_an_upload_through_a_directory_the_agent_swapped_for_a_link_is_refused",
         "tests/security/test_host_never_follows.py::test_a_directory_swapped_for_a_link_while_the_host_uploads_is_never_followed",
         "tests/boundary/test_nofollow.py::test_writes_never_go_through_a_link_on_the_way_or_at_the_end"),
        "uploads and walks follow a directory the agent swapped for a link",
    ),
    Mutation(
        "internet-task-shares-host-net", "milo_ray/boundary/sandbox/bwrap.py",
        "if not self.spec.allow_internet:", "if True:",
        ("tests/security/test_sandbox_network.py::test_an_internet_task_cannot_reach_a_listener_on_the_hosts_loopback",),
        "an internet task joins the host's network namespace: host loopback, ports and sockets reachable",
    ),
    Mutation(
        "egress-filter-blocks-nothing", "milo_ray/boundary/sandbox/egress.py",
        "    for net in blocked:", "    for net in ():",
        ("tests/security/test_sandbox_network.py::test_the_egress_filter_refuses_every_private_range_and_the_hosts_own_networks",),
        "metadata, private ranges and the host's own address become reachable",
    ),
    Mutation(
        "storage-cap-per-file-only", "milo_ray/boundary/sandbox/bwrap.py",
        "self._volume = volume if volume is not None else open_volume(spec, scratch, own=factory.own_volume)",
        "self._volume = volume",
        ("tests/security/test_sandbox_storage.py::test_the_volume_is_unmounted_when_the_sandbox_closes",),
        "storage_mb bounds each file, not the total of the writable directories",
    ),
    Mutation(
        "closed-sandbox-keeps-cgroups", "milo_ray/boundary/sandbox/cgroups.py",
        "        self.kill_all()\n        _rmdirs(self.dirs)", "        self.kill_all()",
        ("tests/boundary/sandbox/test_leftovers.py::test_a_closed_sandbox_leaves_no_cgroup",),
        "a closed sandbox leaves its cgroups on the host",
    ),
    Mutation(
        "reaper-takes-live-owners", "milo_ray/boundary/sandbox/leftovers.py",
        "        return _start_time(self.pid) != self.start", "        return True",
        ("tests/boundary/sandbox/test_leftovers.py::test_a_dead_workers_cgroups_and_scratch_are_reaped_and_a_live_workers_never",
         "tests/boundary/sandbox/test_leftovers.py::test_only_a_certainly_dead_owner_is_dead"),
        "a live sandbox's idle cgroup and scratch are reaped",
    ),
    Mutation(
        "oom-named-without-a-kill", "milo_ray/boundary/sandbox/process.py",
        "        if self.oom_kills:", "        if self.oom_kills is not None:",
        ("tests/benchmarks/test_einstein_program_ends.py::test_a_sigkill_from_outside_is_named_as_a_signal_not_as_memory",),
        "a SIGKILL with no OOM kill counted is called out of memory",
    ),
    Mutation(
        "optimizer-kit-imports-scipy-eagerly", "milo_ray/kernels/autocorr_kit.py",
        "sfft = _ScipyFFT()", "from scipy import fft as sfft",
        ("tests/boundary/test_optimizer_spares.py::test_a_program_that_does_not_use_scipy_never_imports_it",),
        "every candidate pays scipy.fft's import, used or not",
    ),
    Mutation(
        "warm-runner-clock-from-its-imports", "milo_ray/boundary/inside/optimizer_runner.py",
        "    T0 = time.monotonic()\n    exit_file = job.get(\"exit_file\")", "    exit_file = job.get(\"exit_file\")",
        ("tests/boundary/test_optimizer_spares.py::test_a_spares_idle_time_does_not_count_against_the_programs_budget",),
        "a spare's idle time is taken from the program's budget",
    ),
    Mutation(
        "spare-sandbox-never-closed", "milo_ray/execution/optimizer_executor.py",
        "await asyncio.to_thread(close_sandbox, spare.sandbox, None if self.keep_scratch else spare.scratch)", "pass",
        ("tests/boundary/test_optimizer_spares.py::test_a_spare_runs_one_candidate_and_is_discarded_with_its_sandbox",),
        "a used spare's sandbox and scratch outlive its candidate",
    ),
    Mutation(
        "sandbox-uid-lease-ignores-its-lock", "milo_ray/boundary/sandbox/identity.py",
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", "pass",
        ("tests/security/test_sandbox_identity.py::test_concurrently_open_sandboxes_never_share_a_uid",),
        "two open sandboxes share a uid and so its keyrings",
    ),
    Mutation(
        "bwrap-commands-get-no-seccomp-filter", "milo_ray/boundary/sandbox/seccomp.py",
        'exec "$1" --seccomp "$fd" "${@:2}"', 'exec "$1" "${@:2}"',
        ("tests/security/test_sandbox_identity.py::test_keyring_calls_are_refused_and_nothing_is_planted",
         "tests/security/test_sandbox_identity.py::test_tracing_mounting_namespaces_bpf_and_perf_are_refused"),
        "keyctl, ptrace, mount, unshare, bpf and perf work inside a sandbox",
    ),
    Mutation(
        "sandbox-uid-given-back-uncleared", "milo_ray/boundary/sandbox/identity.py",
        "        try:\n            clear_uid(self.uid)\n", "        try:\n",
        ("tests/security/test_sandbox_identity.py::test_keyrings_a_uid_was_left_with_are_emptied_when_its_lease_ends",
         "tests/security/test_sandbox_identity.py::test_processes_of_a_closed_sandbox_uid_are_gone"),
        "keys and processes of a closed sandbox's uid reach the uid's next holder",
    ),
    Mutation(
        "gateway-socket-takes-any-grant", "milo_ray/boundary/gateway/server.py",
        "if grant is not own:", "if grant is None:",
        ("tests/security/test_gateway_per_grant.py::test_a_token_is_refused_on_another_grants_socket_and_its_grant_is_charged_nothing",),
        "a rollout's socket serves another live rollout's token and bills that rollout",
    ),
    Mutation(
        "grant-socket-outlives-grant", "milo_ray/boundary/gateway/server.py",
        "os.unlink(path)", "pass",
        ("tests/security/test_gateway_per_grant.py::test_a_token_is_refused_on_every_socket_once_its_grant_ended",),
        "an ended grant's socket stays in its sandbox's directory",
    ),
    Mutation(
        "cli-sandbox-env-from-host", "milo_ray/agents/mutators/cli.py",
        'env = {k: os.environ[k] for k in ("LANG",) if k in os.environ}', "env = dict(os.environ)",
        ("tests/security/test_redteam_search_agents.py::test_an_injected_cli_mutator_hunting_keys_finds_none_and_its_one_call_is_metered",),
        "the CLI mutator's sandbox gets the host's provider key",
    ),
    Mutation(
        "import-check-env-from-host", "milo_ray/harness/validate.py",
        'env = {**_CHILD_ENV, **interpreter_env(), "PYTHONPATH": code}',
        'env = {**os.environ, **_CHILD_ENV, **interpreter_env(), "PYTHONPATH": code}',
        ("tests/security/test_redteam_search_agents.py::test_a_child_whose_import_hunts_keys_and_sockets_is_rejected_with_what_it_found",),
        "a child's import finds the key",
    ),
    Mutation(
        "cli-shell-no-file-limit", "milo_ray/agents/mutators/cli_sandbox.py",
        'steps = [f"ulimit -f {FILE_LIMIT_MB * 1024}"]', 'steps = ["ulimit -f unlimited"]',
        ("tests/security/test_redteam_search_agents.py::test_a_two_gigabyte_child_file_is_rejected_and_the_host_disk_keeps_at_most_the_cap",),
        "a mutator writes 2 GB to the host disk",
    ),
    Mutation(
        "harness-written-outside-its-dir", "milo_ray/harness/model.py",
        "            try:\n                safe_relpath(rel)\n            except UnsafePath:\n                continue\n",
        "            if rel.startswith('/'):\n                (Path(rel)).write_text(text)\n                continue\n"
        "            if '..' in rel:\n                (root / rel).write_text(text)\n                continue\n",
        ("tests/security/test_redteam_search_agents.py::test_a_graft_child_rejected_for_a_traversal_name_is_recorded_without_writing_outside_the_run",),
        "a rejected child's '../' or absolute file name is written outside the run when MILO records it",
    ),
    Mutation(
        "gateway-drops-aws-credentials", "milo_ray/boundary/gateway/upstream.py",
        "if k in CREDENTIAL_ARGS and v})", 'if k == "api_key" and v})',
        ("tests/security/test_keys_in_ray.py::test_the_driver_hands_over_only_the_aws_credential_variables_it_has",),
        "a bedrock/ model's AWS credentials never reach litellm: every Bedrock call fails to authenticate",
    ),
    Mutation(
        "aws-credentials-not-redacted", "milo_ray/run.py",
        "    redaction.register(worker_env(plan.model))\n", "",
        ("tests/security/test_keys_in_ray.py::test_a_bedrock_models_aws_secrets_are_redacted_and_its_region_is_not",),
        "a run stores its bedrock model's AWS secret key and session token in plain text",
    ),
    Mutation(
        "ci-rotation-stuck", "scripts/ci_rotation.py",
        "        part = count % PARTS\n", "        part = 0\n",
        ("tests/test_ci_rotation.py",),
        "every CI run checks the same third of the slow tests and mutations: the rest are never checked",
    ),
    Mutation(
        "check-trivial-is-ok", "milo_ray/tasks/verdicts.py",
        "    if noop_score is not None and noop_score >= 1.0:\n", "    if False:\n",
        ("tests/tasks/test_verdicts.py",),
        "a task that doing nothing already solves is reported ok",
    ),
    Mutation(
        "sweep-drivers-unpinned", "milo_ray/sweep/placement.py",
        "    if driver_node == \"any\" or run_dir_is_durable(run_dir):", "    if True:",
        ("tests/sweep/test_placement.py::test_drivers_of_a_cluster_sweep_are_pinned_to_the_head",),
        "a sweep's drivers land on any node and write their runs to a worker's disk",
    ),
    Mutation(
        "run-missing-reported-as-success", "milo_ray/sweep/summary.py",
        "        if o.status == SUCCEEDED:\n            o.status = RUN_MISSING", "        if False:\n            o.status = RUN_MISSING",
        ("tests/sweep/test_summary.py::test_a_succeeded_job_whose_run_cannot_be_read_is_run_missing",),
        "a job whose run is lost shows as SUCCEEDED with empty metrics",
    ),
    Mutation(
        "launcher-mappings-closed", "milo_ray/sweep/settings.py",
        "        OmegaConf.set_struct(node[name], False)", "        pass",
        ("tests/sweep/test_settings.py::test_the_driver_pin_is_accepted_in_every_command_line_form",),
        "the documented entrypoint_resources override fails from the command line",
    ),
    Mutation(
        "docs-command-key-unknown", "docs/tutorials/your-harness.md",
        "benchmark.seeds='[minimal,./my_harness]' method.k=1", "benchmark.seeds='[minimal,./my_harness]' method.kk=1",
        ("tests/docs/test_doc_commands.py::test_every_run_command_on_the_pages_composes_and_passes_the_config_checks",),
        "a command on a docs page names a key the config does not have, and no test notices",
    ),
    Mutation(
        "help-omits-method-keys", "milo_ray/config/help.py",
        "    for name, rows in method_keys().items():\n        lines +=", "    for name, rows in {}.items():\n        lines +=",
        ("tests/entry/test_cli_runs.py::test_help_lists_every_group_option_and_run_key_and_no_internal_schema",),
        "--help lists no method.* key",
    ),
    Mutation(
        "docker-storage-uncapped", "milo_ray/boundary/sandbox/docker.py",
        "        volume = open_volume(spec, scratch)", "        volume = None",
        ("tests/boundary/sandbox/test_docker_boundary.py::test_writing_past_storage_mb_in_every_writable_place_gets_enospc_and_the_host_holds_at_most_the_cap",),
        "storage_mb caps nothing but one file's size under Docker",
    ),
    Mutation(
        "docker-one-uid-for-all", "milo_ray/boundary/sandbox/docker.py",
        '            user = f"{owner[0]}:{owner[1]}"', '            user = "65534:65534"',
        ("tests/boundary/sandbox/test_docker_boundary.py::test_concurrent_containers_run_as_different_uids_which_are_cleared_when_they_end",),
        "concurrent containers share one uid's kernel state",
    ),
    Mutation(
        "docker-daemon-seccomp-unchecked", "milo_ray/boundary/sandbox/docker.py",
        "            if self.require_daemon_seccomp:", "            if False:",
        ("tests/boundary/sandbox/test_docker_boundary.py::test_a_daemon_without_seccomp_is_refused_before_the_run_naming_the_opt_out",),
        "a Docker daemon without seccomp runs sandboxes",
    ),
    Mutation(
        "gateway-call-dies-with-its-handler", "milo_ray/boundary/gateway/server.py",
        "        return await asyncio.shield(task)\n", "        return await task\n",
        ("tests/security/test_gateway_metering_paths.py::test_a_call_whose_caller_hangs_up_is_charged_what_the_provider_billed",
         "tests/security/test_gateway_metering_paths.py::test_callers_hanging_up_in_parallel_never_pass_the_token_cap_and_pay_what_was_billed"),
        "a caller that hangs up while its handler is cancelled escapes the call's cost",
    ),
    Mutation(
        "gateway-lost-answer-free", "milo_ray/boundary/gateway/server.py",
        "reported=not upstream.may_be_billed(exc)", "reported=True",
        ("tests/security/test_gateway_metering_paths.py::test_a_call_whose_answer_is_lost_on_the_way_is_charged_its_reservation",
         "tests/security/test_gateway_metering_paths.py::test_a_call_that_times_out_is_charged_its_reservation"),
        "a dropped, truncated or timed-out answer the provider billed is charged 0",
    ),
    Mutation(
        "gateway-tiered-price-linear", "milo_ray/boundary/gateway/upstream.py",
        "    if tiered or not all(", "    if False and not all(",
        ("tests/security/test_gateway_pricing.py::test_a_calls_price_is_litellms_price_for_its_tokens",
         "tests/security/test_gateway_pricing.py::test_a_tiered_price_is_never_taken_for_a_linear_one"),
        "a tiered model is priced at its base rate past 200k tokens",
    ),
    Mutation(
        "dispatch-held-group-loses-turn", "milo_ray/execution/dispatch.py",
        "                held[group] = ticket\n", "                held[group] = next(tickets)\n",
        ("tests/execution/test_dispatch_scale.py::test_a_group_that_reached_a_lowered_limit_keeps_its_turn_while_it_waits",),
        "a group found at a lowered limit loses its place in the turn order",
    ),
    Mutation(
        "dispatch-runnable-stale-on-done", "milo_ray/execution/dispatch.py",
        "        self._in_flight[group] -= 1\n        self._runnable += self._runnable_of(group) - before", "        self._in_flight[group] -= 1",
        ("tests/execution/test_dispatch_scale.py::test_the_dispatch_decides_exactly_as_its_plain_rules_do",),
        "runnable() undercounts a capped group after its items finish, so the pool is sized too small",
    ),
    Mutation(
        "dispatch-groups-served-fifo", "milo_ray/execution/dispatch.py",
        "heapq.heappush(turns, (next(tickets), group))", "heapq.heappush(turns, (ticket, group))",
        ("tests/execution/test_dispatch_scale.py::test_the_scale_bench_reports_every_figure_and_round_robin_stays_within_twice_the_fair_share",
         "tests/execution/test_dispatch.py::test_groups_take_turns_within_one_pick"),
        "a served group keeps its turn until its queue is empty, so groups are served FIFO",
    ),
    Mutation(
        "lease-create-unconditional", "milo_ray/store/lease.py",
        'self._etag = self._put(IfNoneMatch="*")', 'self._etag = self._put()',
        ("tests/store/test_object_store.py::test_a_second_writer_is_refused_while_the_lease_is_live",
         "tests/store/test_object_store.py::test_racing_drivers_create_the_lease_exactly_once"),
        "two drivers write one bucket run",
    ),
    Mutation(
        "lease-not-checked-before-commit", "milo_ray/store/mirrored.py",
        "self._lease.check()  # a driver that lost the run commits nothing more", "pass",
        ("tests/store/test_object_store.py::test_a_writer_whose_lease_was_taken_commits_nothing_more",),
        "a driver that lost its lease keeps committing parts",
    ),
    Mutation(
        "bucket-keys-not-redacted", "milo_ray/run.py",
        'redaction.register_env(["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"])', "pass",
        ("tests/store/test_object_store.py::test_the_bucket_keys_are_secrets_that_never_reach_the_bucket",),
        "the bucket's secret key can be persisted",
    ),
    Mutation(
        "report-stop-reason-in-metrics-table", "milo_ray/report/compare.py",
        'TABLE_COLUMNS = ["run", "setting", "benchmark", "status", "label",', 'TABLE_COLUMNS = ["run", "setting", "benchmark", "status", "stop_reason", "label",',
        ("tests/report/test_report_fits.py::test_the_comparison_page_shows_every_metric_column_at_1400_px",),
        "a long stop reason pushes the comparison page's metric columns out of a 1,400-pixel window",
    ),
    Mutation(
        "bind-source-writable-volume", "milo_ray/boundary/sandbox/bwrap.py",
        "open_volume(spec, scratch, own=factory.own_volume)", "open_volume(spec, scratch)",
        ("tests/security/test_bind_sources.py::test_no_bind_source_names_a_host_path_of_the_rollout",),
        "a sandbox's writable directories are bound from the rollout's scratch: its mount table names a host path",
    ),
    Mutation(
        "bind-source-gateway-dir", "milo_ray/boundary/harness_process/host.py",
        "where = neutral.fresh_dir(\"r\")", "where = None",
        ("tests/security/test_bind_sources.py::test_no_bind_source_names_a_host_path_of_the_rollout",),
        "the harness and gateway directories are bound from the scratch: the mount table names it",
    ),
    Mutation(
        "bind-source-code-copy", "milo_ray/boundary/sandbox/runtime_code.py",
        "    if neutral_root is None:\n", "    if True:\n",
        ("tests/security/test_bind_sources.py::test_no_bind_source_names_a_host_path_of_the_rollout",),
        "the package's code copy is bound from a host temporary directory",
    ),
    Mutation(
        "account-limiter-per-run", "milo_ray/llm/rate_limit.py",
        'handle = remote.options(name=actor_name(account), namespace=CLUSTER_NAMESPACE, lifetime="detached",',
        'handle = remote.options(name=actor_name(account), lifetime="detached",',
        ("tests/llm/test_account_rate_limit.py::test_two_runs_on_one_account_together_keep_its_rpm",),
        "each run gets its own limiter: a sweep sends its runs' count times the account's rpm",
    ),
    Mutation(
        "run-budget-no-wait-for-calls-in-flight", "milo_ray/boundary/gateway/run_budget.py",
        "            if not fits and self._open:", "            if False and not fits and self._open:",
        ("tests/execution/test_sweep_spend.py::test_parallel_calls_wait_rather_than_together_pass_the_usd_cap",
         "tests/execution/test_sweep_spend.py::test_a_sweep_cap_stops_both_jobs_within_one_call_of_it"),
        "parallel calls pass the USD cap together",
    ),
    Mutation(
        "sweep-ledger-never-charged", "milo_ray/execution/spend.py",
        "        counters = [c for c in (self.counter, self.sweep_ledger) if c is not None]",
        "        counters = [c for c in (self.counter,) if c is not None]",
        ("tests/execution/test_sweep_spend.py::test_two_jobs_stop_at_the_sweep_cap_with_the_sweeps_reason",),
        "the sweep's spend cap stops no job",
    ),
    Mutation(
        "mutator-seats-fifo", "milo_ray/milo/mutator_pool.py",
        "req = min(heads, key=lambda r: (held_by.get(r.key, 0), r.seq))", "req = min(heads, key=lambda r: r.seq)",
        ("tests/milo/test_mutator_pool.py::test_a_key_with_fewer_seats_is_served_first_so_no_island_starves",
         "tests/milo/test_mutator_pool_actor.py::test_two_runs_sharing_an_account_never_hold_more_than_its_seats_and_take_turns"),
        "seats go first-come-first-served: an island or run with many queued mutations keeps every seat while another waits",
    ),
    Mutation(
        "mutator-pool-restore-forgets-seats", "milo_ray/milo/mutator_pool_actor.py",
        "await self.actor.restore.remote(events, list(self._held.values()))", "await self.actor.restore.remote(events, [])",
        ("tests/milo/test_mutator_pool_actor.py::test_a_killed_pool_actor_is_restored_with_the_seats_its_driver_holds",),
        "a replaced pool actor forgets the seats in use and runs more mutations than the account allows",
    ),
    Mutation(
        "mutator-seats-key-reaches-constructor", "milo_ray/config/targets.py",
        "{k: v for k, v in spec.items() if k != \"seats\"} if isinstance(spec, Mapping) else spec)", "spec)",
        ("tests/milo/test_config.py::test_a_mutator_spec_may_declare_seats_and_bad_seats_are_refused_naming_the_key",),
        "a spec with seats is refused as an unknown constructor keyword",
    ),
    Mutation(
        "store-arrow-check-skipped", "milo_ray/store/schema.py",
        "    if value is None:\n        return True\n    t = col.type", "    return True",
        ("tests/store/test_parquet_store.py::test_a_value_arrow_would_refuse_rejects_its_append_not_a_later_flush",),
        "a value Arrow refuses is accepted on append and fails the later flush, taking the part's other rows with it",
    ),
    Mutation(
        "store-buffer-out-of-order", "milo_ray/store/schema.py",
        "                    pending[n].extend(v)", "                    pending[n][:0] = v",
        ("tests/store/test_parquet_store.py::test_buffered_one_row_appends_make_one_part_with_every_row_in_order",),
        "buffered rows are built into the part out of write order",
    ),
    Mutation(
        "store-completed-counts-infra", "milo_ray/store/core.py",
        "            if key and r.get(\"error_kind\") != \"infra\":", "            if key:",
        ("tests/store/test_contract.py",),
        "infra failures count as completed and are never retried on resume",
    ),
    Mutation(
        "paperbench-judge-failures-convention", "milo_ray/benchmarks/paperbench/rubric.py",
        'if judge_failures == "drop":', 'if judge_failures == "zero":',
        ("tests/benchmarks/test_paperbench.py::test_a_judge_failure_counts_as_zero_or_is_dropped_with_its_weight",),
        "judge failures counted under the wrong convention",
    ),
    Mutation(
        "grader-budget-off", "milo_ray/execution/grader.py",
        "if len(self.calls) >= s.max_calls or self.tokens >= s.max_tokens:", "if False:",
        ("tests/benchmarks/test_paperbench.py::test_grader_calls_are_capped_per_rollout",),
        "a rollout's grading budget is not enforced",
    ),
    Mutation(
        "grader-calls-charged-as-solver", "milo_ray/search/agent_calls.py",
        'self.record("grader", usage,', 'self.record("solver", usage,',
        ("tests/benchmarks/test_paperbench.py::test_grader_calls_are_recorded_as_role_grader_never_as_the_solvers",),
        "grader calls charged as the solver's",
    ),
    Mutation(
        "harness-model-skips-its-socket", "milo_ray/boundary/inside/harness_process.py",
        "        model = build_model(job, relay.url, job[\"gateway_socket\"])", "        model = build_model(job, relay.url)",
        ("tests/security/test_harness_boundary.py::test_the_chat_model_reaches_the_gateway_without_the_relay_and_nothing_else",),
        "the harness's chat model goes through the loopback relay, a hop and a millisecond more per call",
    ),
    Mutation(
        "gateway-socket-connection-never-kept", "milo_ray/boundary/inside/gateway_http.py",
        "        if keep and not reader.at_eof():", "        if False:",
        ("tests/boundary/test_gateway_http.py::test_over_the_socket_one_connection_is_kept_per_event_loop_and_one_for_blocking_calls",),
        "a new connection per model call",
    ),
    Mutation(
        "gateway-streams-skip-the-socket", "milo_ray/boundary/inside/model.py",
        "transport = httpx.AsyncHTTPTransport(uds=self.gateway_socket) if self.gateway_socket else None", "transport = None",
        ("tests/boundary/test_gateway_http.py::test_over_the_socket_a_streamed_call_goes_there_too",),
        "streamed calls dial api_base instead of the rollout's socket",
    ),
    Mutation(
        "milo-node-harness-not-rewritten", "milo_ray/milo/records.py",
        "    if not (d / \"harness.py\").is_file():\n        h.write_to(d)", "    if False:\n        h.write_to(d)",
        ("tests/milo/test_harness_dirs.py::test_a_nodes_missing_files_are_rewritten_from_its_source_blob_and_stored_rollouts",),
        "a resumed run without its workspace hands mutators a parent directory without the parent's harness",
    ),
    Mutation(
        "milo-node-evidence-not-rewritten", "milo_ray/milo/records.py",
        "    if not ev_dir.is_dir():", "    if False:",
        ("tests/milo/test_harness_dirs.py::test_a_nodes_missing_files_are_rewritten_from_its_source_blob_and_stored_rollouts",),
        "a resumed run's mutators get a missing evidence directory",
    ),
    Mutation(
        "milo-node-paths-not-rebased", "milo_ray/milo/records.py",
        "    if not node.harness_id:\n        return node", "    if True:\n        return node",
        ("tests/milo/test_harness_dirs.py::test_a_recorded_node_is_rebased_under_the_current_run_directory",),
        "replayed nodes keep another machine's paths",
    ),
    Mutation(
        "are-channel-serves-unlisted-names", "milo_ray/benchmarks/are/channel.py",
        "if spec is None:", "if spec is None and name not in dir(provider):",
        ("tests/benchmarks/test_are_channel.py::test_the_harness_cannot_reach_environment_state_except_through_its_tools",),
        "the scenario's tool channel answers names that are not its tools",
    ),
    Mutation(
        "are-channel-extra-args", "milo_ray/benchmarks/are/channel.py",
        "extra = sorted(str(k)[:100] for k in args if k not in allowed)", "extra = []",
        ("tests/benchmarks/test_are_channel.py::test_the_harness_cannot_reach_environment_state_except_through_its_tools",),
        "arguments a tool does not take reach the scenario's environment",
    ),
    Mutation(
        "are-host-env-keys", "milo_ray/benchmarks/are/episode.py",
        "return {k: os.environ[k] for k in keep if k in os.environ}",
        "return {k: v for k, v in os.environ.items() if not k.endswith(\"_API_KEY\")}",
        ("tests/benchmarks/test_are_host_env.py::test_are_host_process_gets_no_credential",),
        "cloud credentials reach the ARE host process",
    ),
    Mutation(
        "ray-client-mutations-not-relayed", "milo_ray/search/mutation.py",
        "    return client.is_connected()", "    return False",
        ("tests/execution/test_shipping_cluster.py::test_milo_and_ssr_from_a_ray_client_driver_score_as_on_a_shared_disk",),
        "a Ray Client driver's mutations fail (a client cannot stream a task's progress), so MILO and SSR make no child",
    ),
    Mutation(
        "are-task-tools-not-offered", "milo_ray/boundary/inside/harness_process.py",
        "            offer_task_tools(backend.task_tools)", "            pass",
        ("tests/benchmarks/test_are_rollout.py::test_a_seed_harness_acts_through_the_scenario_tools_and_ares_judge_scores_it",),
        "a harness's agent gets no tool of the scenario it is to act in",
    ),
    Mutation(
        "are-scenario-beside-the-tools", "milo_ray/benchmarks/are/benchmark.py",
        'scenario = self._dir / "scenario.json"', 'scenario = Path(socket).parent / "scenario.json"',
        ("tests/benchmarks/test_are_rollout.py::test_the_harness_cannot_read_the_scenario_and_holds_only_its_tools",),
        "the scenario's JSON, oracle actions included, lies where the harness's sandbox can read it",
    ),
    Mutation(
        "are-first-turn-not-delivered", "milo_ray/benchmarks/are/host.py",
        "            deliver_first_turn(json.loads(text), tools)", "            pass",
        ("tests/entry/test_are_runs.py::test_milo_completes_on_are_scenarios_with_the_judgment_in_evidence",),
        "a fast agent acts before the world delivered the message it answers, and ARE's judge fails it",
    ),
    Mutation(
        "paperbench-blacklist-reads-tool-output", "milo_ray/benchmarks/paperbench/blacklist.py",
        'args = json.dumps(call.get("args"), default=str).lower()', 'args = json.dumps(steps, default=str).lower()',
        ("tests/benchmarks/test_paperbench_blacklist.py::test_reading_the_paper_that_cites_its_code_and_entries_naming_nothing_are_no_violation",),
        "reading the paper that cites its own code voids the attempt",
    ),
    Mutation(
        "screened-attempt-not-voided", "milo_ray/execution/agent_executor.py",
        "            _void_if_screened(fmt, task, run, verdict)", "            pass",
        ("tests/benchmarks/test_paperbench_rollout.py::test_an_attempt_that_reached_the_papers_own_code_is_void",),
        "an attempt that reached the paper's own code keeps its rubric score",
    ),
    Mutation(
        "paperbench-evidence-without-leaf-verdicts", "milo_ray/harness/evidence.py",
        "            _format_files(root, tdir, task_map.get(tid), wt)\n", "",
        ("tests/benchmarks/test_paperbench.py::test_the_evidence_a_mutator_reads_holds_every_leafs_verdict_and_reason",),
        "mutators no longer see each rubric leaf's verdict and reason",
    ),
    Mutation(
        "paperbench-reproduction-shown-to-every-leaf", "milo_ray/benchmarks/paperbench/reproduce.py",
        'SHOWN_FOR = ("Code Execution", "Result Analysis", "mixed")',
        'SHOWN_FOR = ("Code Development", "Code Execution", "Result Analysis", "mixed")',
        ("tests/benchmarks/test_paperbench.py::test_only_execution_and_result_leaves_are_shown_the_reproduction",),
        "Code Development leaves are judged with the reproduction's output",
    ),
    Mutation(
        "rubric-report-reason-unescaped", "milo_ray/report/graded_tree.py",
        "{escape(str(why))}</span>", "{why}</span>",
        ("tests/report/test_graded_tree.py::test_leaf_texts_are_escaped_and_every_leaf_shows_its_verdict",),
        "a grader's reason is written into the report as HTML",
    ),
    Mutation(
        "are-world-unjailed", "milo_ray/benchmarks/are/episode.py",
        "writable=[str(Path(socket).parent)])", "writable=[str(Path(socket).parent)])[-10:]",
        ("tests/benchmarks/test_are_episode.py::test_the_worlds_apps_reach_no_host_file_through_a_models_arguments",),
        "the scenario's world runs unjailed: an app tool reads a host file into an email, or writes anywhere",
    ),
    Mutation(
        "surrogate-executor-ignores-preset-credit", "milo_ray/benchmarks/surrogate_executor.py",
        "Q.build_tables(mechs, self.preset.effect_scale, self.preset.credit)",
        "Q.build_tables(mechs, self.preset.effect_scale)",
        ("tests/benchmarks/test_surrogate_paper_presets.py::test_sampled_rollouts_converge_to_the_presets_exact_expectation",),
        "GAIA-2 rollouts are sampled with the default partial credit, off the calibrated ground truth",
    ),
    Mutation(
        "surrogate-calibration-accepts-unreachable-target", "milo_ray/benchmarks/surrogate_calibration.py",
        "    if abs(reached - preset.target_resolve) > 1e-3:", "    if False:",
        ("tests/benchmarks/test_surrogate_paper_presets.py::test_a_target_the_offset_cannot_reach_is_refused_naming_the_preset",),
        "a target the offset cannot reach ends silently at the search range's edge",
    ),
    Mutation(
        "task-draw-ignored", "milo_ray/ssr/racing.py",
        "        self._val_perm = self.task_draw.order(list(validation), rates, rng)",
        "        self._val_perm = UniformDraw().order(list(validation), rates, rng)",
        ("tests/ssr/test_task_draw.py::test_intermediate_band_tasks_are_drawn_first",),
        "a discriminative draw races uniformly drawn tasks",
    ),
    Mutation(
        "task-draw-population-frozen", "milo_ray/ssr/loop.py",
        "        self.last_runners = runners", "        self.last_runners = set()",
        ("tests/ssr/test_task_draw.py::test_ssr_run_draws_from_the_population_of_each_round_and_never_from_the_test_split",),
        "the draw's pass rates stop following the population",
    ),
    Mutation(
        "lowrank-prior-ignored", "milo_ray/ssr/racing_lowrank.py",
        "for v in view.prior.values()] if self.prior else []", "for v in view.prior.values()] if False else []",
        ("tests/ssr/test_racing_lowrank_prior.py::test_earlier_matrices_let_lowrank_separate_what_the_race_alone_cannot",),
        "lowrank ignores earlier races' matrices",
    ),
    Mutation(
        "paired-rejects-ranks-backwards", "milo_ray/ssr/racing_paired.py",
        'np.argsort(-t, kind="stable")', 'np.argsort(t, kind="stable")',
        ("tests/ssr/test_racing_new_rules.py::test_paired_rejects_rejects_the_challenger_with_the_lowest_paired_statistic",),
        "paired successive rejects drops the strongest challenger instead of the weakest",
    ),
    Mutation(
        "bandit-without-radius", "milo_ray/ssr/racing_bandit.py",
        "out = d.mean(axis=-1) + radius(d, level) < 0", "out = d.mean(axis=-1) < 0",
        ("tests/ssr/test_racing_new_rules.py::test_bandit_keeps_every_child_its_bound_cannot_separate_and_drops_a_clear_loser",),
        "the bandit rule drops near-ties on noise",
    ),
    Mutation(
        "stepwise-audit-ignores-stop", "milo_ray/ssr/audit_stepwise.py",
        "            if decision.stop:\n                break", "",
        ("tests/ssr/test_audit_stepwise.py::test_the_stepwise_replay_takes_the_races_decisions_within_budget",),
        "the audit's spend no longer matches the race's",
    ),
)


def _files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return [f for f in out if (root / f).is_file()]


def scratch_copy(dest: Path) -> Path:
    for f in _files(ROOT):
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, target)
    return dest


def apply(copy: Path, m: Mutation) -> None:
    path = copy / m.file
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"mutation {m.name}: expected exactly one occurrence of {m.old!r} in {m.file}, "
                         f"found {text.count(m.old)}; update the mutation list")
    path.write_text(text.replace(m.old, m.new))


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, float, str]:
    # A Ray temp dir of its own (short: Ray's socket paths are limited), so tests of two
    # mutations run at once never join each other's local Ray.
    ray_tmp = tempfile.mkdtemp(prefix="mr")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")]),
           "PYTHONDONTWRITEBYTECODE": "1", "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "", *tests],
                              cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, time.monotonic() - t0, "timed out"
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    tail = (proc.stdout.strip().splitlines() or [""])[-1]
    return proc.returncode, time.monotonic() - t0, tail


def check_import_location(copy: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    where = subprocess.run([sys.executable, "-c", "import milo_ray; print(milo_ray.__file__)"], cwd=copy, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"the scratch copy's milo_ray is shadowed by {where}; cannot check mutations")


def rotated(chosen: list[Mutation], rot) -> list[Mutation]:
    """The mutations a CI run checks under rotation ``rot`` (a ``ci_rotation.Rotation``)."""
    return [m for m in chosen if rot.checks_mutation(m.name, m.file)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run mutations whose name contains this text")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--no-baseline", action="store_true", help="skip running the unmutated tests first")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per pytest run")
    ap.add_argument("--jobs", type=int, default=1, help="mutations checked at once (each on its own copy and Ray)")
    ap.add_argument("--rotation", action="store_true",
                    help="only this commit's part (of 3) of the mutations, plus every mutation whose guarded "
                         "file the latest commits touched; any 3 consecutive commits check them all "
                         "(scripts/ci_rotation.py)")
    ap.add_argument("--part", type=int, default=None, help="with --rotation: this part instead of the commit's")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.only in m.name]
    if args.rotation:
        from ci_rotation import part_of, rotation_of  # scripts/ is on the path of a script run

        rot = rotation_of(ROOT)
        rot = rot if args.part is None else rot.with_part(args.part)
        every = chosen
        chosen = rotated(every, rot)
        extra = sum(part_of(m.name) != rot.part for m in chosen)
        print(f"rotation: {rot.why}; {len(chosen)} of {len(every)} mutations, {extra} of them because the "
              f"latest commits changed the file they break")
    if args.list:
        for m in chosen:
            print(f"{m.name:<26} {m.file}: {m.why}\n{'':<26} tests: {' '.join(m.tests)}")
        return 0
    print(f"command: python scripts/mutation_check.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    with tempfile.TemporaryDirectory(prefix="milo-mutation-") as tmp:
        def check(m: Mutation) -> tuple[str, str, float, str]:
            copy = scratch_copy(Path(tmp) / m.name)
            try:
                check_import_location(copy)
                if not args.no_baseline:
                    code, secs, tail = run_tests(copy, m.tests, args.timeout)
                    if code != 0:
                        print(f"{m.name}: the unmutated tests fail ({tail}); fix them first", flush=True)
                        return m.name, "BASELINE FAILS", secs, tail
                apply(copy, m)
                code, secs, tail = run_tests(copy, m.tests, args.timeout)
            finally:
                shutil.rmtree(copy, ignore_errors=True)
            verdict = "caught" if code == 1 else "MISSED" if code == 0 else f"error (pytest exit {code})"
            print(f"{m.name}: {verdict} in {secs:.0f} s ({tail})", flush=True)
            return m.name, verdict, secs, tail

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            rows = list(pool.map(check, chosen))  # the table keeps the list's order
    print()
    print("| mutation | verdict | seconds | pytest |\n|---|---|---|---|")
    for name, verdict, secs, tail in rows:
        print(f"| {name} | {verdict} | {secs:.0f} | {tail} |")
    caught = sum(r[1] == "caught" for r in rows)
    print(f"\n{caught}/{len(rows)} mutations caught")
    return 0 if caught == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
