"""``rlhfsim validate``: run real small RLHF steps on the local device and put measured next to predicted.

For each scenario:
  1. Load it (it must describe the local device: ``cluster.gpu: cpu`` with one device for ``--device
     cpu``; one GPU with ``--device cuda``) and draw its rollouts (prompt and response lengths) from the
     simulator's own seeded stream (``scenario``).
  2. Run the real steps with ``calibrate.executor`` on exactly those lengths, the scenarios' steps
     round-robin (``run_interleaved``; ``--sequential``, the default with ``--generate``: one scenario
     after another) (``run``).
  3. Simulate the same scenario on the same lengths with a calibrated profile (``--profile``, or a quick
     calibration of exactly the scenario's models, cached; when measured, its passes alternate with
     blocks of the real steps; shapes outside the catalog get the lean grid of ``operating_points``),
     which never sees the validation runs. Comma-separated profiles (``quick`` naming that calibration,
     ``generic`` the quick generic calibration of this CPU, ``measure_generic``, its passes alternating
     with blocks of the real steps too) each predict the same measured steps (``calibration``).
  4. Compare the steady-state mean step time and each phase's mean span (warm-up steps excluded):
     error_pct = 100 x (predicted - measured) / measured (``compare``).
  5. Find where generation's time goes (and, under intra-step streaming, the scorer's: each scorer call
     the executor timed, ``chunk_prefill`` or ``rescore``, priced alone at its shape, ``scoring_ops``):
     every generation operation the executor timed inside the real steps (a prefill call, a decode step, a
     ``generate()`` call; ``StepLog.op``, with its shape) is priced with the profile at that shape by the
     simulator's own pricing (``rlhfsim.costs.price``), and summed per operation (``operations``); the
     generate span not covered by any operation is host work between operations (token bookkeeping, the
     scorer handoff), which the simulator does not price. The other phases' calls (each reward, reference
     and critic forward piece, each training minibatch) are priced the same way (``phase_operations``,
     ``phase_ops``), each phase's first call apart (``compare``).
  6. On CPU, check the machine's state around the steps against each profile's, and mark a scenario
     inconclusive when they differ beyond tolerance (``devcheck``); print the tables (``tables``).

Modules: ``cli`` (the click command), ``run`` (orchestration), ``scenario`` (the executor's config and the
rollouts), ``calibration`` (the quick and generic calibrations and their cache), ``compare`` (measured
against predicted, per step, phase and in-step call), ``devcheck``, ``tables``, ``generated`` (``--generate``:
drawn scenarios) and ``trl`` (``--framework trl``: TRL's trainers against the simulator).

Needs both sides (torch for the executor; pydantic and simpy for the simulator).
"""
