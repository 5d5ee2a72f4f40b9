"""Per-rank profiles of a window of optimizer steps (`profile_dir`, `profile_steps: START:END`), and their merge.

Steps are counted from 0 as `session.global_step` counts them (a resumed run goes on counting): the profiler
starts before step START's first backward (or `train_step`) and stops when step END-1 has stepped, or at
`session.close()` if the run ends first. Each rank writes its own trace, the rank in its name, with its
framework's profiler (adapters/<framework>/profile.py):

    torch       PROFILE_DIR/trace-rank{R}.json    torch.profiler, CPU activities (+ CUDA on a GPU), Chrome/Perfetto
    mxnet       PROFILE_DIR/trace-rank{R}.json    mx.profiler, Chrome/Perfetto
    tensorflow  PROFILE_DIR/rank{R}/plugins/profile/<run>/*.xplane.pb    TensorFlow's profiler, for TensorBoard's
                profile plugin (`tensorboard --logdir PROFILE_DIR/rank{R}`)

`merge(folder)` (`toolkit profile merge DIR`) joins the Chrome traces into one timeline: each rank's processes
renamed "rank R ..." and kept apart, the time stamps as each rank's clock wrote them (one host: one clock).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from toolkit.config.rules import profile_window
from toolkit.errors import ToolkitError

TRACE = "trace-rank{rank}.json"
MERGED = "trace-merged.json"


class NoProfile:
    """profile_dir unset: nothing to do at a step."""
    def before_step(self) -> None:
        pass

    def after_step(self) -> None:
        pass

    def close(self) -> None:
        pass


class StepProfile(NoProfile):
    """The window's profiler: `before_step` at a step's first backward or train_step, `after_step` once it has
    stepped, `close` at the session's end. `start(folder)` is the framework's: it starts its profiler and
    returns the function that stops it and writes the trace."""

    def __init__(self, session, start):
        self.session, self._start = session, start
        self.first, self.end = profile_window(session.config.profile_steps)
        self.folder = Path(session.config.profile_dir)
        self.stop = None
        self.done = False

    def before_step(self) -> None:
        if self.stop is None and not self.done and self.first <= self.session.global_step < self.end:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.stop = self._start(self.folder)

    def after_step(self) -> None:
        if self.stop is not None and self.session.global_step >= self.end:
            self.close()

    def close(self) -> None:
        self.done = True            # the window is over: nothing starts after this
        if self.stop is not None:
            stop, self.stop = self.stop, None
            stop()


def traces(folder: Path) -> dict[int, Path]:
    """{rank: its Chrome trace} in `folder`."""
    found = {}
    for p in Path(folder).glob("trace-rank*.json"):
        m = re.fullmatch(r"trace-rank(\d+)\.json", p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def merge(folder: str | Path, out: str | Path | None = None) -> Path:
    """Every rank's Chrome trace in `folder` as one: rank R's processes get new ids (R * 1000 + their order),
    named "rank R" (with the framework's own process name after it), sorted by rank."""
    folder = Path(folder)
    found = traces(folder)
    if not found:
        tf = sorted(folder.glob("rank*/plugins/profile"))
        hint = (f"; {folder} holds TensorFlow profiles, which TensorBoard's profile plugin reads per rank "
                f"(tensorboard --logdir {tf[0].parent.parent})" if tf else "")
        raise ToolkitError(f"profile merge: no trace-rank*.json in {folder}{hint}")
    events = []
    for rank, path in found.items():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ToolkitError(f"profile merge: {path} is not a Chrome trace ({e.__class__.__name__}); "
                               "move it out of the folder") from None
        rank_events = data["traceEvents"] if isinstance(data, dict) else data
        names = {ev["pid"]: ev.get("args", {}).get("name") for ev in rank_events
                 if ev.get("ph") == "M" and ev.get("name") == "process_name"}
        pids: dict = {}
        for ev in rank_events:
            if "pid" not in ev:
                continue
            if ev.get("ph") == "M" and ev.get("name") in ("process_name", "process_sort_index"):
                continue        # named again below, per rank
            new = pids.setdefault(ev["pid"], rank * 1000 + len(pids))
            events.append({**ev, "pid": new})
        for old, new in pids.items():
            own = names.get(old)
            events.append({"name": "process_name", "ph": "M", "pid": new,
                           "args": {"name": f"rank {rank}" + (f" ({own})" if own else f" ({old})")}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": new, "args": {"sort_index": new}})
    target = Path(out) if out else folder / MERGED
    target.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return target
