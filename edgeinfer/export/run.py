"""``edgeinfer export``: source -> builder (convert, parity, candidates with their quality) ->
choice (the gate, the speed guard) -> package (staged, smoke inputs recorded, renamed into place).

Every stage is timed and reported through ``progress``; a failed check raises a typed error that
carries the report so far, and leaves nothing at the output path.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from edgeinfer import placement
from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import AccuracyGateError, ConfigError, ExportError, SlowerQuantizationError
from edgeinfer.export import package, registry, speed
from edgeinfer.export.builder import Builder
from edgeinfer.export.context import Candidate, ExportContext, ExportReport, Progress
from edgeinfer.export.options import ExportOptions
from edgeinfer.export.source import resolve_source
from edgeinfer.manifest import file_entries

__all__ = ["export"]

log = logging.getLogger(__name__)


def export(options: ExportOptions, *, progress: Progress | None = None) -> ExportReport:
    """Run the export described by ``options`` and return its report.

    Raises:
        ConfigError, MissingDependencyError, IntegrityError, ConversionError, ParityError,
        AccuracyGateError and SlowerQuantizationError and EpCoverageError (exit 1 in the CLI).
    """
    out = Path(options.out)
    if out.exists() and not options.overwrite:
        raise ConfigError(f"{out} already exists; pass --overwrite to replace it")
    partial = package.partial_path(out)
    shutil.rmtree(partial, ignore_errors=True)  # left by an export that was killed
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgeinfer-export-") as tmp, _quiet_libraries():
        work = Path(tmp)
        source = resolve_source(options.source, work=work)
        builder_type, task = registry.select(source, options)
        run = ExportContext(
            options,
            work=work,
            source=source,
            task=task,
            builder=builder_type.name,
            cpu_only=builder_type.cpu_only,
            progress=progress,
        )
        try:
            builder = builder_type(run)
            builder.build()
            with run.stage("gate"):
                chosen = choose(run, builder)
            with run.stage("package"):
                _write(run, builder, chosen, partial)
        except ExportError as exc:
            exc.report = run.report.to_dict()  # what was measured, for --json
            raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return run.report


def choose(run: ExportContext, builder: Builder) -> Candidate:
    """The variant to ship: the builder's preferred requested variant that passes the gate
    and is not slower than fp32 with confidence; else, with ``keep_best``, the most accurate
    variant that passes; else a typed error listing every problem."""
    wanted = [c for c in run.candidates.values() if c.requested]
    problems = {
        c.name: f"{c.measured.summary} misses the gate (max accuracy loss {run.max_accuracy_loss})"
        for c in wanted
        if not c.measured.passed
    }
    passing = [c for c in wanted if c.name not in problems]
    slower: str | None = None
    if passing:
        best = builder.prefer(passing)
        slower = _speed_guard(run, builder, best)
        if slower is None:
            run.report.chosen = best.name
            return best
        problems[best.name] = slower
    fallback = [c for c in run.candidates.values() if c.measured.passed and c.name not in problems]
    if run.keep_best and fallback:
        best = max(fallback, key=lambda c: c.measured.score)
        message = f"{'; '.join(problems.values())}; --keep-best kept {best.name}"
        run.report.warnings.append(message)
        log.warning("%s", message)
        run.report.chosen = best.name
        return best
    message = "; ".join(problems.values())
    if slower is not None:  # a variant passed the gate: speed alone kept it out
        raise SlowerQuantizationError(message)
    hint = "" if run.keep_best else "; pass --keep-best to ship the most accurate variant"
    raise AccuracyGateError(message + hint)


def _speed_guard(run: ExportContext, builder: Builder, best: Candidate) -> str | None:
    """None when ``best`` may ship; else why not (slower than fp32 with confidence)."""
    reference = run.candidates.get("fp32")
    if reference is None or best is reference or not run.options.target.startswith("cpu-"):
        return None
    candidate_probe, reference_probe = builder.probe(best), builder.probe(reference)
    if candidate_probe is None or reference_probe is None:
        return None
    measured = speed.compare(reference_probe, candidate_probe)
    run.note(best.name, speed=measured.to_dict())
    if not measured.slower:
        return None
    slower = f"{best.name} is slower than fp32 on this machine: {measured.describe()}"
    if run.options.force_quantize:
        run.report.warnings.append(f"{slower}; shipped anyway (--force-quantize)")
        return None
    return f"{slower}{builder.slower_hint(best)}; pass --force-quantize to ship it anyway"


def _write(run: ExportContext, builder: Builder, chosen: Candidate, partial: Path) -> None:
    """Stage the package in ``partial``, record its smoke check, check the placement, rename."""
    from edgeinfer.runtime import load, smoke

    report = (json.dumps(run.report.to_dict(), indent=2) + "\n").encode()
    manifest = package.stage(
        partial,
        files=chosen.files,
        fields=run.fields(chosen, builder.accuracy(chosen)),
        extra_files={**run.attachments, "report.json": report},
    )
    config = RuntimeConfig(threads=run.threads, spin_wait=False, warmup_runs=0, verify=False)
    with load(partial, config=config) as model:
        recorded, arrays = smoke.record(model, builder.smoke_inputs(chosen))
    files = manifest.files
    if arrays:
        smoke.write_arrays(partial / smoke.ARRAYS_NAME, arrays)
        files = {**files, **file_entries(partial, [smoke.ARRAYS_NAME])}
    replace(manifest, smoke=recorded, files=files).write(partial)
    if run.options.min_ep_coverage is not None:
        placement.gate(
            partial, providers=run.quant.providers, min_coverage=run.options.min_ep_coverage
        )
    package.commit(partial, Path(run.options.out), overwrite=run.options.overwrite)


class _DropRootWarnings(logging.Filter):
    """onnxruntime's quantizer reports every untyped tensor with ``logging.warning`` on the
    root logger (hundreds of lines for a fused graph); keep errors only. A filter on the root
    logger sees only records logged on it directly, so edgeinfer's own warnings still pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


@contextmanager
def _quiet_libraries() -> Iterator[None]:
    """Silence the export libraries' chatter (deprecation notes, tracer warnings, ORT's C++
    log) for the duration of an export; our stage lines and warnings stay."""
    import onnxruntime
    from transformers.utils import logging as hf_logging

    root_filter = _DropRootWarnings()
    optimum_logger = logging.getLogger("optimum")
    previous = (hf_logging.get_verbosity(), optimum_logger.level)
    logging.getLogger().addFilter(root_filter)
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    optimum_logger.setLevel(logging.ERROR)
    onnxruntime.set_default_logger_severity(3)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(root_filter)
        hf_logging.set_verbosity(previous[0])
        optimum_logger.setLevel(previous[1])
        onnxruntime.set_default_logger_severity(2)
