"""The public surface: every public module's ``__all__`` is pinned here, name for name, so it
changes only on purpose (edit this list in the same commit, and add a CHANGELOG line); the API
reference (``make docs``) documents exactly these modules."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

PUBLIC = {  # module -> its __all__, in order
    "slimdata": (
        "ConfigError InputError OutputExistsError PlanError SlimdataError TokenizerError "
        "__version__"
    ),
    "slimdata.cost": (
        "DEVICE_PRESETS LOSS_CHUNK_BYTES MODEL_PRESETS RECOMPUTE_POLICIES CostModel DeviceProfile "
        "Interconnect ModelConfig SliceCosts causal_pairs load_device load_model_config "
        "loss_chunk_tokens resolve_cost_model"
    ),
    "slimdata.plan": (
        "Document LockstepSchedule MergeGroup MicroPack RankExecution RankPlan RankStep Slice "
        "StepPlan check_lockstep execution lockstep_schedule loss_token_count rank_views "
        "split_calls validate_plan"
    ),
    "slimdata.solver": (
        "ALL_STRATEGIES OVERSIZE_POLICIES STRATEGIES STREAMS Layout PlanConfig SolveOptions apply_oversize "
        "make_batches plan_peak_memory solve"
    ),
    "slimdata.execution": (
        "COLLECTIVES INTERLEAVED_CHUNKS MEMORY Alloc Collective Compute ExecutionConfig Free "
        "PackCompute PackTimes "
        "Program Programs build_programs chunk_fractions common_order compute_levels levels "
        "pack_compute pack_prices pack_times padded peak stage_ops"
    ),
    "slimdata.sim": (
        "Comparison SimConfig SimResult StepBound StrategyStats compare_strategies format_table "
        "simulate_step step_bound"
    ),
    "slimdata.sim.gantt": "draw_gantt",
    "slimdata.sim.fidelity": "FidelityReport MeasuredTime fidelity_report load_measured_times",
    "slimdata.ingest": (
        "COLUMNS COST_COLUMNS DEFAULT_SIZE_LIMIT PLAN_NAME QUARANTINE_NAME SIDECAR_NAME BuildConfig "
        "BuildSummary build parse_size plan_build"
    ),
    "slimdata.docsource": "MANIFEST_NAME documents_from_lengths load_lengths load_shard_documents read_manifest",
    "slimdata.stats": "PERCENTILES THRESHOLDS format_stats load_lengths_frame shard_stats",
    "slimdata.plots": "write_plots write_training_plots",
    "slimdata.autocp": "HEAVY CpChoice cp_preference",
    "slimdata.localshards": "LocalShards",
    "slimdata.slicing": (
        "ALIGN DEFAULT_SLICE_TOKENS MAX_DOCUMENT_TOKENS check_cuts check_length check_slice_tokens "
        "cut_points cut_points_of slice_cuts"
    ),
    "slimdata.hooks": (
        "BalanceMeter Callback DocumentLoader ForwardFn LoaderConfig PackEvent PackTimeRecorder "
        "PlanShardLoader StepPayload StepSummary StepTelemetry checkpoint_layers hf_forward "
        "make_payload recompute_layer run_step selective_norm slice_attention swiglu_down"
    ),
}

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_are_exactly_the_pinned_ones(module):
    mod = importlib.import_module(module)
    assert list(mod.__all__) == PUBLIC[module].split()
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert missing == []


def test_the_simulator_exports_what_a_user_calls_not_its_building_blocks():
    import slimdata.sim as sim
    from slimdata.sim.compare import compare_strategies
    from slimdata.sim.step import simulate_step

    assert sim.simulate_step is simulate_step and sim.compare_strategies is compare_strategies
    for block in ("build_dag", "evaluate", "TaskGraph", "memory_profile", "cp_packs", "pack_times"):
        assert block not in sim.__all__ and not hasattr(sim, block), block


def test_the_api_reference_documents_exactly_the_public_modules():
    text = MAKEFILE.read_text().replace("\\\n", " ")
    line = re.search(r"^API_MODULES := (.*)$", text, re.MULTILINE)
    assert line is not None, "Makefile has no API_MODULES line"
    assert sorted(line.group(1).split()) == sorted(PUBLIC)
