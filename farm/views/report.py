"""Render a single self-contained HTML report from the store (plots inlined as PNG)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jinja2

import farm
from farm.analysis.results import Run, Versus, run_rows, versus_reference
from farm.views.figures import figure_png, figure_pool, pyplot
from farm.views.review import PLOTTED_CELLS, format_metric, review_figures, stacked_png, sweep_review, worst_first
from farm.records import split_variant, utc_now
from farm.stats import format_bytes, format_duration, gb_per_s, memory_text, model_label, nonempty_median
from farm.store import Store
from farm.manifest import known, label as field_label, shown

FOLDED_ROWS = 60  # a longer table is folded (<details>): the summaries above it are what to read first
PROFILED_CELLS = 12  # cells drawn in "Where the time goes: kernels", the slowest profiled ones
TOP_KERNELS = 10
# each op class one colour in every kernel figure (TVM's and the reference's bars alike)
CLASS_COLOURS = {"conv": "tab:blue", "matmul/dense": "tab:orange", "pool": "tab:green", "elementwise": "tab:red",
                 "layout/copy/concat": "tab:purple", "reduction": "tab:brown", "other": "tab:gray",
                 "vm": "lightgray", "rest": "whitesmoke"}


def report_file(folder: str | Path, prefix: str = "report") -> Path:
    """Where a report goes when the user names no file: ``FOLDER/PREFIX-YYYYMMDD-HHMMSS.html`` (local time)."""
    import time

    return Path(folder) / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}.html"


def render_report(store: Store, out_path: str | Path, title: str = "farm report", sweep_id: int | None = None,
                  dashboard_url: str | None = None, history: list[Run] | None = None) -> Path:
    """Write the report for the latest run of every device × model, or with ``sweep_id`` that night's (and its
    alerts and findings); returns its path. ``history``: the store's runs as the night's review read them, when
    nothing was stored since (``review.sweep_review``)."""
    if sweep_id is None:
        latest, versus = versus_reference(run_rows(store, latest_only=True))
        failures = run_rows(store, status="failed")
    else:  # an old night's report shows that night's runs, not the latest ones (#64)
        latest, versus = versus_reference(latest_per_cell(run_rows(store, sweep_id=sweep_id)))
        failures = run_rows(store, status="failed", sweep_id=sweep_id)
    latest.sort(key=lambda r: (r.device, r.model, r.tuned))
    ok = [r for r in latest if r.status == "ok"]
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("farm.views", "templates"), autoescape=True, undefined=jinja2.StrictUndefined,
    )
    env.filters["ms"] = format_duration
    env.filters["bytes"] = lambda nbytes: format_bytes(nbytes, binary=True)  # copy sizes: powers of two
    env.filters["model_label"] = model_label  # {{ a.model|model_label(a.tuned) }}
    env.filters["memory"] = run_memory_text  # {{ r|memory }}
    env.filters["value"] = lambda value, metric: format_metric(metric, value)  # {{ a.value|value(a.metric) }}
    env.filters["manifest"] = manifest_text  # {{ manifests[r.manifest]|manifest }}
    curves = _copy_curves(store)
    alerts = sorted(store.alerts(sweep_id), key=worst_first) if sweep_id is not None else []
    profiled = profiled_cells(store, ok, versus)
    figures = 6 + len(profiled) + (review_figures(alerts) if sweep_id is not None else 0)
    with figure_pool(figures) as pool:  # drawn in worker processes where that is safe, while this goes on
        distribution = pool.submit(_distribution_png, _distribution_data(store, ok))
        phases = pool.submit(stacked_png, ok)
        copies = pool.submit(_copy_curves_png, curves) if curves else None
        compared = [v for v in versus.values() if v.ratio is not None]
        versus_png = pool.submit(_versus_png, _versus_data(compared)) if compared else None
        trajectories, coverage_drops = tuning_trajectories(store.trajectories())
        trajectories_png = pool.submit(_trajectories_png, trajectories) if trajectories else None
        memory = _memory_data(ok)
        memory_png = pool.submit(_memory_png, memory) if memory else None
        kernel_pngs = [pool.submit(kernels_png, cell) for cell in profiled]
        review = sweep_review(store, sweep_id, pool, history) if sweep_id is not None else None
        html = env.get_template("report.html").render(
            title=title, generated=utc_now(),
            farm_version=farm.__version__, tvm_versions=sorted({r.tvm_version for r in latest if r.tvm_version}),
            db_path=str(store.path), runs=latest, failures=failures, any_emulated=any(r.emulated for r in latest),
            distribution_png=distribution.result(), phases_png=phases.result(), cells_ok=len(ok),
            plotted_cells=PLOTTED_CELLS, folded_rows=FOLDED_ROWS,
            alerts=review["alerts"] if review is not None else alerts, sweep_id=sweep_id,
            review=review, variants=_variant_rows(latest),
            copy_curves=curves, copy_sizes=sorted({n for c in curves for _, n in c["by_size"]}),
            copy_curves_png=copies.result() if copies else "",
            versus=versus, versus_rows=[versus[r.run_id] for r in latest], versus_png=versus_png.result() if versus_png else "",
            memory_png=memory_png.result() if memory_png else "",
            trajectories=trajectories, coverage_drops=coverage_drops,
            trajectories_png=trajectories_png.result() if trajectories_png else "",
            profiled=[{**cell, "png": png.result()} for cell, png in zip(profiled, kernel_pngs)],
            profiled_cells=PROFILED_CELLS, profiled_ids={cell["run"].run_id for cell in profiled},
            manifests=store.manifests([r.manifest for r in latest]),
            series_url=series_url(dashboard_url),
        )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out_path)
    return out_path


def series_url(dashboard_url: str | None):
    """A run's series page on the lab's dashboard (``farm.views.pages``), or None without a dashboard URL."""
    if not dashboard_url:
        return None
    from urllib.parse import urlencode

    base = dashboard_url.rstrip("/")
    return lambda r: f"{base}/series?" + urlencode({"device": r.device, "model": r.model, "tuned": int(r.tuned),
                                                     "runtime": r.runtime})


def latest_per_cell(rows: list[Run]) -> list[Run]:
    """Each cell's (device, model, tuned, runtime) last run among ``rows``, newest first."""
    last: dict[tuple, Run] = {}
    for row in rows:
        key = (row.device, row.model, row.tuned, row.runtime)
        if key not in last or row.run_id > last[key].run_id:
            last[key] = row
    return sorted(last.values(), key=lambda r: -r.run_id)


