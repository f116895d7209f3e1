"""The experiment layer: one validated configuration and one job identity in, one pipeline
phase run (``experiment.phases``, one module per phase); what a configuration plans
(``plan``, ``pipeline``), where its artifacts live (``paths``) and which artifacts each job
loads (``artifacts``)."""
