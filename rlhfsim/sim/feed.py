"""The generation pool of an asynchronous run fed by prompt groups (``schedule.generator: groups``), as NeMo RL's
``AsyncTrajectoryCollector`` (nemo_rl/algorithms/async_utils.py) runs it:

* one thread per prompt group (the group's ``group_size`` samples in one request to one vLLM engine, the engines
  taken in turn); at most ``prompts_per_step x max_trajectory_age_steps`` groups in flight (a semaphore), so a
  group starts as soon as another group's last sample has ended;
* each batch of ``prompts_per_step`` prompts is reserved for one training step (its *target*) and its groups start
  in order; a group for step t starts only once the weights of version t - max_age are in the engine (the
  collector's ``_calculate_target_weights``: weight version v generates for steps v+1 .. v+max_age, version 0 for
  0 .. max_age), i.e. once training has finished step t - 1 - max_age and its weights have been sent;
* the trainer takes exactly the groups reserved for its step (``ReplayBuffer.sample``), waiting until the last has
  ended;
* during a weight update no group starts (``prepare_for_refit``); with in-flight updates the groups running go on
  (their decode pauses while the engine loads the weights), without, the update waits until none is in flight.

So the next batch fills the tail of the last, and with max_age k up to k batches generate at once: the engine's
batch is up to k times one step's rows, where its decode makes the most tokens a second.

``GroupFeed`` is the collector and the buffer; the continuous engine (``rlhfsim.sim.engines.continuous``) runs one
open request over it (``GenRequest.feed``): its replicas take rows from ``queues`` as they arrive, report each
finished row (``finished``), wait when they run dry (``idle``) and are woken (or their decode segment cut, losing
the step in progress) when rows arrive (``notify``). Groups are placed on the replica with the fewest groups in
flight (the one whose group just ended first), so each replica keeps its share of the semaphore; NeMo RL deals
groups round-robin, the same share on average.

The collector goes on past the run's last step, as the real run goes on past the steps it reports, so the last
steps do not see an engine emptier than in steady state.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import simpy

if TYPE_CHECKING:  # for the annotations only
    from rlhfsim.sim.engines.clock import Clock
    from rlhfsim.sim.engines.continuous import ContinuousEngine


class GroupFeed:
    """The group collector of one simulated run (module docstring)."""

    def __init__(self, sim, steps: int, max_age: int):
        s = sim.setup
        self.env: simpy.Environment = sim.env
        self.sim = sim
        self.group = s.scenario.algorithm.group_size
        self.prompts = s.scenario.workload.prompts_per_step
        self.steps = steps
        self.max_age = max_age
        self.cap = self.prompts * max_age          # the collector's semaphore, in groups
        self.queues = [deque() for _ in range(s.replicas)]
        self.in_flight = [0] * s.replicas          # groups per replica
        self.version = 0                           # weight versions the engine has had (updates done)
        self.paused = False                        # a weight update is in progress: no group starts
        self.closed = False
        self.hold_until = 0.0                      # decode paused until then (an in-flight weight update)
        self.next_target, self.next_index = 0, 0  # the next group to start: its step and its place in the batch
        self.left: dict[int, list] = {}            # group -> [rows still running, target step, replica]
        self.rows: dict[int, list] = {}            # target step -> its finished rows
        self.started: dict[int, list[int]] = {}    # target step -> the weight version each of its groups began with
        self.ready: dict[int, simpy.Event] = {}    # target step -> its batch has ended
        self.clocks: dict[int, Clock] = {}         # replica -> its clock (set by the engine)
        self.engine: ContinuousEngine | None = None  # the engine running the open request (set by it)
        self.waiting: dict[int, simpy.Event] = {}  # replica -> the event it waits on, run dry
        self.kicked: set[int] = set()              # replicas given rows while neither idle nor decoding
        self.drained: simpy.Event | None = None    # no group in flight (a weight update without in-flight updates)

    # -- the collector ---------------------------------------------------------------------------------
    def batch(self, step: int) -> simpy.Event:
        """Event: step ``step``'s batch has ended; its value is (rows, the weight versions its groups began with)."""
        if step not in self.ready:
            self.ready[step] = self.env.event()
        return self.ready[step]

    def current_step(self) -> int:
        """The oldest step whose batch has not ended (what the engine's busy time is recorded under)."""
        t = min((v[1] for v in self.left.values()), default=self.next_target)
        return min(t, self.steps - 1)

    def start(self, prefer: int | None = None) -> None:
        """Start every group allowed now: the semaphore has room, no weight update runs, and the next group's step is
        at most ``version + max_age`` ahead. Each goes to the replica with the fewest groups in flight (``prefer``
        on a tie: where a slot just freed)."""
        while (not self.closed and not self.paused and sum(self.in_flight) < self.cap
               and self.next_target <= self.version + self.max_age):
            t = self.next_target
            least = min(self.in_flight)
            rep = prefer if prefer is not None and self.in_flight[prefer] == least else self.in_flight.index(least)
            rows = self.sim.stream.take(self.group, t)
            self.left[rows[0].id // self.group] = [len(rows), t, rep]
            self.started.setdefault(t, []).append(self.version)
            self.in_flight[rep] += 1
            self.queues[rep].extend(rows)
            self.notify(rep)
            self.next_index += 1
            if self.next_index == self.prompts:
                self.next_target, self.next_index = t + 1, 0
            prefer = None

    def finished(self, rep: int, r) -> None:
        """Replica ``rep``'s row ``r`` has ended: when its group has, the slot is freed (and refilled), the rows go to
        the group's step, and a batch complete is handed to the trainer."""
        gid = r.id // self.group
        entry = self.left[gid]
        entry[0] -= 1
        t = entry[1]
        self.rows.setdefault(t, []).append(r)
        if entry[0]:
            return
        del self.left[gid]
        self.in_flight[entry[2]] -= 1
        if len(self.rows[t]) == self.prompts * self.group:
            if self.engine is not None:
                self.engine.split(t)
            self.batch(t).succeed((self.rows.pop(t), self.started.pop(t)))
        if self.drained is not None and not self.left:
            self.drained.succeed()
            self.drained = None
        self.start(prefer=entry[2])

    # -- weight updates (the trainer's side) -----------------------------------------------------------
    def pause(self) -> None:
        """A weight update begins: no group starts until ``updated``."""
        self.paused = True

    def wait_drained(self) -> simpy.Event:
        """Event: no group in flight (succeeds at once when none is)."""
        ev = self.env.event()
        if not self.left:
            ev.succeed()
        else:
            self.drained = ev
        return ev

    def hold(self, seconds: float) -> None:
        """Decode pauses on every replica for ``seconds`` from now (the engine loads new weights)."""
        self.hold_until = self.env.now + seconds
        for rep in range(len(self.queues)):
            self._cut(rep)

    def updated(self) -> None:
        """The update has ended: one weight version more, groups start again."""
        self.version += 1
        self.paused = False
        self.start()

    def close(self) -> None:
        """No more groups: idle replicas end."""
        self.closed = True
        for rep in list(self.waiting):
            self.notify(rep)

    # -- the engine's side -----------------------------------------------------------------------------
    def idle(self, rep: int) -> simpy.Event:
        """Event: replica ``rep``, run dry, has rows again (or the feed closed)."""
        ev = self.waiting[rep] = self.env.event()
        return ev

    def notify(self, rep: int) -> None:
        """Rows were put in replica ``rep``'s queue (or the feed closed): wake it if it waits, cut its decode segment
        if it decodes (so that it admits them at once, as vLLM's next step would), else let it look before its next
        segment (``take_kick``)."""
        ev = self.waiting.pop(rep, None)
        if ev is not None:
            ev.succeed()
            return
        if not self._cut(rep):
            self.kicked.add(rep)

    def take_kick(self, rep: int) -> bool:
        """True once after rows reached replica ``rep`` while it was neither idle nor decoding."""
        if rep in self.kicked:
            self.kicked.discard(rep)
            return True
        return False

    def _cut(self, rep: int) -> bool:
        """Interrupt replica ``rep``'s decode segment if one runs (the whole steps done are kept); True if it did."""
        clock = self.clocks.get(rep)
        proc = clock.proc if clock is not None else None
        if proc is None or proc is self.env.active_process or not proc.is_alive:
            return False
        clock.proc = None   # one interrupt per segment: a second would reach the replica in its next prefill
        proc.interrupt("admit")
        return True