def manifest_text(manifest: dict[str, Any]) -> str:
    """A run's manifest in one line, its known fields in ``farm.manifest.FIELDS``' order: "farm 0.1.0 · farm commit
    330910ed4b · TVM 0.27.0 · …"."""
    return " · ".join(f"{field_label(field)} {shown(field, value)}" for field, value in known(manifest).items())


def run_memory_text(run: Run) -> str:
    """A run's planned and measured memory in words (``stats.memory_text``)."""
    return memory_text(run.params_bytes, run.planned_host_bytes, run.planned_device_bytes, run.rss_peak_increase_bytes,
                       run.emulated)


def _memory_data(rows: list[Run], most: int = PLOTTED_CELLS) -> list[tuple[str, float, float, float | None]]:
    """(cell label, params MB, planned activations MB, peak RSS increase MB or None) per TVM cell with planned
    memory; with more than ``most`` cells, the ``most`` with the most parameters."""
    rows = [r for r in rows if not r.is_reference and r.params_bytes is not None]
    rows = sorted(sorted(rows, key=lambda r: -(r.params_bytes or 0))[:most], key=lambda r: (r.device, r.model, r.tuned))
    return [(f"{r.device} · {model_label(r.model, r.tuned)}" + (" (emulated)" if r.emulated else ""),
             (r.params_bytes or 0) / 1e6, (r.planned_bytes or 0) / 1e6,
             None if r.rss_peak_increase_bytes is None else r.rss_peak_increase_bytes / 1e6) for r in rows]


