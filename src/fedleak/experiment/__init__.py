"""The experiment layer: one validated configuration and one job identity (case, setting,
seed) in, one pipeline phase run (``phases``); what a configuration plans (``plan``),
where its artifacts live (``paths``) and which artifacts each job loads (``artifacts``)."""

from fedleak.experiment import artifacts, paths, phases, plan

__all__ = ["artifacts", "paths", "phases", "plan"]
