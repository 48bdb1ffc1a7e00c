"""Measuring: the points a calibration times on this device. ``bench`` (generation, chunked scoring, training,
interference), ``genbench`` (generation runtimes' prefill, decode, hand-over and padding points), ``sampling``
(the sampling tail per runtime), ``stepbench`` and ``advbench`` (a framework step's scalars, the driver's
advantage), ``scoring``, ``launch`` and ``interleave`` (scoring runtimes and batching strategies, timed in
alternating rounds, in fresh processes when asked), ``reencode`` and ``retokenize`` (re-encoding and re-tokenizing
for a reward model), ``measure`` (the timing discipline), ``decoder`` and ``models`` (what is timed), ``device_info``
and ``devstate`` (what it was measured on, and in which state). The CPU host-effect probes are in ``calibrate.cpu``,
the runtimes in ``calibrate.runtimes`` and ``calibrate.genruntimes``."""
