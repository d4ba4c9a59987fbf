"""``slimdata profile``: options into a :class:`ProfileConfig`, then the runtime's profiler
(:func:`slimdata.hooks.profile.write_profile`), imported only when a profile runs so that
``--help`` does not load torch."""

from __future__ import annotations

from importlib import import_module

import click

from slimdata.cli.options import renamed_option, writable_file
from slimdata.cost.profiling import ProfileConfig
from slimdata.errors import ConfigError

__all__ = ["command"]


class IntList(click.ParamType):
    """A comma list of distinct integers from ``low`` to :data:`MAX_GRID` (a profile grid's
    sizes, e.g. ``32,64,128``)."""

    name = "list"

    def __init__(self, low: int) -> None:
        self.low = low

    def convert(self, value, param, ctx) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        items = [x.strip() for x in str(value).split(",")]
        if not all(items):
            self.fail(f"{value!r}: an empty item (write e.g. 32,64,128)", param, ctx)
        try:
            out = tuple(int(x) for x in items)
        except ValueError:
            self.fail(f"{value!r}: not a comma list of integers (e.g. 32,64,128)", param, ctx)
        if min(out) < self.low or max(out) > MAX_GRID:
            self.fail(f"{value!r}: each must be from {self.low} to {MAX_GRID:,}", param, ctx)
        if len(set(out)) < len(out):
            self.fail(f"{value!r}: a size is listed twice", param, ctx)
        return out


MAX_GRID = 1 << 20
"""The largest slice length, prefix or pack size a profile grid takes (a point of more tokens
than a device holds ends the profile out of memory; ``--max-point-tokens`` skips points)."""


@click.command("profile")
@click.option(
    "--model",
    "model_spec",
    required=True,
    help="Model preset (slimdata.cost) or a JSON config path.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False),
    callback=writable_file,
    required=True,
    help="Cost profile JSON to write.",
)
@click.option(
    "--torch-device",
    "device",
    default="cpu",
    show_default=True,
    help="torch device to measure on (cpu, cuda, cuda:1).",
)
@renamed_option("--device", "device", "--torch-device")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default="float32",
    show_default=True,
)
@click.option(
    "--backend",
    default="auto",
    show_default=True,
    help="Attention backend: auto (flash-attn or torch varlen on a GPU in bf16/fp16, else sdpa), sdpa, torch-varlen, flash.",
)
@click.option(
    "--slice-tokens",
    type=IntList(1),
    default="32,64,128,256,512",
    show_default=True,
    help="Slice lengths to time.",
)
@click.option(
    "--prefixes",
    type=IntList(0),
    default="0,256,1024",
    show_default=True,
    help="Prefix lengths to time.",
)
@click.option(
    "--pack-sizes",
    type=IntList(1),
    default="1,4",
    show_default=True,
    help="Slices per measured pack.",
)
@click.option("--repeats", default=3, show_default=True, help="Timed runs per point.")
@click.option(
    "--lead-packs",
    default=ProfileConfig.lead_packs,
    show_default=True,
    help="Identical packs of the same step run before each measured one.",
)
@click.option(
    "--calibration-plans",
    default=ProfileConfig.calibration_plans,
    show_default=True,
    help="slimpack plans run with the grid to calibrate the fit to in-plan pack times (0: none).",
)
@click.option(
    "--measure-memory/--no-measure-memory",
    default=True,
    show_default=True,
    help="Measure the activation bytes per token on this device (else the analytic value).",
)
@click.option(
    "--max-point-tokens",
    type=int,
    default=None,
    help="Skip grid points holding more tokens than this (k x (prefix + slice)): reach large"
    " packs without running out of device memory.",
)
@click.option(
    "--stat",
    type=click.Choice(["median", "min"]),
    default="median",
    show_default=True,
    help="Statistic over repeats (min is robust on a busy machine).",
)
@click.option(
    "--measurements",
    type=click.Path(dir_okay=False),
    callback=writable_file,
    default=None,
    help="Also write the raw timings (JSON).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def command(
    model_spec,
    output,
    device,
    dtype,
    backend,
    slice_tokens,
    prefixes,
    pack_sizes,
    repeats,
    lead_packs,
    calibration_plans,
    measure_memory,
    max_point_tokens,
    stat,
    measurements,
    quiet,
) -> None:
    """Measure forward/backward time of slices on this device and fit cost-model coefficients.

    \b
    Example (the profile then feeds --cost-profile of build, plan and simulate):
        slimdata profile --model llama-1b --torch-device cuda --dtype bfloat16 -o profile.json
    """
    _check_torch_device(device)
    config = ProfileConfig(
        slice_tokens=slice_tokens,
        prefixes=prefixes,
        pack_sizes=pack_sizes,
        repeats=repeats,
        lead_packs=lead_packs,
        calibration_plans=calibration_plans,
        max_point_tokens=max_point_tokens,
        measure_memory=measure_memory,
        device=device,
        dtype=dtype,
        backend=backend,
        stat=stat,
    )
    runtime = import_module("slimdata.hooks.profile")  # torch: only when a profile runs
    click.echo(runtime.write_profile(model_spec, output, config, measurements, not quiet))


def _check_torch_device(device: str) -> None:
    """A --torch-device that torch can name and that this machine has."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(
            f"--torch-device {device!r} is not a torch device (cpu, cuda, cuda:1)"
        ) from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"--torch-device {device}: this machine has no CUDA device")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"--torch-device {device}: this machine has {count} CUDA device(s)")
    elif dev.type != "cpu":
        raise ConfigError(f"--torch-device {device}: profile measures on cpu or cuda")
