"""A per-iteration SimPy model of one step's generation: the peer ``benchmarks/sim_speed.py`` times rlhfsim
against.

Granularity is Vidur's: one SimPy event per engine iteration per replica (a prefill call, or one decode
step of the whole batch). It simulates the same thing as rlhfsim's continuous engine on a synchronous
step, so the two can be compared honestly:

* the same rollouts (``(prompt_len, response_len)`` sampled by rlhfsim's own stream with the same seed),
  dealt the same way (replica i takes ``rollouts[i::replicas]``);
* the same slots (``generation.max_batch``), KV capacity, admission watermark (1% of the cache, one token of
  room per live row) and recompute preemption of the newest row when the next step would not fit;
* the same costs: a prefill call per admitted row priced by ``CostModel.forward`` (prompt plus any
  tokens generated before a preemption), its first token from the prefill's logits, then one decode step
  per iteration at ``max(compute, memory) + overhead`` from ``CostModel.decoder(...).coeffs``.

It is written to be lean, not naive: the decode cost is linear in the cached tokens, so its constants are
taken from ``CostModel.decoder(...).coeffs`` once per batch size and an iteration costs a few float operations; rows wait
for their last iteration in a heap (O(log batch) per finishing row, nothing per row per iteration); prefill
costs are cached per token count. What it cannot skip is the event per iteration: that is the
granularity being compared. The generation span it returns equals rlhfsim's ``generate`` phase (to
floating-point rounding), which ``sim_speed.py`` checks on every run.

    python benchmarks/periter_peer.py [--rollouts 1024]      # one run: span, iterations, CPU time
"""

from __future__ import annotations

import argparse
import heapq
import time

import simpy

# Kept equal to rlhfsim.sim.engines.continuous.ContinuousEngine.WATERMARK (vLLM's default).
WATERMARK = 0.01


class PeriterPeer:
    """Continuous-batching generation of one step, one SimPy event per iteration per replica. Build it
    from an rlhfsim ``Setup`` and ``CostModel``; ``run(lengths)`` returns the generation span in seconds."""

    def __init__(self, setup, cost):
        g = setup.scenario.generation
        self.cost = cost
        self.model, self.dtype = setup.shapes["actor"], setup.dtypes["actor"]
        self.tp = setup.tp["rollout"]
        self.rt = g.resolved_runtime
        self.max_batch = g.max_batch
        self.n_rep = setup.replicas
        self.cap = max(setup.kv_capacity_tokens, 1)
        self.limit = self.cap - int(WATERMARK * self.cap)
        self.overhead = g.step_overhead_s
        self.iterations = 0
        # decode step of b rows holding kv cached tokens: max(c0[b] + ck kv, u0[b] + uk kv) + over[b]
        self.c0, self.u0, self.over = [0.0], [0.0], [0.0]
        ck = uk = 0.0
        for b in range(1, self.max_batch + 1):
            c0, cs, u0, us, over = cost.decoder(self.model, self.dtype, self.tp, runtime=self.rt).coeffs(
                b, 0.0, self.overhead)
            self.c0.append(c0)
            self.u0.append(u0)
            self.over.append(over)
            ck, uk = cs / b, us / b  # per cached token; the same for every b
        self.ck, self.uk = ck, uk
        self._prefill: dict[int, float] = {}

    def prefill_s(self, tokens: int) -> float:
        t = self._prefill.get(tokens)
        if t is None:
            t = self._prefill[tokens] = self.cost.forward(
                self.model, self.dtype, tokens, 1, self.tp, op="prefill", head="lm", gen_runtime=self.rt).total_s
        return t

    def run(self, lengths: list[tuple[int, int]]) -> float:
        env = simpy.Environment()
        self.iterations = 0
        procs = [env.process(self.replica(env, lengths[i::self.n_rep])) for i in range(self.n_rep)]
        env.run(simpy.AllOf(env, procs))
        return env.now

    def replica(self, env, rows: list[tuple[int, int]]):
        """One engine: per iteration, admit into free slots (one prefill event), or preempt, or decode one
        step of the whole batch (one event)."""
        # A row: [prompt_len, response_len, generated]; waiting rows in `queue` (index `head`, preempted rows
        # pushed back in front through `front`).
        queue = [[p, r, 0] for p, r in rows]
        head = 0
        front: list = []
        live: dict[int, list] = {}  # id -> row, in admission order
        ends: list = []  # heap of (iteration the row ends at, id)
        it = 0  # decode iterations done
        kv = 0  # cached tokens of the live rows
        limit, cap, max_batch = self.limit, self.cap, self.max_batch
        c0s, u0s, overs, ck, uk = self.c0, self.u0, self.over, self.ck, self.uk
        start_of: dict[int, int] = {}  # id -> decode iteration at which its generated count was taken
        next_id = 0
        while True:
            # Admission (watermark; one token of room per live row).
            admitted = []
            room = kv + len(live)
            while (front or head < len(queue)) and len(live) + len(admitted) < max_batch:
                row = front[-1] if front else queue[head]
                need = row[0] + row[2] + 1
                if (live or admitted) and room + need > limit:
                    break
                if front:
                    front.pop()
                else:
                    head += 1
                admitted.append(row)
                room += need
            if not live and not admitted:
                return
            if admitted:
                t = 0.0
                for row in admitted:
                    t += self.prefill_s(row[0] + row[2])
                self.iterations += 1
                yield env.timeout(t)
                for row in admitted:
                    if row[2] == 0:
                        row[2] = 1  # the first token comes from the prefill's logits
                    if row[2] >= row[1]:
                        continue  # done on its first token
                    rid = next_id
                    next_id += 1
                    live[rid] = row
                    start_of[rid] = it
                    kv += row[0] + row[2]
                    heapq.heappush(ends, (it + row[1] - row[2], rid))
                if not live:
                    continue
            n = len(live)
            if kv + n > cap and n > 1:
                # Recompute preemption: the newest row gives up its cache and goes back to the front.
                rid = next(reversed(live))
                row = live.pop(rid)
                row[2] += it - start_of.pop(rid)
                kv -= row[0] + row[2]
                front.append(row)
                continue
            c = c0s[n] + ck * kv
            u = u0s[n] + uk * kv
            self.iterations += 1
            yield env.timeout((c if c > u else u) + overs[n])
            it += 1
            kv += n
            while ends and ends[0][0] <= it:
                _, rid = heapq.heappop(ends)
                row = live.pop(rid, None)
                if row is None:
                    continue  # preempted earlier; its readmission pushed a new entry
                row[2] += it - start_of.pop(rid)
                kv -= row[0] + row[2]


def main() -> None:
    from speed_workload import workload

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=1024)
    a = ap.parse_args()
    setup, cost, lengths = workload(a.rollouts)
    peer = PeriterPeer(setup, cost)
    t0 = time.process_time()
    span = peer.run(lengths)
    cpu = time.process_time() - t0
    print(f"periter_peer: {a.rollouts} rollouts, generation span {span:.3f} s, {peer.iterations} iterations, "
          f"{cpu * 1e3:.0f} CPU-ms ({cpu / peer.iterations * 1e6:.2f} us per iteration)")


if __name__ == "__main__":
    main()
