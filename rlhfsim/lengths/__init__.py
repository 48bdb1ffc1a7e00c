"""Real rollout logs as workload input: ``rlhfsim lengths import`` turns TRL completion logs, verl rollout
dumps and plain CSV/JSONL/Parquet tables into a ``trace`` file (``rlhfsim.workload.trace``: per step, per
prompt, per rollout, prompt and response lengths paired) or an ``empirical`` one (response lengths), and
``rlhfsim lengths report`` shows the imported distribution beside lognormal and Pareto fits.

Modules: ``importers`` (the formats), ``fit`` (scipy fits in scenario terms), ``cli`` (the click group).
Torch-free; transformers is imported only to count text with a local tokenizer.
"""
