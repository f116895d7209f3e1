"""Studies: a paper's measurements that need no FL or attack run (Refiner Fig. 3's
perturbations, ...). A target with ``study: {kind: ..., <parameters>}`` in place of
``select`` is one; ``gradleak study --name <t>`` (``experiment.phases.study``) writes its
rows (``metrics.json``) and its images (``<name>.npy``) under ``results/studies/<t>/``,
which ``rule target`` turns into the target's table and figure like any other rows.

A study is one module here: a function ``(config, results, params) -> StudyResult``
registered under its kind with ``registry.register``, its parameters, ``columns`` and
``metrics`` in the schema (``definitions.studies.<kind>``) and its import in ``kinds``.
This package imports nothing: a target job reads what a study wrote (``registry.load``)
without the studies' code.
"""
