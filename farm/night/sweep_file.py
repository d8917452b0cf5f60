"""A sweep file (``farm sweep --file nightly.toml``) as a frozen record, every value checked before any work: the
file's schema, a domain rule the CLI reads (``farm sweep --file``), not one of its own. Its [tune] keys are
``TuneBudget``'s fields, read from the record, never listed by hand."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.records import BenchConfig
from farm.tune.config import DEFAULT_TRIALS, TuneBudget

# BenchConfig's fields, as a sweep file's [bench] writes them: a number, whole unless the field is a float
BENCH_KEYS = {f.name: float if "float" in str(f.type) else bool if "bool" in str(f.type) else int
              for f in fields(BenchConfig) if f.name != "profile_share"}  # the share: how farm sweep profiles by default
POSITIVE_BENCH_KEYS = ("repeat", "number", "copy_repeat", "timeout_s")  # the others may be 0
SWEEP_FILE_HINT = ('a sweep file: devices = ["cpu"], models = ["mlp"], variants = ["fp32"], reference = "mlp", '
                   "[bench] repeat = 20, profile = true, [shapes.MODEL] input = [1, 3, 224, 224]")
TUNE_KEYS = tuple(f.name for f in fields(TuneBudget))
TUNE_HINT = (f"[tune] minutes = 20 (per device key, after measuring), trials = {DEFAULT_TRIALS} (per model at most), "
             'models = 2 and devices = ["x86-local"] (both optional)')


@dataclass(frozen=True)
class SweepFile:
    """What a sweep file says. An empty field is one it leaves to the command line, then to SweepSpec's default."""

    devices: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()
    reference: str | None = None  # "" or "none": no reference model
    bench: dict[str, Any] = field(default_factory=dict)  # BenchConfig fields it overrides: numbers, checked
    shapes: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)  # model -> {input name: shape}
    tune: dict[str, Any] | None = None  # [tune]: the keyword arguments of TuneBudget
    # profile = true: every cell profiled ([bench] profile); profile = ["mate10", "resnet50"]: the cells of those
    # devices and models only; None: not said (farm sweep profiles every cell by default)
    profile: bool | tuple[str, ...] | None = None


def load_sweep_file(path: str) -> SweepFile:
    """The sweep file, every value checked: a wrong key or type is one error naming it, before any work."""
    data = _read_toml(path)
    keys = [f.name for f in fields(SweepFile)]
    unknown = set(data) - set(keys)
    if unknown:
        raise FarmError(f"{path}: unknown key {sorted(unknown)[0]!r}",
                        "allowed: devices, models, variants, reference, profile, [bench], [shapes.MODEL], [tune]")
    tune = _check_tune(path, data)

    def bad(what: str) -> FarmError:
        return FarmError(f"{path}: {what}", SWEEP_FILE_HINT)

    for key in ("devices", "models", "variants"):
        if key in data and not (isinstance(data[key], list) and all(isinstance(v, str) for v in data[key])):
            raise bad(f"{key} must be a list of names")
    profile = data.get("profile")
    listed = isinstance(profile, list) and all(isinstance(v, str) for v in profile)
    if not (profile is None or isinstance(profile, bool) or listed):
        raise bad('profile must be true, false or a list of device and model names: profile = ["mate10", "resnet50"]')
    if "reference" in data and not isinstance(data["reference"], str):
        raise bad('reference must be a model name (or "none")')
    bench = data.get("bench", {})
    if not isinstance(bench, dict):
        raise bad("bench must be a table: [bench]")
    for key, value in bench.items():
        if key not in BENCH_KEYS:
            raise FarmError(f"{path}: unknown [bench] key {key!r}", f"allowed: {', '.join(BENCH_KEYS)}")
        kind = BENCH_KEYS[key]
        if kind is bool:
            if not isinstance(value, bool):
                raise bad(f"[bench] {key} = {value!r} is not true or false")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value < 0 \
                or (value == 0 and key in POSITIVE_BENCH_KEYS):
            raise bad(f"[bench] {key} = {value!r} is not a {'positive ' if key != 'seed' else ''}"
                      f"{'whole number' if kind is int else 'number'}")
    shapes = data.get("shapes", {})
    for model, inputs in shapes.items() if isinstance(shapes, dict) else [(None, None)]:
        if not isinstance(inputs, dict) or not all(
                isinstance(dims, list) and dims and all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                         for d in dims) for dims in inputs.values()):
            raise bad(f"[shapes.{model}] must map input names to lists of positive whole numbers")
    return SweepFile(devices=tuple(data.get("devices", ())), models=tuple(data.get("models", ())),
                     variants=tuple(data.get("variants", ())), reference=data.get("reference"), bench=dict(bench),
                     shapes={m: {k: tuple(v) for k, v in d.items()} for m, d in shapes.items()}, tune=tune,
                     profile=profile if profile is None or isinstance(profile, bool) else tuple(profile))


def _read_toml(path: str) -> dict[str, Any]:
    import tomllib

    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise FarmError(f"sweep file {path} does not exist", "write devices = [...] and models = [...] in a TOML file") from exc
    except UnicodeDecodeError as exc:
        raise FarmError(f"{path}: not a TOML file (not UTF-8 text)", "pass the sweep file (TOML)") from exc
    except OSError as exc:
        raise FarmError(f"cannot read sweep file {path}: {exc.strerror or exc}", "pass a readable TOML file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise FarmError(f"{path}: not valid TOML: {exc}", "fix the syntax at that line") from exc


def _check_tune(path: str, data: dict[str, Any]) -> dict[str, Any] | None:
    """[tune], checked, as TuneBudget's keyword arguments (None when the file has no [tune])."""
    tune = data.get("tune", {})
    if not isinstance(tune, dict) or set(tune) - set(TUNE_KEYS):
        raise FarmError(f"{path}: [tune] takes {', '.join(TUNE_KEYS[:-1])} and {TUNE_KEYS[-1]}", TUNE_HINT)
    if "tune" not in data:
        return None
    minutes = tune.get("minutes")
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or minutes <= 0:
        raise FarmError(f"{path}: [tune] minutes = {minutes!r} is not a positive number", TUNE_HINT)
    for key in ("trials", "models"):
        value = tune.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise FarmError(f"{path}: [tune] {key} = {value!r} is not a positive whole number", TUNE_HINT)
    if not (isinstance(tune.get("devices", []), list) and all(isinstance(v, str) for v in tune.get("devices", []))):
        raise FarmError(f"{path}: [tune] devices must be a list of names", TUNE_HINT)
    return {**tune, "minutes": float(minutes), "devices": tuple(tune.get("devices", ()))}
