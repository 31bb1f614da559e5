"""CPU threads for one llama-server child on a machine that is not idle: decode threads (-t) and batch
threads (-tb), from the host's cores, how many children share them and where the layers run. Pure.

Why a rule is needed at all: ggml's worker threads meet at a barrier after every op. In decode an op
lasts microseconds, so when one worker is descheduled (the agent's own tests or build, another
llama-server, the kernel's autogroup handing another session half the CPU) every step waits a whole
scheduler slice for it. Measured on the 2-core machine this project is built on (embedded Gemma 3 270M,
128 tokens, decode tok/s, alone / beside one busy process in another session):

    -t 2 (all cores, llama.cpp's default)   56.8 / 0.5-0.9
    -t 2 --poll 0                           55.9 / 0.5
    -t 1 -tb 2                              28.1 / 29.3

and two llama-servers decoding at once at -t 2 ran at 1.7 and 3.3 tok/s. Giving up one core of decode
on an idle machine (half the speed on 2 cores, far less on 16, where decode is bound by memory
bandwidth well before the last core) buys a decode that does not collapse when the machine is busy.

Prompt processing suffers the same way, less steeply. Measured on the same machine (`bostudio bench
--workload agent --spec off --threads 1/2,1/1 --load 1 --prefix-tokens 3000 --session-turns 3`, 5,102
prompt tokens, prefill seconds, alone / beside one busy process):

    -t 1 -tb 2                              7.4 / 44.2  (6.0x slower beside the load)
    -t 1 -tb 1                             13.3 / 13.4  (1.8x slower alone, unchanged beside it)

So -tb all cores pays 6x whenever anything else runs, against 1.8x given up when nothing does: it is
the better bet only if the machine is idle during more than 5 of every 6 prompts, and an agent's tools,
a second child or the user's build make that rare. On 16 cores the headroom costs prefill at most a
quarter of its idle speed.

The rule (holds from 1 core to many):
- headroom: one core in four, at least one (none on a 1-core machine), is left to the agent's work;
- decode threads (-t) and batch threads (-tb): the other cores, split between the children that may
  compute at once, at least 1 each;
- every layer offloaded to a GPU: the CPU only feeds the device (sampling, the graph's host part), so a
  few threads do (GPU_FEED_THREADS) and the cores stay free.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_FEED_THREADS = 2  # every layer on a GPU: host threads only feed the device
HEADROOM_SHARE = 4  # one core in HEADROOM_SHARE is left for the agent's own work (at least one)


def headroom_cores(cores: int) -> int:
    """Cores left to the agent's own work: one in four, at least one, none on a 1-core machine."""
    return 0 if cores <= 1 else max(1, cores // HEADROOM_SHARE)


@dataclass(frozen=True)
class ThreadPlan:
    """-t and -tb for one child, and why."""

    threads: int  # -t: decode (and the draft's, llama.cpp's -td default)
    threads_batch: int  # -tb: prompt processing
    cores: int
    children: int
    why: str

    def to_json(self) -> dict:
        return {"threads": self.threads, "threads_batch": self.threads_batch, "cores": self.cores,
                "children": self.children, "headroom": headroom_cores(self.cores), "why": self.why}


def plan_threads(cores: int | None, children: int = 1, cpu_compute: bool = True) -> ThreadPlan | None:
    """The threads of one child on a host with `cores` cores (None: unknown, then no flags and
    llama.cpp's own default), `children` llama-servers sharing them, `cpu_compute` False when every
    layer (and any draft) runs on a GPU."""
    if cores is None or cores < 1:
        return None
    children = max(1, children)
    shared = f" shared by {children} children" if children > 1 else ""
    if not cpu_compute:
        t = max(1, min(GPU_FEED_THREADS, cores // children))
        return ThreadPlan(t, t, cores, children,
                          f"every layer runs on the GPU: {t} host thread(s) feed it, the other cores stay free")
    room = headroom_cores(cores)
    t = max(1, (cores - room) // children)
    why = (f"{cores} core(s){shared}: decode and prompt processing on {t} thread(s), leaving {room} core(s) "
           f"for the agent's own work (a thread that waits for a busy core stalls every step: decode fell "
           f"100x, prefill 6x beside one busy process when every core was used)")
    if room == 0 and children == 1:
        why = "1 core: decode and prompt processing on it"
    return ThreadPlan(t, t, cores, children, why)


__all__ = ["ThreadPlan", "plan_threads", "headroom_cores", "GPU_FEED_THREADS", "HEADROOM_SHARE"]