def _memory_png(data: list[tuple[str, float, float, float | None]]) -> str:
    """Per device × model: params, planned activations and measured peak RSS increase, grouped horizontal bars (MB)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.55 * len(data)))
    ys = range(len(data))

    def bars(values: list[float | None]) -> list[float]:  # log axis: nothing drawn for 0 or not measured
        return [v if v and v > 0 else float("nan") for v in values]

    ax.barh([y - 0.27 for y in ys], bars([p for _, p, _, _ in data]), height=0.27, label="params (planned)",
            color="tab:blue")
    ax.barh(list(ys), bars([a for _, _, a, _ in data]), height=0.27, label="activations (planned)", color="tab:green")
    ax.barh([y + 0.27 for y in ys], bars([r for *_, r in data]), height=0.27, color="tab:red",
            label="process peak RSS above its RSS before load (measured)")
    ax.set_xscale("log")
    low = min((v for _, *values in data for v in values if v and v > 0), default=1.0)
    for y, (*_, rss) in zip(ys, data):
        if rss is None:
            ax.text(low, y + 0.27, "not measured", va="center", fontsize=7, color="#555")
    ax.set_yticks(list(ys), [label for label, *_ in data], fontsize=7)
    ax.set_xlabel("MB (log scale)")
    ax.set_ylim(len(data) - 0.5, -0.6)
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3)
    ax.grid(True, axis="x", alpha=0.3)
    return figure_png(fig)


def _copy_curves(store: Store) -> list[dict[str, Any]]:
    """The latest copy curve per device, with each (direction, size)'s median and bandwidth."""
    curves = store.copy_curves(latest_only=True)
    for curve in curves:
        curve["clock"] = curve["context"].get("clock", "")
        curve["by_size"] = {}
        for point in curve["points"]:
            median_s = nonempty_median(point["samples_s"])
            curve["by_size"][(point["direction"], point["nbytes"])] = {
                "median_s": median_s, "gb_per_s": gb_per_s(point["nbytes"], median_s)}
    return sorted(curves, key=lambda c: c["device"])


