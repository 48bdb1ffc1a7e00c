"""Fitting: measured points to a Profile. ``fit`` (the roofline-with-efficiency fits with held-out error),
``assemble`` (points -> Profile: the fits, the measured terms, the quality verdict), ``quality`` (the verdict),
``stats`` (percentiles, bootstrap intervals and Welch's test over rounds), ``fromops`` (GPU kernel terms fitted to
published per-operation measurements)."""
