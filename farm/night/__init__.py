"""A night: its pipeline (pipeline.py: NightPlan → run_night → Night), the review that judges it
(confirmation.py), the [tune] budget spent after it (tuning.py), the sweep file that describes it
(sweep_file.py)."""

__all__ = ["Night", "NightPlan", "run_night"]


def __getattr__(name: str):  # the pipeline on first use: importing confirmation.py needs none of it
    if name in __all__:
        from farm.night import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
