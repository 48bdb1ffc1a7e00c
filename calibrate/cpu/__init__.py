"""The calibration's probes of host effects, found on a CPU and measured each by a module of its own: what a
CPU calibration adds to the operations (prefill, decode, scoring, training) every calibration measures.

- ``pagefaults``: page faults of tensors above glibc's mmap threshold and the log-prob tail (CPU only);
- ``coldfixed``: a decode step's fixed costs after its weights swept the caches;
- ``gemm``: weight passes of a multi-row matrix product against one row, by cache footprint;
- ``widths``: the training rate by model width;
- ``corun``: co-running of actor and scorer in the intra-step hand-over pattern, per generation runtime;
- ``threadpool``: one OpenMP thread for the scorer thread on a CPU (used by ``corun`` and the executor's
  scorer), not a measurement.

Each probe writes the profile's ``kernels`` or ``interference.handover`` section, and runs only where the
calibration grid names its field (``calibrate.running.grid``: the CPU grids name them all; a GPU grid names ``gemm`` and
``widths`` at its own shapes). The simulator prices them from the profile (the terms of ``rlhfsim.costs.terms``).
They live apart from the calibration's product modules (``calibrate.running.run``, ``calibrate.genruntimes``, the
executor, the frameworks, validation) so that a reader sees which code a GPU calibration needs.
"""
