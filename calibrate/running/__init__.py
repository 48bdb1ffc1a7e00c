"""Running a calibration: ``run`` (one calibration, ``run_calibration``), ``grid`` (what is measured),
``session`` (the measuring context), ``journal`` (crash-safe JSONL of measured points), ``progress`` (the
display), ``extend`` (a measured profile extended with more operations or terms, ``python -m
calibrate.running.extend``), ``report`` (a profile's comparison tables)."""