def _copy_curves_png(curves: list[dict[str, Any]]) -> str:
    plt = pyplot()
    fig, (time_ax, rate_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    for curve in curves:
        for direction, style in (("d2h", "-o"), ("h2d", "--s")):
            points = sorted((n, p) for (d, n), p in curve["by_size"].items() if d == direction)
            if not points:
                continue
            label = f"{curve['device']} {'device→host' if direction == 'd2h' else 'host→device'}"
            sizes = [n for n, _ in points]
            time_ax.plot(sizes, [p["median_s"] * 1e6 for _, p in points], style, markersize=3, label=label)
            rate_ax.plot(sizes, [p["gb_per_s"] for _, p in points], style, markersize=3, label=label)
    for ax in (time_ax, rate_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes copied")
        ax.grid(True, alpha=0.3)
    time_ax.set_yscale("log")
    time_ax.set_ylabel("copy time (µs)")
    rate_ax.set_ylabel("effective bandwidth (GB/s)")
    rate_ax.legend(fontsize=7)
    return figure_png(fig)


def _variant_rows(rows: list[Run]) -> list[dict[str, Any]]:
    """Per device × base model with variants: fp32 / fp16 / int8 latency and drift side by side."""
    table: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        base, variant = split_variant(row.model)
        entry = table.setdefault((row.device, base, row.tuned), {"device": row.device, "model": base})
        entry[variant] = {"steady": row.steady_median_s, "drift": row.max_abs_err, "check": row.check}
    return [e for _, e in sorted(table.items()) if "fp16" in e or "int8" in e]


def _distribution_data(store: Store, rows: list[Run], most: int = PLOTTED_CELLS) -> list[tuple[str, list[float]]]:
    """(label, every stored repeat in ms) per cell; with more than ``most`` cells, the ``most`` most variable
    (highest CV)."""
    if len(rows) > most:
        rows = sorted(sorted(rows, key=lambda r: r.steady_cv or 0, reverse=True)[:most],
                      key=lambda r: (r.device, r.model, r.tuned))
    data = [(f"{r.device}\n{model_label(r.model, r.tuned)}", [v * 1000 for v in store.samples(r.run_id)]) for r in rows]
    return [(label, values) for label, values in data if values]


def _distribution_png(data: list[tuple[str, list[float]]]) -> str:
    if not data:
        return ""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(data)), 3.6))
    ax.boxplot([v for _, v in data], showfliers=False)
    for i, (_, values) in enumerate(data, start=1):
        ax.plot([i] * len(values), values, "o", alpha=0.4, markersize=3, color="tab:blue")
    ax.set_xticks(range(1, len(data) + 1), [label for label, _ in data], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("steady latency per call (ms)")
    return figure_png(fig)


TRAJECTORIES = 12  # cells whose per-night tuning trajectory is drawn (those furthest from their reference)


def tuning_trajectories(rows: list[dict[str, Any]], most: int = TRAJECTORIES,
                        ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per device × model × threads that was ever tuned, its nights (sweeps): TVM's steady median with the night's
    coverage (tuned tasks / tasks), TVM untuned where measured, the reference runtime's (given TVM's threads); the
    ``most`` furthest from their reference (else slowest) first. A change of threads starts another trajectory, as
    it starts another series (``series.context_of``). And every night whose coverage dropped from the night before
    (a TVM upgrade that found no records, a rejected record set): (cells, drops), from ``Store.trajectories`` rows."""
    cells: dict[tuple[str, str, int | None], dict[int, dict[str, Any]]] = {}
    for row in rows:  # oldest first: a night's last attempt wins
        night = cells.setdefault((row["device"], row["model"], row["threads"]), {}).setdefault(row["sweep_id"], {})
        night["reference" if row["runtime"] != "tvm" else "tuned" if row["tuned"] else "untuned"] = row
    trajectories: list[dict[str, Any]] = []
    drops: list[dict[str, Any]] = []
    for (device, model, threads), nights in cells.items():
        if not any("tuned" in n for n in nights.values()):
            continue
        points, previous = [], None
        for sweep_id in sorted(nights):
            night = nights[sweep_id]
            tvm = night.get("tuned") or night.get("untuned")
            coverage = tvm["tuned_tasks"] / tvm["total_tasks"] if tvm and tvm["total_tasks"] else 0.0
            if tvm and previous is not None and coverage < previous[0]:
                drops.append({"device": device, "model": model, "threads": threads, "sweep_id": sweep_id,
                              "before": previous[1], "after": f"{tvm['tuned_tasks']}/{tvm['total_tasks']}",
                              "tvm": f"{previous[2]} → {tvm['tvm_version']}" if previous[2] != tvm["tvm_version"]
                              else tvm["tvm_version"]})
            if tvm:
                previous = (coverage, f"{tvm['tuned_tasks']}/{tvm['total_tasks']}", tvm["tvm_version"])
            points.append({"sweep_id": sweep_id, "coverage": coverage,
                           **{kind: night[kind]["median"] if kind in night else None
                              for kind in ("tuned", "untuned", "reference")}})
        last = points[-1]
        tvm_last = last["tuned"] or last["untuned"]
        ratio = tvm_last / last["reference"] if tvm_last and last["reference"] else None
        trajectories.append({"device": device, "model": model, "threads": threads, "points": points, "ratio": ratio,
                             "last_s": tvm_last})
    trajectories.sort(key=lambda t: (-(t["ratio"] or 0.0), -(t["last_s"] or 0.0)))
    return trajectories[:most], drops


def _trajectories_png(cells: list[dict[str, Any]]) -> str:
    """Small multiples, one per device × model: ms per night (log) of TVM tuned (coverage at each point), TVM
    untuned and the reference runtime."""
    plt = pyplot()
    from matplotlib import ticker

    columns = min(3, len(cells))
    rows = math.ceil(len(cells) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.4 * rows), squeeze=False)
    for ax, cell in zip(axes.flat, cells):
        nights = [p["sweep_id"] for p in cell["points"]]
        for kind, style in (("untuned", dict(color="0.55", marker=".")), ("tuned", dict(color="tab:blue", marker="o")),
                            ("reference", dict(color="tab:orange", linestyle="--", marker="."))):
            xs = [n for n, p in zip(nights, cell["points"]) if p[kind]]
            ax.plot(xs, [p[kind] * 1000 for p in cell["points"] if p[kind]], label=kind, markersize=3, **style)
        for n, p in zip(nights, cell["points"]):
            if p["tuned"]:
                ax.annotate(f"{p['coverage']:.0%}", (n, p["tuned"] * 1000), fontsize=6, textcoords="offset points",
                            xytext=(0, 4), ha="center", color="tab:blue")
        ax.set_yscale("log")
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):  # 3.2, not 3.2×10⁰
            axis(ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))
        threads = "threads not known" if cell["threads"] is None else f"{cell['threads']} threads"
        ax.set_title(f"{cell['device']} · {cell['model']} · {threads}", fontsize=8)
        ax.tick_params(labelsize=6)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(cells):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.supxlabel("sweep (night)", fontsize=7)
    fig.supylabel("steady ms per call (log)", fontsize=7)
    fig.tight_layout()
    return figure_png(fig)


def _versus_data(rows: list[Versus], most: int = PLOTTED_CELLS) -> list[tuple[str, float, float, str]]:
    """(cell label, TVM ms, reference ms, runtime) per compared cell; the ``most`` furthest from their reference."""
    rows = sorted(rows, key=lambda v: -abs(math.log(v.ratio or 1.0)))[:most]
    return sorted(((f"{v.tvm.device} · {model_label(v.tvm.model, v.tvm.tuned)}", v.tvm.steady_median_s * 1000,
                    v.reference.steady_median_s * 1000, v.reference.runtime) for v in rows  # type: ignore[union-attr]
                   ), key=lambda row: row[0])


def _versus_png(data: list[tuple[str, float, float, str]]) -> str:
    """TVM against the reference runtime per device × model: paired horizontal bars, log time axis."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.45 * len(data)))
    ys = range(len(data))
    ax.barh([y + 0.2 for y in ys], [tvm for _, tvm, _, _ in data], height=0.4, label="TVM", color="tab:blue")
    ax.barh([y - 0.2 for y in ys], [ref for _, _, ref, _ in data], height=0.4, color="tab:orange",
            label=" / ".join(sorted({runtime for *_, runtime in data})) + " (reference)")
    for y, (_, tvm, ref, _) in zip(ys, data):
        ax.text(max(tvm, ref) * 1.1, y, f"{tvm / ref:.2g}×", va="center", fontsize=7)
    ax.set_yticks(list(ys), [label for label, *_ in data], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("steady latency per call (ms, log scale)")
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, axis="x", alpha=0.3)
    return figure_png(fig)


def profiled_cells(store: Store, ok: list[Run], versus: dict[int, Versus],
                   most: int = PROFILED_CELLS) -> list[dict[str, Any]]:
    """The latest TVM runs with a stored profile (the ``most`` slowest), each with its reference run's profile where it
    has one: the cell's label, its steady median, both profiles' op classes and its top kernels."""
    from farm.analysis.kernel_diff import class_versus

    tvm_runs = [r for r in ok if r.runtime == "tvm"]
    references = {r.run_id: v.reference for r in tvm_runs if (v := versus.get(r.run_id)) and v.reference is not None}
    profiles = store.profiles([r.run_id for r in tvm_runs] + [ref.run_id for ref in references.values()])
    cells = []
    for run in sorted((r for r in tvm_runs if r.run_id in profiles), key=lambda r: -(r.steady_median_s or 0.0))[:most]:
        profile = profiles[run.run_id]
        reference = references.get(run.run_id)
        ref_profile = profiles.get(reference.run_id) if reference is not None else None
        cell = {"run": run, "label": f"{run.device} · {model_label(run.model, run.tuned)}", "profile": profile,
                "reference": reference, "reference_profile": ref_profile, "classes": [], "top": []}
        if profile.status == "ok":
            usable = ref_profile if ref_profile is not None and ref_profile.status == "ok" else None
            cell["classes"] = class_versus(profile, usable) if usable else \
                [(c, t, 0.0) for c, t in profile.by_class().items() if c != "vm"]
            cell["top"] = [k for k in profile.top() if k.op_class != "vm"][:TOP_KERNELS]
        cells.append(cell)
    return cells


def kernels_png(cell: dict[str, Any]) -> str:
    """A profiled cell's time by op class: TVM's bar and the reference runtime's, stacked in the same colours, with
    TVM's VM calls and the rest of main (what lies between calls) at the end of its bar; '' without a profile."""
    profile, reference = cell["profile"], cell["reference_profile"]
    if profile.status != "ok":
        return ""
    bars = [("TVM", {**profile.by_class(), "rest": max(0.0, profile.main_s - sum(k.time_s for k in profile.kernels))})]
    if reference is not None and reference.status == "ok":
        bars.append((cell["reference"].runtime, {**reference.by_class(),
                                                 "rest": max(0.0, reference.main_s - reference.kernel_sum_s)}))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.7 + 0.45 * len(bars)))
    drawn: set[str] = set()
    for y, (_, classes) in enumerate(bars):
        left = 0.0
        for label in CLASS_COLOURS:
            width = classes.get(label, 0.0) * 1000
            if width <= 0:
                continue
            ax.barh(y, width, left=left, height=0.6, color=CLASS_COLOURS[label], edgecolor="white",
                    label=None if label in drawn else label)
            drawn.add(label)
            left += width
    ax.set_yticks(range(len(bars)), [name for name, _ in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time per run of main (ms)")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(bars) > 1 else -0.6))
    ax.grid(True, axis="x", alpha=0.3)
    return figure_png(fig)
