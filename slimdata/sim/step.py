"""Simulate one training step of a plan: the entry point of the simulator core.

Modelling assumptions (the simulator's contract, design §7):

- Compute: pack times are recomputed from the cost model (sum over the pack's slices, design
  §5), never taken from ``MicroPack.cost``; a pipeline chunk with ``k`` of ``L`` layers takes
  ``k / L`` of the full-model time. Kernels of one device run one at a time; a device's packs
  run in the order of the pipeline schedule (:mod:`slimdata.execution.schedule`), with ``pp == 1``
  exactly ``RankStep.order``.
- Dependencies: slice continuation (design §4), the pipeline (chunk ``c`` after ``c - 1`` in
  the forward, reversed in the backward) and each device's order. Work never starts early
  and devices never run ahead of their order (a static schedule, as the runtime executes).
- Collectives synchronize their members (alpha-beta times, intra- vs inter-node bandwidth by
  ``Layout.ranks_per_node``): DDP's all-reduce closes the step; its buckets stream out
  during every rank's last backward pack, so it ends no earlier than the latest last-pack
  start plus the all-reduce time, nor than the latest last-pack end plus latency; FSDP all-gathers parameters before every pack and
  reduce-scatters gradients after every backward pack, overlapped with that pack's compute,
  so all DP ranks advance pack by pack at the slowest rank's pace; a merge pack (DP-Merge,
  ``dcp``) pays the per-layer K/V exchange of the one context-parallel cost model
  (:mod:`slimdata.sim.cp`: overlapped only with that layer's attention) and its members
  leave together. Pipeline sends are edge lags on separate streams.
- Memory: see :mod:`slimdata.sim.memory`. Optimizer step, data loading, and tensor
  parallelism inside a rank are not modelled.
- Static context parallelism (``SimConfig.cp = k``): a plan solved for ``dp / k`` DP groups
  runs on ``Layout.dp`` devices, every pack split over ``k`` devices with a per-layer K/V
  exchange, priced by the same model; see :mod:`slimdata.sim.cp`. ``k = 1`` is the plain
  model.
- A plan runs under the schedule, model chunks per device and static CP it records
  (:meth:`SimConfig.for_plan`): the execution its estimate and memory were solved for.
"""

from __future__ import annotations

from slimdata.cost import CostModel
from slimdata.errors import PlanError
from slimdata.execution import build_programs
from slimdata.plan import StepPlan
from slimdata.sim.config import SimConfig
from slimdata.sim.dag import Durations, build_dag
from slimdata.sim.engine import evaluate
from slimdata.sim.memory import memory_profile
from slimdata.sim.results import SimResult, summarize
from slimdata.solver.layout import Layout

__all__ = ["simulate_step"]


def simulate_step(
    plan: StepPlan,
    cost: CostModel,
    layout: Layout,
    config: SimConfig | None = None,
    *,
    durations: Durations | None = None,
) -> SimResult:
    """Simulate ``plan`` on ``layout`` (``layout.dp`` must equal ``plan.dp * config.cp``).

    The plan runs under the pipeline schedule, model chunks per device and static CP it was
    solved for where it records them, ``config``'s (or the defaults) where it does not
    (:meth:`SimConfig.for_plan`, which raises :class:`PlanError` when ``config`` sets one the
    plan contradicts). ``durations`` replaces predicted pack times by measured ones
    (``(chunk, rank, pass, pack) -> seconds``), e.g. to replay a step recorded by the runtime.
    """
    config = (config or SimConfig()).for_plan(plan)
    assert config.cp is not None  # set by for_plan
    if layout.dp != plan.dp * config.cp:
        raise PlanError(
            f"plan has {plan.dp} DP ranks x cp={config.cp} but the layout has dp={layout.dp}; "
            f"solve the plan for dp={layout.dp // config.cp} DP groups of this layout"
        )
    programs = build_programs(plan, cost, config.execution(layout.pp))
    dag = build_dag(
        plan,
        cost,
        programs,
        ranks_per_node=layout.ranks_per_node,
        config=config,
        durations=durations,
    )
    timing = evaluate(dag.graph)
    mem = memory_profile(dag, timing)
    return summarize(dag, timing, mem, layout.memory_bytes)
