"""``edgeinfer inspect PKG``: the manifest, a checksum verification and this device's providers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from edgeinfer.cli.common import console, print_json
from edgeinfer.errors import ConfigError

if TYPE_CHECKING:
    from edgeinfer.placement import PlacementReport

__all__ = ["inspect"]


def inspect(
    package: Annotated[Path, typer.Argument(help="package folder")],
    json_output: Annotated[bool, typer.Option("--json", help="print as JSON")] = False,
    placement: Annotated[
        bool, typer.Option("--placement", help="report which provider takes which nodes")
    ] = False,
    providers_opt: Annotated[
        str | None,
        typer.Option("--providers", help="for --placement, e.g. openvino,cpu"),
    ] = None,
    footprint: Annotated[
        bool,
        typer.Option(
            "--footprint", help="measure a process serving it (RSS) and the installed runtime"
        ),
    ] = False,
    file_backed_prepacks: Annotated[
        bool,
        typer.Option(
            "--file-backed-prepacks", help="for --footprint: serve it with file-backed prepacks"
        ),
    ] = False,
) -> None:
    """Show a package's manifest, verify every file's sha256, list this device's providers."""
    from edgeinfer import providers
    from edgeinfer.manifest import Manifest

    manifest = Manifest.read(package)
    manifest.verify(package)  # raises IntegrityError (exit 2) on the first mismatch
    info: dict[str, Any] = {
        "package": str(package),
        "digest": manifest.digest,
        "verified": True,
        "available_providers": providers.available(),
        "manifest": manifest.to_dict(),
    }
    form = _prompt_form(manifest.io)
    if form is not None:
        info["prompt_form"] = form
    if providers_opt and not placement:
        raise ConfigError("--providers is for the placement report: add --placement")
    # Default: the package's preferred providers, in order.
    report = _placement(package, manifest.providers, providers_opt) if placement else None
    if report is not None:
        info["placement"] = report.to_dict()
    if file_backed_prepacks and not footprint:
        raise ConfigError("--file-backed-prepacks is for the footprint: add --footprint")
    found = _footprint(package, file_backed_prepacks) if footprint else None
    if found is not None:
        info["footprint"] = found
    if json_output:
        print_json(info)
        return
    table = Table(title=f"{package} ({manifest.name}, {manifest.task})", show_header=False)
    rows = [
        ("precision", f"{manifest.precision} ({manifest.quantization.get('mode')})"),
        ("target", manifest.target),
        ("accuracy", _accuracy_line(manifest.accuracy)),
        ("kind", manifest.io.kind),
        ("inputs", ", ".join(i.name for i in manifest.io.inputs)),
        ("max_seq_len", str(getattr(manifest.io, "max_seq_len", None) or "- (no text input)")),
        ("files", ", ".join(f"{n} ({e.bytes / 1e6:.1f} MB)" for n, e in manifest.files.items())),
        ("checksums", "verified"),
        ("preferred providers", ", ".join(manifest.providers)),
        ("available here", ", ".join(info["available_providers"])),
    ]
    if form is not None:
        rows.insert(5, ("prompt form", _PROMPT_FORMS[form]))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if report is not None:
        console.print(_placement_table(report))
    if found is not None:
        console.print(_footprint_table(found))


_PROMPT_FORMS = {
    "messages": "messages (a chat template: send 'messages', or 'prompt' with \"chat\": true; "
    "a bare 'prompt' is continued as raw text)",
    "prompt": "prompt (no chat template: plain text is continued)",
}


def _prompt_form(io: Any) -> str | None:
    """A generate package's request form: ``messages`` with a chat template, else ``prompt``."""
    if io.kind != "decoder":
        return None
    return "messages" if getattr(io, "chat_format", None) is not None else "prompt"


def _accuracy_line(accuracy: dict[str, Any]) -> str:
    """The gate's measured value in one line: a number (early-exit packages), or a dict of
    numbers (mean/min for embeddings and classifiers, perplexity/agreement for generation)."""
    value = accuracy.get("value")
    if isinstance(value, dict):
        shown = ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in value.items()
            if k not in ("metric", "passed")
        )
    else:
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
    return f"{accuracy.get('metric')}: {shown} (vs {accuracy.get('reference')})"


def _placement(package: Path, preferred: list[str], providers_opt: str | None) -> PlacementReport:
    from edgeinfer.placement import placement

    names = providers_opt.split(",") if providers_opt else preferred
    return placement(package, providers=[n.strip() for n in names if n.strip()])


def _placement_table(report: PlacementReport) -> Table:
    table = Table(title=f"placement on {', '.join(report.providers)} (onnxruntime's own record)")
    for column in ("provider", "nodes", "subgraphs", "node share", "FLOPs share (est.)", "ops"):
        table.add_column(column)
    for share in report.shares:
        ops = ", ".join(f"{op} {n}" for op, n in sorted(share.op_types.items()))
        table.add_row(
            share.provider,
            str(share.nodes),
            str(share.subgraphs),
            f"{report.node_coverage(share.provider):.1%}",
            f"{report.coverage(share.provider):.1%}",
            ops,
        )
    return table


def _footprint(package: Path, file_backed_prepacks: bool) -> dict[str, Any]:
    """RSS of a fresh process serving ``package``; installed size of what the runtime needs."""
    from edgeinfer.bench import footprint, installed

    serving = footprint.measure_serving_in_subprocess(
        package, file_backed_prepacks=file_backed_prepacks
    )
    closure = installed.distribution_sizes(installed.requirement_closure())
    imported = {d.name for d in serving.distributions}
    return {
        "serving": serving.to_dict(),
        "requirement": installed.RUNTIME_REQUIREMENT,
        "requirement_bytes": sum(d.bytes for d in closure),
        "not_imported": [vars(d) for d in closure if d.name not in imported],
    }


# The serving RSS by what holds it, in the order a user sizing a board reads it.
_BREAKDOWN_ROWS = (
    ("file_weights", "file-backed weights"),
    ("anonymous_weights", "anonymous weights/prepacks, arena, heap"),
    ("kv_cache", "KV cache (the request's tokens)"),
    ("tokenizer", "tokenizer"),
    ("runtime_and_python", "runtime and Python"),
    ("other_files", "library pages touched serving"),
)


def _footprint_table(found: dict[str, Any]) -> Table:
    from rich.markup import escape

    serving, mb = found["serving"], 1e6
    table = Table(title=f"footprint on {serving['machine']} (MB = 10^6 bytes)", show_header=False)
    avoidable = found["not_imported"]
    rows = [
        ("RSS serving", f"{serving['serving']['rss_bytes'] / mb:.0f} MB"),
        ("peak RSS", f"{serving['serving']['peak_rss_bytes'] / mb:.0f} MB"),
        *(
            (f"  {label}", f"{serving['breakdown'][key] / mb:.1f} MB")
            for key, label in _BREAKDOWN_ROWS
        ),
        ("KV per token", f"{serving['breakdown']['kv_bytes_per_token'] / 1e3:.1f} kB"),
        (
            "runtime installed",
            f"{serving['installed_bytes'] / mb:.1f} MB: "
            + ", ".join(f"{d['name']} {d['bytes'] / mb:.1f}" for d in serving["distributions"]),
        ),
        (escape(found["requirement"]), f"{found['requirement_bytes'] / mb:.1f} MB installed here"),
        (
            "not imported by the runtime",
            f"{sum(d['bytes'] for d in avoidable) / mb:.1f} MB: "
            + ", ".join(d["name"] for d in avoidable[:8])
            + (", ..." if len(avoidable) > 8 else ""),
        ),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table
