"""The bench side: `python -m experiments.bench`, contenders that are run configurations, compared side by side
(the schedule, ratios, goals, tables and figures)."""
